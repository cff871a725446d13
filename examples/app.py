"""An example FastAPI app that enqueues jobs two ways.

    pip install 'shardq[dispatcher]' fastapi uvicorn
    dispatcher run                                    # embedded Redis and SQLite, 127.0.0.1:7070
    python examples/worker.py
    uvicorn examples.app:app --port 8000              # from the repository's root
    curl -X POST localhost:8000/signup -H 'content-type: application/json' -d '{"email": "a@example.com"}'

- ``POST /signup`` enqueues with the plain client (``AsyncClient``): the job is committed by the
  dispatcher when the call returns. Works against any dispatcher.
- ``POST /orders`` inserts the order and enqueues its confirmation in one transaction of the app's
  own PostgreSQL database (``enqueue_in_transaction_async``): both commit or neither does, so a
  confirmation never goes out for an order that was rolled back (``"fail": true`` in the request
  simulates an error after the enqueue). It needs ``DATABASE_URL`` set to the PostgreSQL database
  the dispatcher uses (its ``SHARDQ_DB_URL``); without it the endpoint answers 503.
- ``GET /jobs/{id}`` reads a job's status.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

from worker_sdk import AsyncClient, NotFoundError, enqueue_in_transaction_async

TARGET = os.environ.get("SHARDQ_TARGET", "127.0.0.1:7070")
DATABASE_URL = os.environ.get("DATABASE_URL", "")


class Signup(BaseModel):
    email: str


class Order(BaseModel):
    email: str
    item: str
    fail: bool = False  # raise after the enqueue: the transaction, job included, rolls back


class SimulatedFailure(Exception):
    pass


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    app.state.client = AsyncClient(TARGET)
    app.state.pool = None
    if DATABASE_URL.startswith(("postgresql://", "postgres://")):
        from psycopg_pool import AsyncConnectionPool

        app.state.pool = AsyncConnectionPool(DATABASE_URL, min_size=1, max_size=4, open=False)
        await app.state.pool.open(wait=True)
        async with app.state.pool.connection() as conn:
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS example_orders (id bigserial PRIMARY KEY, email text NOT NULL, "
                "item text NOT NULL, confirmation_job text NOT NULL)"
            )
    try:
        yield
    finally:
        if app.state.pool is not None:
            await app.state.pool.close()
        await app.state.client.close()


app = FastAPI(title="shardq example", lifespan=lifespan)


@app.post("/signup")
async def signup(body: Signup) -> dict[str, str]:
    job_id = await app.state.client.enqueue(
        "email.welcome", {"email": body.email}, idempotency_key=body.email
    )
    return {"job_id": job_id}


@app.post("/orders")
async def create_order(body: Order) -> dict[str, Any]:
    if app.state.pool is None:
        raise HTTPException(503, "set DATABASE_URL to the dispatcher's PostgreSQL database (SHARDQ_DB_URL)")
    try:
        async with app.state.pool.connection() as conn, conn.transaction():
            cursor = await conn.execute(
                "INSERT INTO example_orders (email, item, confirmation_job) VALUES (%s, %s, '') RETURNING id",
                (body.email, body.item),
            )
            (order_id,) = await cursor.fetchone()
            job_id = await enqueue_in_transaction_async(
                conn, "order.confirm", {"order_id": order_id, "email": body.email}
            )
            await conn.execute(
                "UPDATE example_orders SET confirmation_job = %s WHERE id = %s", (job_id, order_id)
            )
            if body.fail:
                raise SimulatedFailure(f"order {order_id} failed after its job was enqueued")
    except SimulatedFailure as exc:
        raise HTTPException(500, f"{exc}: rolled back, job {job_id} will never run") from None
    return {"order_id": order_id, "job_id": job_id}


@app.get("/jobs/{job_id}")
async def job_status(job_id: str) -> dict[str, Any]:
    try:
        job = await app.state.client.get_job(job_id)
    except NotFoundError:
        raise HTTPException(404, f"no job {job_id}") from None
    return {"id": job.id, "type": job.type, "status": job.status, "attempts": job.attempts}

"""An example worker: the handlers for the jobs the example app enqueues.

    python examples/worker.py            # against SHARDQ_TARGET, default 127.0.0.1:7070

It serves until SIGTERM or Ctrl-C. Each handler prints one line when it has done its work (the
examples' tests wait for these lines), and must be idempotent: a job runs at least once.
"""

from __future__ import annotations

import asyncio

from worker_sdk import JobContext, Retry, serve


async def send_welcome_email(ctx: JobContext) -> None:
    """``email.welcome``, enqueued by the app's POST /signup with the plain client."""
    user = ctx.json()
    await asyncio.sleep(0.01)  # stands for the mail server's round trip
    print(f"welcome email sent to {user['email']} (job {ctx.id})", flush=True)


async def confirm_order(ctx: JobContext) -> dict[str, object]:
    """``order.confirm``, enqueued by POST /orders in the transaction that inserts the order: it
    runs only for an order that was committed."""
    order = ctx.json()
    if order.get("flaky") and ctx.attempt == 1:
        raise Retry(delay=0.1, message="the payment gateway timed out")  # runs again, attempt 2
    print(f"order {order['order_id']} confirmed for {order['email']} (attempt {ctx.attempt})", flush=True)
    return {"confirmed": order["order_id"]}  # stored as the job's result


HANDLERS = {"email.welcome": send_welcome_email, "order.confirm": confirm_order}

if __name__ == "__main__":
    serve(HANDLERS, concurrency=32, job_timeout=60)

"""WorkerService.Connect: the bidirectional stream between one worker and this dispatcher."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any

import grpc
import structlog

from shardq_common.clock import steady_ms, wall_ms
from shardq_common.errors import DispatcherError, InvalidArgument, Unavailable
from shardq_common.pb import shardq_pb2 as pb
from shardq_common.pb import shardq_pb2_grpc as pb_grpc

from .. import PROTOCOL_VERSION
from ..ops import metrics
from ..ops.redis_errors import REDIS_ERRORS
from ..ops.redis_faults import note_redis_error
from ..queue import attempts, validation
from ..queue.lease_returns import LeaseReturns
from ..queue.sessions import RESULTS_GRACE_S, SessionContext, WorkerSession
from ..queue.states import ExtendCode
from ..queue.status_writer import transition_update
from ..queue.transition_sink import TransitionSink
from ..queue.working_set import NackSpec
from . import auth

log = structlog.get_logger("shardq.worker_service")
HELLO_TIMEOUT_S = 10.0
MAX_CONCURRENCY = 10_000
MAX_WORKER_ID = 200
PUMP_STOP_TIMEOUT_S = 5.0  # a lease round in flight when the stream ends gets this long to finish
MAX_ERROR_CHARS = 16_000


class WorkerService(pb_grpc.WorkerServiceServicer):
    def __init__(
        self,
        member_id: str,
        context: SessionContext,
        transitions: TransitionSink,
        returns: LeaseReturns,
    ) -> None:
        self.member_id = member_id  # told to the worker in its welcome
        self.context = context  # what each stream's session leases with
        self.settings = context.settings
        self.registry = context.registry
        self.working_set = context.working_set
        self.writer = context.writer
        self.transitions = transitions
        self.returns = returns
        self._closing: set[asyncio.Future[None]] = set()  # clean-ups of ended streams, until they end

    async def Connect(
        self, request_iterator: AsyncIterator[pb.WorkerMessage], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.DispatcherMessage]:
        if self.registry.stopping:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "dispatcher is shutting down")
        requests = request_iterator.__aiter__()
        try:
            async with asyncio.timeout(HELLO_TIMEOUT_S):
                first = await requests.__anext__()
        except (StopAsyncIteration, TimeoutError):
            return
        try:
            session = await self._open(first, context.peer())
        except DispatcherError as exc:
            await context.abort(exc.code, str(exc))
        except REDIS_ERRORS as exc:  # reclaiming the held leases failed: the worker tries again
            note_redis_error("worker_stream", exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"redis unavailable: {exc}")
        reader = asyncio.create_task(self._read(session, requests), name=f"read-{session.worker_id}")
        pump = asyncio.create_task(session.pump(), name=f"pump-{session.worker_id}")
        try:
            while True:
                message = await session.next_message()
                if message is None:
                    break
                yield message
            if session.error is not None:
                await context.abort(session.error.code, str(session.error))
            await asyncio.wait([reader], timeout=RESULTS_GRACE_S)
        finally:
            # When the worker vanishes the RPC task is cancelled, possibly more than once: run the
            # clean-up (which releases its leases after the grace) in a task of its own.
            cleanup = asyncio.ensure_future(self._close(session, reader, pump))
            self._closing.add(cleanup)
            cleanup.add_done_callback(self._closing.discard)
            await asyncio.shield(cleanup)

    async def _close(
        self, session: WorkerSession, reader: asyncio.Task[None], pump: asyncio.Task[None]
    ) -> None:
        # The pump is not cancelled but told to stop: cancelled mid-lease it would strand the leases
        # Redis just granted (full TTL, nobody holding them). Closed, it releases them itself.
        session.close()
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        _, pending = await asyncio.wait([pump], timeout=PUMP_STOP_TIMEOUT_S)
        if pending:
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
        await self.returns.close_session(session)

    async def _open(self, first: pb.WorkerMessage, peer: str) -> WorkerSession:
        if first.WhichOneof("msg") != "hello":
            raise InvalidArgument("the first message on a worker stream must be hello")
        hello = first.hello
        if not hello.worker_id or len(hello.worker_id) > MAX_WORKER_ID:
            raise InvalidArgument(f"hello.worker_id: must be 1..{MAX_WORKER_ID} characters")
        if not hello.job_types:
            raise InvalidArgument("hello.job_types: a worker must declare at least one job type")
        validation.at_most(len(hello.job_types), self.settings.max_worker_types, "hello.job_types", "types")
        types = sorted({validation.job_type(t, "hello.job_types[]") for t in hello.job_types})
        auth.check_types(types, "hello.job_types")
        if not 1 <= hello.concurrency <= MAX_CONCURRENCY:
            raise InvalidArgument(f"hello.concurrency: must be in 1..{MAX_CONCURRENCY}")
        validation.at_most(len(hello.held), self.settings.max_lease_refs, "hello.held", "leases")
        refs = [
            validation.lease_ref(r, f"hello.held[{i}]", self.settings.shard_count)
            for i, r in enumerate(hello.held)
        ]
        session = WorkerSession(self.context, hello.worker_id, types, hello.concurrency, peer)
        self.registry.add(session)
        session.send(
            pb.DispatcherMessage(
                welcome=pb.Welcome(
                    dispatcher_id=self.member_id,
                    protocol=PROTOCOL_VERSION,
                    heartbeat_interval_ms=max(100, self.settings.lease_ttl_ms // 3),
                )
            )
        )
        if refs:
            try:
                await self._extend(session, refs, reclaim=True)
            except BaseException:
                session.close()
                self.registry.remove(session)
                raise
        session.log.info(
            "worker connected", types=types, concurrency=hello.concurrency, reclaimed=len(session.held)
        )
        return session

    async def _read(self, session: WorkerSession, requests: AsyncIterator[pb.WorkerMessage]) -> None:
        shards, most = self.settings.shard_count, self.settings.max_lease_refs
        try:
            # Read to the end even once the session is closed: acks and nacks still in flight are
            # applied (tokens decide, not the shard's owner); leases are no longer handed out.
            async for message in requests:
                session.last_seen_ms = wall_ms()
                await session.room()
                kind = message.WhichOneof("msg")
                if kind == "credit":
                    session.add_credit(message.credit.slots)
                elif kind == "heartbeat":
                    validation.at_most(len(message.heartbeat.leases), most, "heartbeat.leases", "leases")
                    refs = [
                        validation.lease_ref(r, f"heartbeat.leases[{i}]", shards)
                        for i, r in enumerate(message.heartbeat.leases)
                    ]
                    await self._extend(session, refs, reclaim=False)
                elif kind == "acks":
                    validation.at_most(len(message.acks.acks), most, "acks", "acks")
                    await self._ack(session, message.acks)
                elif kind == "nacks":
                    validation.at_most(len(message.nacks.nacks), most, "nacks", "nacks")
                    await self._nack(session, message.nacks)
                elif kind == "progress":
                    validation.at_most(len(message.progress.reports), most, "progress.reports", "reports")
                    self._progress(session, message.progress)
                elif kind == "drain":
                    session.draining = True
                    session.log.info("worker draining")
                    await self.returns.return_unsent(session, session.withdraw_all())
                elif kind == "hello":
                    raise InvalidArgument("hello: sent twice on one stream")
                else:
                    raise InvalidArgument("empty or unknown worker message")
                if message.then_credit:  # after the results above freed their slots
                    session.add_credit(message.then_credit)
        except DispatcherError as exc:
            session.log.warning("closing worker stream", error=str(exc))
            session.error = exc
        except REDIS_ERRORS as exc:
            # Whatever the error (an outage, or a reply that is no outage), the worker's way on is a
            # new stream, where it reclaims the leases it holds.
            note_redis_error("worker_stream", exc, worker=session.worker_id)
            session.error = Unavailable(f"redis unavailable: {exc}")
        except (asyncio.CancelledError, grpc.aio.AioRpcError):
            pass
        except Exception as exc:
            session.log.exception("closing worker stream: reading it failed")
            session.error = DispatcherError(f"internal error: {type(exc).__name__}")
        session.close()

    async def ListWorkers(
        self, request: pb.ListWorkersRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListWorkersResponse:
        """This process's worker streams; a scoped caller sees the workers of its types, and only
        those types of theirs."""
        workers = []
        for session in sorted(self.registry.sessions, key=lambda s: (s.worker_id, s.stream_id)):
            types = [t for t in session.job_types if auth.may_use(t)]
            if not types:
                continue
            workers.append(
                pb.ConnectedWorker(
                    worker_id=session.worker_id,
                    job_types=types,
                    concurrency=session.concurrency,
                    in_flight=len(session.held),
                    connected_at_ms=session.connected_at_ms,
                    last_seen_ms=session.last_seen_ms,
                    peer=session.peer,
                    draining=session.draining,
                )
            )
        return pb.ListWorkersResponse(dispatcher_id=self.member_id, workers=workers)

    async def _extend(
        self, session: WorkerSession, refs: list[tuple[str, str, int]], *, reclaim: bool
    ) -> None:
        extended, rejected, cancels = [], [], []
        refs = list(dict.fromkeys(refs))  # a lease listed twice is extended (and answered) once
        now = steady_ms()  # a lease deadline
        for shard, group in _by_shard(refs).items():
            results = await self.working_set.extend(
                shard, now, [(i, t) for i, t, _ in group], holder=session.stream_id if reclaim else ""
            )
            for (job_id, token, _), deadline in zip(group, results, strict=True):
                ref = pb.LeaseRef(job_id=job_id, token=token, shard=shard)
                if deadline == ExtendCode.REJECTED:
                    session.forget(job_id)
                    rejected.append(pb.LeaseRejected(ref=ref, reason="lease no longer valid"))
                    continue
                if reclaim:
                    session.hold(job_id, token, shard)
                extended.append(pb.LeaseExtended(ref=ref, deadline_ms=abs(deadline)))
                if deadline < 0:
                    cancels.append(ref)
        if extended:
            session.send(pb.DispatcherMessage(extended=pb.LeasesExtended(leases=extended)))
        if rejected:
            session.send(pb.DispatcherMessage(rejected=pb.LeasesRejected(leases=rejected)))
        for ref in cancels:
            session.send(pb.DispatcherMessage(cancel=pb.Cancel(ref=ref)))

    async def _ack(self, session: WorkerSession, acks: pb.Acks) -> None:
        shards, limit = self.settings.shard_count, self.settings.max_result_bytes
        items = []
        for i, ack in enumerate(acks.acks):
            job_id, token, shard = validation.lease_ref(ack.lease, f"acks[{i}].lease", shards)
            result = ack.result or None
            note = None
            if result is not None and len(result) > limit:
                session.log.warning("ack result over the limit dropped", job=job_id, size=len(result))
                note = f"result not stored: {len(result)} bytes, over SHARDQ_MAX_RESULT_BYTES ({limit})"
                result = None
            items.append((job_id, token, shard, result, note))
        now = wall_ms()
        acked = []
        for shard, group in _by_shard(items).items():
            results = await self.working_set.ack(
                shard, now, [(i, t) for i, t, *_ in group], [r for *_, r, _ in group]
            )
            for (job_id, token, _, result, note), t in zip(group, results, strict=True):
                session.forget(job_id)
                if t is None:
                    session.log.info("stale ack rejected", job=job_id, token=token)
                    session.send(_rejected(job_id, token, shard, "stale token: the lease is no longer valid"))
                    continue
                self.writer.record(shard, transition_update(t, now, result=result, error=note))
                acked.append(t)
                session.log.debug("job acked", job=job_id, type=t.job_type, shard=shard, attempt=t.attempts)
        self.transitions.finished(acked, "ack")

    def _progress(self, session: WorkerSession, reports: pb.ProgressReports) -> None:
        """Handlers' progress: each job's latest goes to its watchers now and to the DB within the
        status writer's progress delay. A report for a lease no stream of this process holds (it
        ended, or its shard moved) is dropped: its job's next report goes where the lease is."""
        shards, limit = self.settings.shard_count, self.settings.max_progress_bytes
        for i, report in enumerate(reports.reports):
            field = f"progress.reports[{i}]"
            job_id, token, _ = validation.lease_ref(report.lease, f"{field}.lease", shards)
            progress = validation.progress_report(report.progress, limit, f"{field}.progress")
            holder = session if job_id in session.held else self.registry.holders.get(job_id)
            if holder is None or holder.held.get(job_id, ("",))[0] != token:
                continue
            metrics.PROGRESS_REPORTS.inc()
            self.writer.record_progress(job_id, progress)

    async def _nack(self, session: WorkerSession, nacks: pb.Nacks) -> None:
        shards = self.settings.shard_count
        items = []
        for i, nack in enumerate(nacks.nacks):
            job_id, token, shard = validation.lease_ref(nack.lease, f"nacks[{i}].lease", shards)
            delay = -1
            if nack.HasField("retry_delay_ms"):
                if not 0 <= nack.retry_delay_ms <= validation.MAX_HORIZON_MS:
                    raise InvalidArgument(f"nacks[{i}].retry_delay_ms: out of range")
                delay = nack.retry_delay_ms
            reason = "no_handler" if nack.no_handler else ("" if nack.retryable else "not_retryable")
            if nack.rate_limited:
                _check_rate_limited(nack, f"nacks[{i}]")
                reason = ""  # not a failure: it goes back whatever its attempts
            elif nack.hold_siblings:
                raise InvalidArgument(f"nacks[{i}].hold_siblings: only with rate_limited")
            items.append(
                (
                    job_id,
                    token,
                    shard,
                    NackSpec(job_id, token, reason, delay, nack.rate_limited, nack.hold_siblings),
                    validation.error_text(nack.error, MAX_ERROR_CHARS),
                )
            )
        now = wall_ms()
        for shard, group in _by_shard(items).items():
            results = await self.working_set.retry(
                shard, now, [g[3] for g in group], self.settings.retry, steady_now=steady_ms()
            )
            for (job_id, token, _, spec, error), t in zip(group, results, strict=True):
                session.forget(job_id)
                if t is None:
                    session.send(_rejected(job_id, token, shard, "stale token: the lease is no longer valid"))
                    continue
                self.writer.record(
                    shard,
                    transition_update(t, now, error=error or "error"),
                    attempt=attempts.nacked(
                        t,
                        now,
                        error or "error",
                        rate_limited=spec.rate_limited,
                        max_traceback=self.settings.max_traceback_chars,
                    ),
                )
                self.transitions.after(t)
                self.transitions.finished([t], "nack")
                if spec.rate_limited:
                    metrics.RATE_LIMITED.labels(metrics.type_label(t.job_type)).inc()
                session.log.info(
                    "job nacked",
                    job=job_id,
                    type=t.job_type,
                    shard=shard,
                    attempt=t.attempts,
                    outcome=str(t.state),
                    dead_reason=t.dead_reason or None,
                )
        session.wake.set()


#: The longest a RateLimited job may be held back (its handler's retry_after).
MAX_RATE_LIMITED_DELAY_MS = 24 * 3600 * 1000


def _check_rate_limited(nack: pb.Nack, field: str) -> None:
    """A RateLimited nack comes back after its delay: one must be given, within a day."""
    if nack.no_handler:
        raise InvalidArgument(f"{field}.rate_limited: not with no_handler")
    if not nack.HasField("retry_delay_ms") or not 0 < nack.retry_delay_ms <= MAX_RATE_LIMITED_DELAY_MS:
        raise InvalidArgument(
            f"{field}.retry_delay_ms: a rate-limited job needs a delay in 1..{MAX_RATE_LIMITED_DELAY_MS} ms"
        )


def _rejected(job_id: str, token: str, shard: int, reason: str) -> pb.DispatcherMessage:
    ref = pb.LeaseRef(job_id=job_id, token=token, shard=shard)
    return pb.DispatcherMessage(rejected=pb.LeasesRejected(leases=[pb.LeaseRejected(ref=ref, reason=reason)]))


def _by_shard(items: list[Any]) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = defaultdict(list)
    for item in items:
        out[item[2]].append(item)
    return out

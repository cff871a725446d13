"""The worker: one bidirectional stream to the dispatcher, handlers run with bounded concurrency."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import inspect
import json
import os
import random
import signal
import socket
import traceback
import uuid
import warnings
from collections.abc import Awaitable, Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import structlog

from shardmap import shard_for
from shardq_common.pb import shardq_pb2 as pb
from shardq_common.pb import shardq_pb2_grpc as pb_grpc
from shardq_common.wakeup import Wakeup

from . import _tracing
from ._client import CHANNEL_OPTIONS, resolve_security, resolve_target
from ._context import DependencyResult, JobContext
from ._convert import PRIORITY_NAMES
from ._errors import RateLimited, Retry, ShardqError, SkipRetry

Handler = Callable[[JobContext], Any] | Callable[[JobContext], Awaitable[Any]]
log = structlog.get_logger("shardq.worker")
MAX_RESULT_BYTES = 64 << 10
#: How often the handlers' latest progress reports are sent (each job's latest, in one message).
PROGRESS_INTERVAL_S = 0.25
MAX_ERROR_CHARS = 16_000
# Results and heartbeats go in messages of at most this many leases and (roughly) bytes, well within
# a dispatcher's limits (SHARDQ_MAX_LEASE_REFS, 10,000; SHARDQ_MAX_REQUEST_BYTES, 64 MiB): one over
# them is refused with INVALID_ARGUMENT or RESOURCE_EXHAUSTED and ends the stream.
MESSAGE_LEASES = 1000
MESSAGE_BYTES = 8 << 20
_M = TypeVar("_M", pb.Ack, pb.Nack, pb.LeaseRef, pb.JobProgress)
# After our half-close, how long the dispatcher gets to read what we wrote and end the stream.
HALF_CLOSE_TIMEOUT_S = 5.0
UNOWNED_REFRESH_S = 0.25
# A dispatcher that answers these will answer them again: stop instead of reconnecting forever.
_REFUSALS = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
)


class _TimedOut(Exception):
    """The handler ran past ``job_timeout``."""


@dataclass
class _Running:
    ref: pb.LeaseRef
    ctx: JobContext
    ttl_ms: int
    link: str  # the address of the dispatcher that leased it
    task: asyncio.Task[None] | None = None
    lost: bool = False  # lease rejected: never ack it
    cancelled_by_dispatcher: bool = False
    # Its task has begun. A task cancelled before its first step never runs its body (no result
    # sent, never dropped from _running), so a stop that comes earlier only sets the flags above.
    started: bool = False
    progress: str = ""  # the handler's latest report (JSON), set from any thread
    progress_due: bool = False  # a report waits for the next progress flush
    done: bool = False  # its outcome is settled: a late report is dropped


@dataclass
class _Link:
    """One stream to one dispatcher, with its share of the worker's concurrency."""

    address: str
    share: int
    granted: int = 0  # credit granted on the current stream, not yet used by leases
    # The concurrency its hello declared on the current stream: the dispatcher holds the stream to
    # it (credit past it is dropped there), so credit is granted up to it even when the share grows.
    declared: int = 0
    protocol: int = 1  # the worker protocol of the dispatcher on the current stream (its Welcome)
    acks: list[pb.Ack] = field(default_factory=list)  # results to write on this link
    nacks: list[pb.Nack] = field(default_factory=list)
    progress: dict[str, pb.JobProgress] = field(default_factory=dict)  # job id -> its latest report
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    connected: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    retired: bool = False
    finish: asyncio.Event | None = None  # set: the current stream writes no more and half-closes

    @property
    def unsent(self) -> int:
        return len(self.acks) + len(self.nacks)


class Worker:
    """Serve handlers until shut down. Await it, use ``async with``, or call ``run()`` to block. A
    worker serves once: awaiting or running it again waits for that one serving to end.

    The worker asks the target for the shard map and keeps one stream to each dispatcher that owns
    shards of its job types, splitting its concurrency between them; when shards move it follows
    them, reclaiming the leases it still holds.

    Args:
        handlers: ``{job_type: callable}``; each is called with a :class:`JobContext`. Async callables run
            on the event loop, plain ones in a thread pool. Return a value to ack (bytes, or anything JSON
            can encode, stored as the job's result); raise to nack: :class:`Retry` for a chosen delay,
            :class:`SkipRetry` to dead-letter at once, :class:`RateLimited` to run again later
            without charging the attempt, any other exception to retry with backoff.
        target: dispatcher address; default ``SHARDQ_TARGET`` or 127.0.0.1:7070.
        concurrency: most jobs running at once (and leases held); plain handlers share a pool of this
            many threads. Size what handlers share to it: a client or database pool smaller than
            the jobs that use it at once fails them (redis-py's asyncio pool raises "Too many
            connections" past its 100), or cap those handlers with ``max_in_flight``.
        max_in_flight: ``{job_type: n}``: most jobs of that type running at once in this worker, for
            a handler bound by something smaller than ``concurrency`` (a pool of n connections). Its
            jobs beyond n wait in the worker for a slot, leases kept alive, their ``job_timeout``
            not yet counting. When every type has a cap, the worker holds no more leases than the
            caps add up to, so none waits; a capped type beside uncapped ones may have up to
            ``concurrency`` leased and waiting, so give such a type a worker of its own when its
            jobs must not wait.
        job_timeout: seconds a handler may run, counted from its start, before the job is nacked as
            timed out (retried while attempts are left) and :attr:`JobContext.cancelled` is set
            (None: no limit). An async handler is cancelled then. A plain handler cannot be stopped
            from outside: it keeps its thread until it returns, and until then the worker counts
            that thread as stuck (:attr:`stuck_threads`) and takes one lease fewer. See
            :class:`JobContext` for how a plain handler stops in time.
        shutdown_grace: seconds in-flight jobs get to finish on shutdown; what is left is nacked (retryable).
        worker_id: stable id for this process, reused across reconnects so leases are reclaimed.
        token, tls, tls_ca, tls_cert, tls_key, tls_server_name: how to reach the dispatchers, as for
            :class:`Client` (defaults from SHARDQ_TOKEN and SHARDQ_TLS*). The same settings are used
            for every dispatcher of the shard map, so with TLS their certificates must name their
            advertised addresses or ``tls_server_name``.

    The worker takes a lease only when a handler thread is free for it, so a job never waits in the
    worker for a thread: when every thread is held by a handler past its timeout, it logs "every
    handler thread is stuck", takes no leases and leaves the jobs ready for other workers, no
    attempt charged, until a handler returns.

    A dispatcher that refuses the worker (a bad hello: INVALID_ARGUMENT; a missing or unknown token:
    UNAUTHENTICATED; job types outside the token's scope: PERMISSION_DENIED) stops it: awaiting it
    or ``run()`` raises that :class:`ShardqError`.
    """

    def __init__(
        self,
        handlers: Mapping[str, Handler],
        *,
        target: str | None = None,
        concurrency: int = 16,
        max_in_flight: Mapping[str, int] | None = None,
        job_timeout: float | None = None,
        shutdown_grace: float = 30.0,
        worker_id: str | None = None,
        max_reconnect_delay: float = 5.0,
        handle_signals: bool = True,
        map_refresh: float = 5.0,
        token: str | None = None,
        tls: bool | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_server_name: str | None = None,
    ) -> None:
        if not handlers:
            raise ValueError("handlers must name at least one job type")
        if not structlog.is_configured():  # the application's own set-up wins
            from shardq_common.logs import configure

            configure(os.environ.get("SHARDQ_LOG_LEVEL", "info"), os.environ.get("SHARDQ_LOG_FORMAT", "auto"))
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.handlers = dict(handlers)
        self._is_async = {name: inspect.iscoroutinefunction(h) for name, h in self.handlers.items()}
        self.target = resolve_target(target)
        self.security = resolve_security(
            token=token, tls=tls, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key,
            tls_server_name=tls_server_name,
        )  # fmt: skip
        self._metadata = self.security.metadata
        #: Why a dispatcher refused this worker, when it did (serve_forever raises it).
        self.refused: ShardqError | None = None
        caps = dict(max_in_flight or {})
        for job_type, cap in caps.items():
            if job_type not in self.handlers:
                raise ValueError(f"max_in_flight names {job_type!r}, which has no handler")
            if cap < 1:
                raise ValueError(f"max_in_flight[{job_type!r}] must be at least 1")
        if caps.keys() == self.handlers.keys():
            concurrency = min(concurrency, sum(caps.values()))
        self._slots = {job_type: asyncio.Semaphore(cap) for job_type, cap in caps.items()}
        self.concurrency = concurrency
        self.job_timeout = job_timeout
        self.shutdown_grace = shutdown_grace
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.max_reconnect_delay = max_reconnect_delay
        self.handle_signals = handle_signals
        self.map_refresh = map_refresh
        self._running: dict[str, _Running] = {}
        self._running_on: collections.Counter[str] = collections.Counter()  # executions per link address
        self._links: dict[str, _Link] = {}
        self._owner_of: dict[int, str] = {}  # shard -> owner address, from the last shard map
        self._unowned = False  # the last map had shards of our types without a live owner
        # The other dispatchers of the last map: asked for the map when the target does not answer,
        # so a worker whose one address went away (a dispatcher stopped for good) finds the rest.
        self._members: list[str] = []
        self._remap = Wakeup()
        self._stopping = asyncio.Event()
        self._stopped = asyncio.Event()
        self._connected = asyncio.Event()
        self._draining = False
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="shardq-handler")
        self._main: asyncio.Task[None] | None = None
        self._heartbeat_ms = 20_000
        self.completed = 0
        #: Handler threads still held by a sync handler the worker gave up on (past ``job_timeout``,
        #: or at shutdown) that has not returned. Each is a slot the worker takes no lease for.
        self.stuck_threads = 0
        self._capped = False  # a link was granted less credit than its share for want of free threads
        self._progress_waiting: list[_Running] = []  # jobs with a report for the next progress flush
        self._progress_flush: asyncio.TimerHandle | None = None
        # Every job's context reports progress through this one callable (set once the loop runs):
        # a job's start makes no closure of its own.
        self._reporter: Callable[[JobContext, str], None] | None = None
        self.log = log.bind(worker=self.worker_id)

    # Set on the worker serve() returns inside an event loop: like a coroutine, it does nothing
    # unless it is awaited, entered or run, so dropping it unrun warns.
    _must_run = False
    _served = False

    def __del__(self) -> None:
        if self._must_run and not self._served:
            warnings.warn(
                f"shardq Worker for {sorted(self.handlers)} was never run: await it, use `async with`, "
                "or call serve() where no event loop is running (it then serves until SIGTERM/SIGINT)",
                RuntimeWarning,
                stacklevel=2,
                source=self,
            )

    # -- public lifecycle ---------------------------------------------------------------------

    def __await__(self) -> Any:
        return self.serve_forever().__await__()

    async def __aenter__(self) -> Worker:
        self._main = asyncio.create_task(self.serve_forever(), name="shardq-worker")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()
        if self._main is not None:
            await self._main

    def run(self) -> None:
        """Block until SIGTERM/SIGINT, then shut down gracefully."""
        if self._stopped.is_set():  # served already (as serve() does outside an event loop)
            if self.refused is not None:
                raise self.refused
            return
        try:
            import uvloop

            uvloop.run(self.serve_forever())
        except ImportError:  # uvloop is optional for a worker (the dispatcher extra installs it)
            asyncio.run(self.serve_forever())

    async def wait_connected(self, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            await self._connected.wait()

    async def shutdown(self, grace: float | None = None) -> None:
        """Stop taking jobs, let in-flight ones finish within the grace, nack the rest. Idempotent."""
        if grace is not None:
            self.shutdown_grace = grace
        self._stopping.set()
        await self._stopped.wait()

    async def serve_forever(self) -> None:
        if self._served:
            await self._stopped.wait()
            if self.refused is not None:
                raise self.refused
            return
        self._served = True
        loop = asyncio.get_running_loop()
        self._reporter = functools.partial(self._report_progress, loop)
        if self.handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                try:
                    loop.add_signal_handler(sig, self._stopping.set)
                except (NotImplementedError, RuntimeError, ValueError):
                    break  # not the main thread
        router = asyncio.create_task(self._route(), name="shardq-router")
        try:
            await self._stopping.wait()
            await self._drain()
        finally:
            router.cancel()
            links = [link.task for link in self._links.values() if link.task is not None]
            for task in links:
                task.cancel()
            await asyncio.gather(router, *links, return_exceptions=True)
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._stopped.set()
            self.log.info("worker stopped", completed=self.completed)
            if self.stuck_threads:
                # Python joins the pool's threads at exit: only the handlers' return ends the process.
                self.log.warning(
                    "abandoned handlers still hold threads; the process exits when they return",
                    stuck_threads=self.stuck_threads,
                )
        if self.refused is not None:
            raise self.refused

    # -- shutdown ------------------------------------------------------------------------------

    async def _drain(self) -> None:
        self._draining = True
        self._wake_all()
        self.log.info("worker draining", running=len(self._running), grace=self.shutdown_grace)
        tasks = [r.task for r in self._running.values() if r.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.shutdown_grace)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        # Give the results a moment to reach the dispatchers.
        try:
            async with asyncio.timeout(5.0):
                while any(link.unsent for link in self._links.values()):
                    self._wake_all()
                    await asyncio.sleep(0.01)
        except TimeoutError:
            self.log.warning(
                "results not delivered before exit", unsent=sum(link.unsent for link in self._links.values())
            )
        # Half-close every stream and let the dispatchers read what was written before they end them.
        closing = []
        for link in self._links.values():
            link.retired = True
            if link.connected.is_set() and link.finish is not None and link.task is not None:
                link.finish.set()
                closing.append(link.task)
        if closing:
            await asyncio.wait(closing, timeout=HALF_CLOSE_TIMEOUT_S)

    def _wake_all(self) -> None:
        for link in self._links.values():
            link.wake.set()

    # -- the shard map: which dispatchers to hold streams to -------------------------------------

    async def _route(self) -> None:
        """Keep one link per dispatcher owning shards of our types; re-read the map periodically,
        when a dispatcher redirects us, and when a link cannot connect."""
        while True:
            self._remap.clear()
            addresses = await self._owner_addresses()
            self._set_links(addresses)
            # Shards of ours between owners (a move, a takeover): look again soon, not at the next refresh.
            refresh = UNOWNED_REFRESH_S if self._unowned else self.map_refresh
            if await self._remap.wait(refresh):
                await asyncio.sleep(0.05)  # let a burst of redirects settle into one re-read

    async def _shard_map(self) -> pb.GetShardMapResponse | None:
        """The map from the target, else from the other dispatchers of the last map (None: nobody)."""
        for address in [self.target, *(a for a in self._members if a != self.target)]:
            try:
                async with self.security.aio_channel(address, options=CHANNEL_OPTIONS) as channel:
                    view: pb.GetShardMapResponse = await pb_grpc.ShardServiceStub(channel).GetShardMap(
                        pb.GetShardMapRequest(), timeout=5, metadata=self._metadata
                    )
                    return view
            except (grpc.aio.AioRpcError, OSError) as exc:
                self.log.debug("shard map unavailable", address=address, error=str(exc))
        return None

    async def _owner_addresses(self) -> list[str]:
        view = await self._shard_map()
        if view is None:
            return list(self._links) or [self.target]
        self._members = [m.address for m in view.members if m.alive and m.address]
        self._owner_of = {s.shard: s.address for s in view.shards if s.address}
        mine = {shard_for(t, view.shard_count) for t in self.handlers} if view.shard_count else set()
        self._unowned = bool(mine - set(self._owner_of))
        addresses = sorted({self._owner_of[s] for s in mine if s in self._owner_of})
        return addresses or list(self._links) or [self.target]

    def _set_links(self, addresses: list[str]) -> None:
        wanted = set(addresses)
        for address in list(self._links):
            if address not in wanted:
                self._retire(self._links.pop(address))
        for address in addresses:
            if address not in self._links:
                link = self._links[address] = _Link(address, share=1)
                link.task = asyncio.create_task(self._link_loop(link), name=f"shardq-link-{address}")
        n = len(self._links)
        for i, link in enumerate(self._links.values()):
            link.share = max(1, self.concurrency // n + (1 if i < self.concurrency % n else 0))
            link.wake.set()

    def _retire(self, link: _Link) -> None:
        """A dispatcher we no longer need: its undelivered results go where their shards are now."""
        link.retired = True
        if link.connected.is_set() and link.finish is not None:
            link.finish.set()  # what it has written is read before its stream ends
        elif link.task is not None:
            link.task.cancel()
        pending_acks, pending_nacks = link.acks, link.nacks
        link.acks, link.nacks = [], []
        for ack in pending_acks:
            self._link_for(ack.lease.shard, link.address).acks.append(ack)
        for nack in pending_nacks:
            self._link_for(nack.lease.shard, link.address).nacks.append(nack)
        self._wake_all()

    def _link_for(self, shard: int, origin: str) -> _Link:
        """Where a lease's heartbeats and result go: its shard's owner, else the link it came from,
        else any link (a dispatcher checks the token, so any can take it)."""
        for address in (self._owner_of.get(shard), origin):
            if address and address in self._links:
                return self._links[address]
        if not self._links:
            self._set_links([self.target])
        return next(iter(self._links.values()))

    # -- one link -------------------------------------------------------------------------------

    async def _link_loop(self, link: _Link) -> None:
        delay = 0.1
        while not link.retired:
            try:
                async with self.security.aio_channel(link.address, options=CHANNEL_OPTIONS) as channel:
                    redirect = await self._session(link, pb_grpc.WorkerServiceStub(channel))
                delay = 0.1
                if redirect is not None:
                    self._remap.set()
                    await asyncio.sleep(0.05)
                    continue
            except grpc.aio.AioRpcError as exc:
                if exc.code() in _REFUSALS:
                    self.log.error(
                        "dispatcher refused this worker", code=exc.code().name, error=exc.details()
                    )
                    self.refused = ShardqError(exc.code(), exc.details() or "refused")
                    self._stopping.set()
                    return
                self.log.warning(
                    "stream to dispatcher failed",
                    target=link.address,
                    code=exc.code().name,
                    error=exc.details(),
                )
                self._remap.set()
            except (OSError, TimeoutError) as exc:
                self.log.warning("cannot reach dispatcher", target=link.address, error=str(exc))
                self._remap.set()
            finally:
                link.connected.clear()
                if not any(x.connected.is_set() for x in self._links.values()):
                    self._connected.clear()
            if link.retired:
                return
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, self.max_reconnect_delay)

    def _held_by(self, link: _Link) -> list[pb.LeaseRef]:
        refs = [
            r.ref
            for r in self._running.values()
            if not r.lost and self._link_for(r.ref.shard, r.link) is link
        ]
        return refs + [a.lease for a in link.acks] + [n.lease for n in link.nacks]

    async def _session(self, link: _Link, stub: pb_grpc.WorkerServiceStub) -> str | None:
        """One stream; returns the redirect target ('' = the same) when the dispatcher sends us on.

        The stream ends with a half-close from our side (after a redirect, or when the worker drains):
        the dispatcher reads up to it, so the results written before it are never lost in flight."""
        call = stub.Connect(metadata=self._metadata)
        held = self._held_by(link)
        declared = link.share
        await call.write(
            pb.WorkerMessage(
                hello=pb.Hello(
                    worker_id=self.worker_id,
                    job_types=sorted(self.handlers),
                    concurrency=declared,
                    held=held,
                )
            )
        )
        link.granted, link.protocol, link.declared = 0, 1, declared
        link.finish = finish = asyncio.Event()
        writers = [
            asyncio.create_task(self._sender(link, call, finish), name="shardq-sender"),
            asyncio.create_task(self._heartbeats(link, call, finish), name="shardq-heartbeat"),
        ]
        closer = asyncio.create_task(self._half_close(link, call, writers), name="shardq-half-close")
        redirect: str | None = None
        try:
            while True:
                if finish.is_set():
                    async with asyncio.timeout(HALF_CLOSE_TIMEOUT_S):
                        message = await call.read()
                else:
                    message = await call.read()
                if message is grpc.aio.EOF:
                    return redirect
                kind = message.WhichOneof("msg")
                if kind == "welcome":
                    self._heartbeat_ms = message.welcome.heartbeat_interval_ms or self._heartbeat_ms
                    link.protocol = message.welcome.protocol
                    link.connected.set()
                    self._connected.set()
                    link.wake.set()
                    self.log.info(
                        "connected",
                        dispatcher=message.welcome.dispatcher_id,
                        address=link.address,
                        reclaiming=len(held),
                    )
                elif kind == "leases":
                    link.granted -= len(message.leases.leases)
                    traced = _tracing.active()  # looked up once a message: it costs about 1 µs
                    for lease in message.leases.leases:
                        self._start(lease, link.address, traced)
                elif kind == "rejected":
                    for rejected in message.rejected.leases:
                        self._lose(rejected.ref.job_id, rejected.reason)
                elif kind == "cancel":
                    self._cancel(message.cancel.ref)
                elif kind == "redirect":
                    self.log.info(
                        "redirected",
                        target=message.redirect.target or "(map)",
                        reason=message.redirect.reason,
                    )
                    redirect = message.redirect.target
                    finish.set()
        except TimeoutError:
            return redirect  # the dispatcher did not end the stream after our half-close
        finally:
            finish.set()
            closer.cancel()
            for task in writers:
                task.cancel()
            await asyncio.gather(closer, *writers, return_exceptions=True)
            call.cancel()
            link.wake.set()  # results left unwritten go out on the next stream

    async def _half_close(self, link: _Link, call: Any, writers: list[asyncio.Task[None]]) -> None:
        """Once told to finish: let the writers end after their current message, then half-close."""
        assert link.finish is not None
        await link.finish.wait()
        link.wake.set()
        await asyncio.wait(writers, timeout=HALF_CLOSE_TIMEOUT_S)
        await call.done_writing()

    async def _sender(self, link: _Link, call: Any, finish: asyncio.Event) -> None:
        drained_sent = False
        while True:
            await link.wake.wait()
            link.wake.clear()
            if finish.is_set():
                return  # what is left goes out on the next stream
            if not link.connected.is_set():
                continue
            acks, nacks, progress = link.acks, link.nacks, link.progress
            link.acks, link.nacks, link.progress = [], [], {}
            # Progress first: a job's last report reaches the dispatcher before its result.
            results = [
                pb.WorkerMessage(progress=pb.ProgressReports(reports=part))
                for part in _parts(list(progress.values()))
            ]
            results += [pb.WorkerMessage(acks=pb.Acks(acks=part)) for part in _parts(acks)]
            results += [pb.WorkerMessage(nacks=pb.Nacks(nacks=part)) for part in _parts(nacks)]
            try:
                if self._draining:
                    for message in results:
                        await call.write(message)
                    if not drained_sent:
                        await call.write(pb.WorkerMessage(drain=pb.Drain()))
                        drained_sent = True
                    continue
                credit = self._credit_to_grant(link)
                link.granted += credit
                if credit and results and link.protocol >= 2:
                    # The dispatcher frees the results' slots first, then grants the credit.
                    results[-1].then_credit = credit
                elif credit:
                    results.append(pb.WorkerMessage(credit=pb.Credit(slots=credit)))
                for message in results:
                    await call.write(message)
            except BaseException:
                # Not written: keep them for the next stream (they are reclaimed in its hello).
                link.acks[:0] = acks
                link.nacks[:0] = nacks
                link.progress = {**progress, **link.progress}
                raise

    def _credit_to_grant(self, link: _Link) -> int:
        """The slots to grant a link now: none, or a batch worth a lease round."""
        # Results not yet written still hold their slot at the dispatcher (those being written now
        # free theirs before the credit that follows them is applied).
        running = self._running_on[link.address]
        # A share that grew since the hello (another dispatcher left the map) is not this stream's:
        # credit past the declared concurrency was counted as granted here and dropped there, and
        # once the share shrank back the phantom stopped every grant (the link starved).
        share = min(link.share, link.declared) if link.declared else link.share
        deficit = share - running - link.unsent - link.granted
        # While handlers are stuck past their timeout, a lease is taken only for a free
        # thread: a job leased and then left queued behind them would wait unrun. Without
        # stuck handlers the shares bound the credit; a share that just shrank (a new
        # dispatcher to split with) may leave a link's credit above it for a moment, and
        # capping then would starve the new link until the old one's credit is used.
        capped = False
        if self.stuck_threads:
            free = self._free_threads()
            capped = free < deficit
            if capped:
                deficit = free
                self._capped = True
        # Refill in batches (a quarter of the share) so leases come in batches too; at once
        # when nothing is left to run, so the link never idles waiting for a refill, and
        # when every free thread is asked for, as no bigger batch can come.
        idle = running == 0 and link.granted == 0
        if deficit > 0 and (idle or capped or deficit >= max(1, share // 4)):
            return deficit
        return 0

    def _free_threads(self) -> int:
        """Handler threads that are neither running a job, promised to credit not yet used, nor stuck."""
        granted = sum(link.granted for link in self._links.values() if link.connected.is_set())
        return self.concurrency - self.stuck_threads - len(self._running) - granted

    async def _heartbeats(self, link: _Link, call: Any, finish: asyncio.Event) -> None:
        while True:
            interval = self._heartbeat_ms
            ttls = [r.ttl_ms for r in self._running.values() if not r.lost]
            if ttls:
                interval = min(interval, max(100, min(ttls) // 3))
            try:
                async with asyncio.timeout(interval / 1000):
                    await finish.wait()
                return
            except TimeoutError:
                pass
            refs = [
                r.ref
                for r in self._running.values()
                if not r.lost and self._link_for(r.ref.shard, r.link) is link
            ]
            if refs and link.connected.is_set():
                for part in _parts(refs):
                    await call.write(pb.WorkerMessage(heartbeat=pb.Heartbeat(leases=part)))

    # -- jobs ------------------------------------------------------------------------------------

    def _start(self, lease: pb.Lease, link: str, traced: bool = False) -> None:
        ref = lease.ref
        ctx = JobContext(
            ref.job_id,
            lease.type,
            lease.payload,
            lease.attempt,
            lease.max_attempts,
            PRIORITY_NAMES.get(lease.priority, "default"),
            lease.deadline_ms,
            lease.idempotency_key,
            lease.run_at_ms,
            ref.token,
            ref.shard,
            lease.concurrency_key,
            lease.headers,
            tuple(
                DependencyResult(d.job_id, d.type, d.state, d.result, d.truncated)
                for d in lease.dependency_results
            )
            if lease.dependency_results
            else (),
            _report=self._reporter,
        )
        running = _Running(ref=ref, ctx=ctx, ttl_ms=lease.lease_ttl_ms, link=link)
        self._running[ctx.job_id] = running
        self._running_on[link] += 1
        running.task = asyncio.create_task(
            self._execute_traced(running) if traced else self._execute(running)
        )

    def _report_progress(self, loop: asyncio.AbstractEventLoop, ctx: JobContext, text: str) -> None:
        """A handler's report, from its thread or the loop: only the latest is sent, with the others'
        at the next progress flush (PROGRESS_INTERVAL_S). One from a job no longer running is dropped."""
        running = self._running.get(ctx.job_id)
        if running is None or running.ctx is not ctx:
            return
        running.progress = text
        if not running.progress_due:
            running.progress_due = True
            with contextlib.suppress(RuntimeError):  # the loop is closed: the worker has stopped
                loop.call_soon_threadsafe(self._progress_reported, running)

    def _progress_reported(self, running: _Running) -> None:
        self._progress_waiting.append(running)
        if self._progress_flush is None:
            loop = asyncio.get_running_loop()
            self._progress_flush = loop.call_later(PROGRESS_INTERVAL_S, self._flush_progress)

    def _flush_progress(self) -> None:
        self._progress_flush = None
        waiting, self._progress_waiting = self._progress_waiting, []
        for running in waiting:
            self._queue_progress(running)

    def _queue_progress(self, running: _Running) -> None:
        """The job's latest report into its link's next message (none for a lost or settled lease)."""
        if not running.progress_due:
            return
        running.progress_due = False
        if running.lost or running.done:
            return
        link = self._link_for(running.ref.shard, running.link)
        link.progress[running.ctx.job_id] = pb.JobProgress(lease=running.ref, progress=running.progress)
        link.wake.set()

    def _cancel(self, ref: pb.LeaseRef) -> None:
        running = self._running.get(ref.job_id)
        if running is None or running.ref.token != ref.token:
            return
        running.cancelled_by_dispatcher = True
        self._stop(running)

    def _lose(self, job_id: str, reason: str) -> None:
        running = self._running.get(job_id)
        if running is None:
            return
        self.log.warning("lease lost; the job's result will not be acked", job=job_id, reason=reason)
        running.lost = True
        self._stop(running)

    def _stop(self, running: _Running) -> None:
        """Ask a job to stop: an async handler is cancelled, a plain one sees ctx.cancelled."""
        running.ctx._cancel()
        handler = self.handlers.get(running.ctx.type)
        if running.started and running.task and handler is not None and self._is_async[running.ctx.type]:
            running.task.cancel()

    async def _execute(self, running: _Running) -> None:
        outcome, _ = await self._attempt(running)
        self._settle(running, outcome)

    async def _execute_traced(self, running: _Running) -> None:
        """_execute in the attempt's span (worker_sdk/_tracing.py)."""
        ctx = running.ctx
        with _tracing.processing(
            ctx.job_id, ctx.type, ctx.attempt, ctx.max_attempts, ctx.shard, ctx.headers
        ) as span:
            outcome, error = await self._attempt(running)
            if running.lost:
                _tracing.lease_lost(span, "the dispatcher rejected the lease")
            else:
                _tracing.finished(
                    span,
                    ctx.attempt,
                    ctx.max_attempts,
                    outcome if isinstance(outcome, pb.Nack) else None,
                    error,
                )
        self._settle(running, outcome)

    async def _attempt(self, running: _Running) -> tuple[pb.Ack | pb.Nack, BaseException | None]:
        """Run the handler once; its outcome, and the exception that failed it (None otherwise)."""
        ctx = running.ctx
        handler = self.handlers.get(ctx.type)
        outcome: pb.Ack | pb.Nack
        error: BaseException | None = None
        running.started = True
        self.log.debug("job started", job=ctx.job_id, type=ctx.type, shard=ctx.shard, attempt=ctx.attempt)
        try:
            if handler is None:
                outcome = pb.Nack(lease=running.ref, error=f"no handler for {ctx.type!r}", no_handler=True)
            elif ctx.cancelled:  # stopped before it began: its Lease and Cancel came in one turn
                raise asyncio.CancelledError
            else:
                slots = self._slots.get(ctx.type)
                if slots is None:
                    result = await self._invoke(handler, ctx)
                else:
                    async with slots:
                        result = await self._invoke(handler, ctx)
                outcome = pb.Ack(lease=running.ref, result=_encode_result(result))
        except RateLimited as exc:
            outcome = _rate_limited(running.ref, exc)
        except Retry as exc:
            error = exc
            outcome = pb.Nack(lease=running.ref, error=str(exc), retryable=True)
            if exc.delay is not None:
                outcome.retry_delay_ms = max(0, int(exc.delay * 1000))
        except SkipRetry as exc:
            error = exc
            outcome = pb.Nack(lease=running.ref, error=_describe(exc), retryable=False)
        except _TimedOut:
            outcome = pb.Nack(
                lease=running.ref, error=f"timed out after {self.job_timeout} s", retryable=True
            )
        except asyncio.CancelledError:
            if running.cancelled_by_dispatcher:
                outcome = pb.Nack(lease=running.ref, error="cancelled", retryable=False)
            else:
                outcome = pb.Nack(
                    lease=running.ref,
                    error="worker shut down before the job finished",
                    retryable=True,
                    retry_delay_ms=0,
                )
        except Exception as exc:
            error = exc
            outcome = pb.Nack(lease=running.ref, error=_describe(exc), retryable=True)
        finally:
            self._running.pop(ctx.job_id, None)
            self._running_on[running.link] -= 1
            if not self._running_on[running.link]:
                del self._running_on[running.link]  # no zero left per dispatcher address ever run on
        return outcome, error

    def _settle(self, running: _Running, outcome: pb.Ack | pb.Nack) -> None:
        """Queue the outcome for the dispatcher (none for a lost lease) and free the slot."""
        ctx = running.ctx
        origin = self._links.get(running.link)
        self._queue_progress(running)  # its last report goes ahead of its result
        running.done = True
        if running.lost:
            if origin is not None:
                origin.wake.set()  # its slot is free: credit can be refilled
            self._wake_if_capped()
            return
        link = self._link_for(running.ref.shard, running.link)
        if isinstance(outcome, pb.Ack):
            link.acks.append(outcome)
            self.completed += 1
            self.log.debug("job succeeded", job=ctx.job_id, type=ctx.type, shard=ctx.shard)
        else:
            link.nacks.append(outcome)
            self.log.info(
                "job failed",
                job=ctx.job_id,
                type=ctx.type,
                shard=ctx.shard,
                attempt=ctx.attempt,
                retryable=outcome.retryable,
                error=outcome.error.strip().splitlines()[-1:],
            )
        link.wake.set()
        if origin is not None and origin is not link:
            origin.wake.set()
        self._wake_if_capped()

    def _wake_if_capped(self) -> None:
        """A thread came free: a link held back for want of one may grant credit again."""
        if self._capped:
            self._capped = False
            self._wake_all()

    async def _invoke(self, handler: Handler, ctx: JobContext) -> Any:
        if not self._is_async[ctx.type]:
            return await self._invoke_in_thread(handler, ctx)
        try:
            return await self._within_budget(handler(ctx))
        except (_TimedOut, asyncio.CancelledError):
            ctx._cancel()
            raise

    async def _within_budget(self, handler_call: Awaitable[Any]) -> Any:
        """Await a handler for at most ``job_timeout``. A ``TimeoutError`` the handler raises itself
        (a socket's, say) is its own failure, reported with its traceback."""
        if self.job_timeout is None:
            return await handler_call
        budget = asyncio.timeout(self.job_timeout)
        try:
            async with budget:
                return await handler_call
        except TimeoutError:
            if budget.expired():
                raise _TimedOut from None
            raise

    async def _invoke_in_thread(self, handler: Handler, ctx: JobContext) -> Any:
        began: asyncio.Future[None] | None = None
        if self.job_timeout is None:
            call = self._pool.submit(_tracing.bound_to_context(handler), ctx)
        else:
            # The budget is the handler's own running time, not its wait for a thread.
            loop = asyncio.get_running_loop()
            began = loop.create_future()

            def run() -> Any:
                loop.call_soon_threadsafe(_resolve, began)
                return handler(ctx)

            call = self._pool.submit(_tracing.bound_to_context(run))
        try:
            if began is not None:
                await began
            return await self._within_budget(asyncio.wrap_future(call))
        except (_TimedOut, asyncio.CancelledError) as exc:
            ctx._cancel()
            # A thread cannot be interrupted: one already running stays held until the handler returns.
            if not call.cancel() and not call.done():
                self._hold_thread(call, ctx, timed_out=isinstance(exc, _TimedOut))
            raise

    def _hold_thread(self, call: Future[Any], ctx: JobContext, timed_out: bool) -> None:
        self.stuck_threads += 1
        if timed_out:
            fields = {"job": ctx.job_id, "type": ctx.type, "timeout": self.job_timeout}
            if self.stuck_threads >= self.concurrency:
                self.log.error(
                    "every handler thread is stuck",
                    stuck_threads=self.stuck_threads,
                    effect="taking no leases until a handler returns",
                    **fields,
                )
            else:
                self.log.warning(
                    "handler past its timeout still holds its thread",
                    stuck_threads=self.stuck_threads,
                    concurrency=self.concurrency,
                    **fields,
                )
        loop = asyncio.get_running_loop()

        def returned(_: Future[Any]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the worker has stopped
                loop.call_soon_threadsafe(self._thread_returned, ctx)

        call.add_done_callback(returned)

    def _thread_returned(self, ctx: JobContext) -> None:
        self.stuck_threads -= 1
        self.log.info(
            "stuck handler returned; its thread is free",
            job=ctx.job_id,
            type=ctx.type,
            stuck_threads=self.stuck_threads,
        )
        self._capped = False
        self._wake_all()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _parts(items: list[_M]) -> Iterator[list[_M]]:
    """The items in runs that fit one message (MESSAGE_LEASES, MESSAGE_BYTES)."""
    part: list[_M] = []
    size = 0
    for item in items:
        item_size = item.ByteSize()
        if part and (len(part) >= MESSAGE_LEASES or size + item_size > MESSAGE_BYTES):
            yield part
            part, size = [], 0
        part.append(item)
        size += item_size
    if part:
        yield part


def _encode_result(result: Any) -> bytes:
    if result is None:
        return b""
    data = bytes(result) if isinstance(result, bytes | bytearray) else json.dumps(result).encode()
    if len(data) > MAX_RESULT_BYTES:
        raise ValueError(f"handler result is {len(data)} bytes; the limit is {MAX_RESULT_BYTES}")
    return data


def _describe(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(exc))
    return text[-MAX_ERROR_CHARS:]


def serve(
    handlers: Mapping[str, Handler],
    *,
    target: str | None = None,
    concurrency: int = 16,
    max_in_flight: Mapping[str, int] | None = None,
    job_timeout: float | None = None,
    shutdown_grace: float = 30.0,
    worker_id: str | None = None,
    max_reconnect_delay: float = 5.0,
    handle_signals: bool = True,
    map_refresh: float = 5.0,
    token: str | None = None,
    tls: bool | None = None,
    tls_ca: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    tls_server_name: str | None = None,
) -> Worker:
    """Serve ``handlers`` (see :class:`Worker` for the options).

    In synchronous code (no event loop running) it serves at once and blocks until SIGTERM/SIGINT,
    then returns the stopped worker: a script's last line is ``serve(handlers)``. Inside a running
    event loop it returns the worker without blocking the loop: ``await serve(handlers)`` serves
    until SIGTERM/SIGINT, and ``async with serve(handlers) as worker:`` serves in the background for
    the block. A worker returned that way and never awaited, entered or run warns (RuntimeWarning)
    when it is garbage-collected, as a coroutine never awaited does.

    With ``job_timeout``, a plain (sync) handler must be interruptible: check ``ctx.cancelled``
    between steps, or pause with ``ctx.wait_cancelled(seconds)`` rather than ``time.sleep``, and
    give blocking calls their own timeouts. A handler that blocks past its timeout keeps its thread
    until it returns, and the worker runs one job fewer meanwhile (``worker.stuck_threads``).
    """
    worker = Worker(
        handlers, target=target, concurrency=concurrency, max_in_flight=max_in_flight,
        job_timeout=job_timeout, shutdown_grace=shutdown_grace, worker_id=worker_id,
        max_reconnect_delay=max_reconnect_delay, handle_signals=handle_signals, map_refresh=map_refresh,
        token=token, tls=tls, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key,
        tls_server_name=tls_server_name,
    )  # fmt: skip
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        worker.run()
        return worker
    worker._must_run = True
    return worker


#: The longest RateLimited.retry_after the dispatcher takes (a day).
MAX_RETRY_AFTER_S = 24 * 3600


def _rate_limited(ref: pb.LeaseRef, exc: RateLimited) -> pb.Nack:
    """The nack of a rate-limited job. A retry_after out of bounds is held to them (a handler's
    arithmetic error should not make its job fail), never below a millisecond."""
    try:
        seconds = float(exc.retry_after)
    except (TypeError, ValueError):
        seconds = 1.0
    if not seconds > 0:  # NaN too
        seconds = 0.001
    delay_ms = max(1, min(int(seconds * 1000), MAX_RETRY_AFTER_S * 1000))
    return pb.Nack(
        lease=ref,
        error=str(exc) or "rate limited",
        retryable=True,
        retry_delay_ms=delay_ms,
        rate_limited=True,
        hold_siblings=bool(exc.hold_siblings),
    )

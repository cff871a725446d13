"""One WorkerSession per worker stream: credit, held leases, and the loop that leases to it."""

from __future__ import annotations

import asyncio
import functools
import secrets
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

import structlog

from shardmap import shard_for
from shardq_common.clock import steady_ms, wall_ms, wall_ms_exact
from shardq_common.errors import DispatcherError, NotOwner, StoreUnavailable
from shardq_common.pb import shardq_pb2 as pb
from shardq_common.precise_timer import precise_timer
from shardq_common.wakeup import Wakeup

from ..config import Settings
from ..ops import metrics
from ..ops.redis_errors import REDIS_ERRORS
from ..ops.redis_faults import note_redis_error
from ..ops.tracing import now_ns, spans
from .fairness import FairPicker
from .ownership import Ownership
from .states import Priority
from .status_writer import LEASE_WRITE_DELAY_MS, StatusWriter, lease_update
from .validation import DEPENDENCIES_HEADER, priority_to_pb, visible_headers
from .working_set import Grant, LeaseRound, WorkingSet

log = structlog.get_logger("shardq.sessions")
IDLE_RECHECK_S = 2.0  # re-poll even without a wake-up, for jobs made ready by other paths
# Answers queued for a worker that is not reading its stream; past this its own messages wait unread.
OUTBOX_LIMIT_BYTES = 4 << 20
# After we end a stream (redirect, shutdown), results the worker wrote before it saw that are still on
# their way: we read on until it half-closes, at most this long, so a finished job does not run again.
RESULTS_GRACE_S = 3.0
# A lease granted before its job's run_at is sent at run_at by the precise timer (wall clock), and at
# the latest this long after the wait planned, by the loop's own clock, should the wall clock step back.
UNSENT_SLACK_S = 0.05
# After a lease call failed on a Redis error the session waits this long, doubling up to the cap.
LEASE_BACKOFF_S = 0.2
LEASE_BACKOFF_CAP_S = 2.0


@dataclass(frozen=True)
class SessionContext:
    """What the worker sessions of one process lease with: one of these, shared by them all."""

    settings: Settings
    registry: SessionRegistry
    ownership: Ownership
    working_set: WorkingSet
    writer: StatusWriter
    #: (shard, earliest deadline of the leases just granted): the shard's reaper looks by then.
    lease_deadline: Callable[[int, int], None]
    #: Leases just granted, for the metrics.
    on_leased: Callable[[Sequence[Grant]], None]
    #: (session, grants): leases withdrawn before their messages went out go back to their queues.
    return_unsent: Callable[[WorkerSession, list[Grant]], Awaitable[None]]
    #: Issue 21: job ids -> their dependencies' outcomes (id, type, state, result, truncated), for
    #: the leases of jobs that waited for others (one DB read per lease message that has such jobs).
    dependency_results: (
        Callable[[list[str]], Awaitable[dict[str, list[tuple[str, str, str, bytes, bool]]]]] | None
    ) = None


class WorkerSession:
    def __init__(
        self, context: SessionContext, worker_id: str, job_types: list[str], concurrency: int, peer: str
    ) -> None:
        self.context = context
        self.settings = context.settings
        self.registry = context.registry
        self.ownership = context.ownership
        self.working_set = context.working_set
        self.writer = context.writer
        self.worker_id = worker_id
        # Written with each lease as its run's worker, unless attempt history is off (then nothing of it is).
        self._run_worker = worker_id if context.writer.attempt_history else None
        self.job_types = job_types
        self.concurrency = concurrency
        self.peer = peer
        # Names this stream as the holder of its leases in Redis, so that when it ends only the leases
        # it still holds are shortened: the worker may have reclaimed some on a newer stream, perhaps
        # on another dispatcher, before this one was seen to end.
        self.stream_id = secrets.token_hex(6)
        self.connected_at_ms = wall_ms()
        self.last_seen_ms = self.connected_at_ms  # its last message, for the dashboard
        self.credit = 0
        self.held: dict[str, tuple[str, int]] = {}  # job id -> (token, shard)
        # Leases not sent yet: granted ahead of their job's run_at (the promoter's lease_ahead_ms),
        # sent at it, or granted in the lease round under way, sent together at its end.
        self.unsent: dict[str, Grant] = {}
        self._round_refs: list[tuple[str, str]] = []  # the round's due leases, in the order granted
        self.outbox: asyncio.Queue[pb.DispatcherMessage | None] = asyncio.Queue()
        self._outbox_bytes = 0
        self._room = asyncio.Event()  # set while the outbox is under OUTBOX_LIMIT_BYTES
        self._room.set()
        self.wake = Wakeup()
        self.draining = False
        self.closed = False
        self.error: DispatcherError | None = None  # why the dispatcher closed the stream
        self.picker = FairPicker(self.settings.fairness)
        self.types_by_shard: dict[int, list[str]] = defaultdict(list)
        for t in job_types:
            self.types_by_shard[shard_for(t, self.settings.shard_count)].append(t)
        self._rotation = 0
        self._lease_backoff = LEASE_BACKOFF_S
        self._gate_timers: dict[int, tuple[int, asyncio.TimerHandle]] = {}  # shard -> (steady ms, timer)
        self._delivering: set[asyncio.Task[None]] = set()  # leases waiting for dependency results
        self.log = log.bind(worker=worker_id, peer=peer)

    def send(self, message: pb.DispatcherMessage) -> None:
        if not self.closed:
            self.outbox.put_nowait(message)
            self._outbox_bytes += message.ByteSize()
            if self._outbox_bytes > OUTBOX_LIMIT_BYTES:
                self._room.clear()

    async def next_message(self) -> pb.DispatcherMessage | None:
        """The next message for the worker; None once the session is closed."""
        message = await self.outbox.get()
        if message is not None:
            self._outbox_bytes -= message.ByteSize()
            if self._outbox_bytes <= OUTBOX_LIMIT_BYTES:
                self._room.set()
        return message

    async def room(self) -> None:
        """Until the worker has read most of what was sent to it. Its stream's reader waits here
        before taking the next message, so a worker that stops reading (while it keeps writing
        heartbeats or acks, each answered) is slowed down by gRPC flow control instead of growing the
        outbox without bound; its heartbeats stop counting and its leases lapse: alive means
        listening. Leases, cancels and redirects are bounded by credit and held leases."""
        await self._room.wait()

    def redirect(self, reason: str) -> None:
        """Tell the worker to reconnect (to wherever its shards are now) and end the stream."""
        self.send(pb.DispatcherMessage(redirect=pb.Redirect(reason=reason)))
        self.close()

    def close(self) -> None:
        if not self.closed:
            for _, timer in self._gate_timers.values():
                timer.cancel()
            self._gate_timers.clear()
            self.closed = True
            self.outbox.put_nowait(None)
            self._room.set()
            self.wake.set()

    def add_credit(self, slots: int) -> None:
        # Never more leases in flight than the declared concurrency.
        self.credit = max(0, min(self.credit + slots, self.concurrency - len(self.held)))
        self.wake.set()

    def forget(self, job_id: str) -> None:
        """Drop a lease this worker no longer holds."""
        unsent = self.unsent.pop(job_id, None) is not None
        if self.held.pop(job_id, None) is not None:
            self.registry.holders.pop(job_id, None)
        if unsent:
            self.add_credit(1)  # the worker counts the slot as granted: give it back

    def hold(self, job_id: str, token: str, shard: int) -> None:
        self.held[job_id] = (token, shard)
        self.registry.holders[job_id] = self

    async def pump(self) -> None:
        """Lease to this worker whenever it has credit and its shards have ready jobs."""
        settings = self.settings
        while not self.closed:
            self.wake.clear()  # before looking, so a wake-up during the lease round is not lost
            if self.credit <= 0 or self.draining or self.registry.stopping:
                await self.wake.wait()
                continue
            granted = await self._lease_round(min(self.credit, settings.lease_batch))
            # One message for the round, however many shards and classes it leased from: a message
            # costs the worker far more than a lease in it.
            round_refs, self._round_refs = self._round_refs, []
            self._send_unsent(round_refs)
            if granted == 0 and not self.closed:
                if not await self.wake.wait(IDLE_RECHECK_S):
                    # The safety net: look at every shard again, whatever the hints say.
                    for shard, types in self.types_by_shard.items():
                        self.registry.hints.forget(shard, types)

    async def _lease_round(self, n: int) -> int:
        """Lease up to n jobs across this worker's shards with the class picks of the fairness policy.

        One shard: its lease script falls back to the highest non-empty class itself. Several: first
        each shard serves only the classes picked, then unfilled picks go to the highest class that has
        jobs in any shard, so a shard holding only low jobs cannot take a slot that high jobs elsewhere
        should get. Shards known to have nothing ready for these types are skipped (ReadyHints)."""
        picks = self.picker.picks(n)
        hints = self.registry.hints
        shards = [s for s in self.types_by_shard if self.ownership.owns(s)]
        if not shards:
            return 0
        self._rotation = (self._rotation + 1) % len(shards)
        shards = shards[self._rotation :] + shards[: self._rotation]
        if len(shards) == 1:
            shard = shards[0]
            if not any(hints.maybe(shard, self.types_by_shard[shard], c) for c in Priority):
                return 0
            seen = hints.version
            got, unfilled = await self._lease_from(shard, picks, fallback=True)
            if unfilled:  # with fallback, an unfilled pick means every class is empty
                hints.mark_empty(shard, self.types_by_shard[shard], Priority, seen)
            return got
        granted = 0
        for shard in shards:
            types = self.types_by_shard[shard]
            if not picks or self.closed:
                return granted
            if not any(hints.maybe(shard, types, c) for c in set(picks)):
                continue
            seen = hints.version
            got, unfilled = await self._lease_from(shard, picks, fallback=False)
            hints.mark_empty(shard, types, set(unfilled), seen)
            granted, picks = granted + got, unfilled
        for cls in Priority:
            for shard in shards:
                types = self.types_by_shard[shard]
                if not picks or self.closed:
                    return granted
                if not hints.maybe(shard, types, cls):
                    continue
                seen = hints.version
                got, unfilled = await self._lease_from(shard, [cls] * len(picks), fallback=False)
                if unfilled:
                    hints.mark_empty(shard, types, [cls], seen)
                granted, picks = granted + got, picks[got:]
        return granted

    async def _lease_from(
        self, shard: int, picks: list[Priority], fallback: bool
    ) -> tuple[int, list[Priority]]:
        epoch = self.ownership.epochs.get(shard)
        if epoch is None:
            return 0, picks  # moved away since the round began
        try:
            start_ns = now_ns() if spans.enabled else 0
            try:
                leased = await self.working_set.lease(
                    shard,
                    epoch,
                    steady_ms(),
                    self.types_by_shard[shard],
                    picks,
                    fallback=fallback,
                    holder=self.stream_id,
                )
            except NotOwner:
                await self.ownership.recover(shard, epoch)
                return 0, picks
        except (*REDIS_ERRORS, StoreUnavailable) as exc:
            if isinstance(exc, StoreUnavailable):  # recovering the shard takes a new epoch from the DB
                self.log.warning("lease: database unavailable", shard=shard, error=str(exc))
            else:
                note_redis_error("lease", exc, shard=shard, worker=self.worker_id)
            await asyncio.sleep(self._lease_backoff)
            self._lease_backoff = min(self._lease_backoff * 2, LEASE_BACKOFF_CAP_S)
            return 0, picks
        self._lease_backoff = LEASE_BACKOFF_S
        grants, unfilled = leased.grants, leased.unfilled
        if leased.held_back or leased.wake_at_ms >= 0:
            self._held_back(shard, leased)
        if not grants:
            return 0, unfilled
        if self.closed:
            # The stream ended while we leased: the worker never saw these leases, so they go back as
            # if never granted (the attempt not counted) rather than lapsing after the reconnect grace.
            await self.context.return_unsent(self, grants)
            return 0, []
        self.credit -= len(grants)
        self.context.lease_deadline(shard, min(g.deadline_ms for g in grants))
        now = wall_ms()
        for g in grants:
            self.hold(g.id, g.token, g.shard)
            self.writer.record(shard, lease_update(g, now, self._run_worker), defer_ms=LEASE_WRITE_DELAY_MS)
        self._send_leases(grants)
        if spans.enabled:
            spans.record(
                "shardq lease",
                start_ns,
                (g.headers for g in grants),
                {
                    "messaging.destination.partition.id": str(shard),
                    "messaging.batch.message_count": len(grants),
                    "messaging.consumer.group.name": self.worker_id,
                },
            )
        for g in grants:
            self.log.debug("job leased", job=g.id, type=g.type, shard=g.shard, attempt=g.attempt)
        self.context.on_leased(grants)
        return len(grants), unfilled

    def _held_back(self, shard: int, leased: LeaseRound) -> None:
        """Flow control held types of the shard back: look again when their gate opens (a rate limit,
        a RateLimited hold), or when one of their leases ends (a concurrency limit: see
        SessionRegistry.leases_ended); a resume or a settings change notifies the shard."""
        for job_type, reason in leased.held_back:
            metrics.LEASE_HELD_BACK.labels(metrics.type_label(job_type), reason).inc()
            if reason in ("concurrency", "key_concurrency"):
                self.registry.limited.add((shard, job_type))
        if leased.wake_at_ms < 0:
            return
        pending = self._gate_timers.get(shard)
        if pending is not None and pending[0] <= leased.wake_at_ms and not pending[1].cancelled():
            return  # a wake-up at or before that instant is already set
        if pending is not None:
            pending[1].cancel()
        delay_s = max(0.0, (leased.wake_at_ms - steady_ms()) / 1000)
        timer = asyncio.get_running_loop().call_later(delay_s, self._gate_opened, shard)
        self._gate_timers[shard] = (leased.wake_at_ms, timer)

    def _gate_opened(self, shard: int) -> None:
        """Every worker of these types looks again, not only this one: this one may have no credit."""
        self._gate_timers.pop(shard, None)
        types = self.types_by_shard.get(shard, ())
        self.registry.notify_ready(shard, [(t, int(c)) for t in types for c in Priority])

    def _send_leases(self, grants: list[Grant]) -> None:
        """Send the leases of due jobs at the end of the lease round, and each of the others at its
        job's run_at. Until sent, a lease can be withdrawn (the stream ended, the job cancelled)."""
        now = wall_ms_exact()
        hold_ms = self.settings.lease_ahead_ms + 1
        ahead: dict[int, list[tuple[str, str]]] = defaultdict(list)
        for g in grants:
            self.unsent[g.id] = g
            # A run_at further ahead than the promoter's lead is another clock's (a step, another
            # process's): holding it could outlast the lease, so it goes now, as before the lead.
            if 0 < g.run_at_ms - now <= hold_ms:
                ahead[g.run_at_ms].append((g.id, g.token))
            else:
                self._round_refs.append((g.id, g.token))
        for run_at_ms, refs in ahead.items():
            send = functools.partial(self._send_unsent, refs)
            precise_timer.call_at(run_at_ms, send)
            asyncio.get_running_loop().call_later((run_at_ms - now) / 1000 + UNSENT_SLACK_S, send)

    def _send_unsent(self, refs: list[tuple[str, str]]) -> None:
        if self.closed:
            return  # closing returns what is still unsent
        grants = []
        for job_id, token in refs:
            grant = self.unsent.get(job_id)
            if grant is not None and grant.token == token:  # not a later lease of the same job
                del self.unsent[job_id]
                grants.append(grant)
        if grants:
            self._deliver(grants)

    def _deliver(self, grants: list[Grant]) -> None:
        """Send the leases; those of jobs that waited for others (issue 21) once their dependencies'
        results are read, which only they wait for."""
        fetch = self.context.dependency_results
        waited = [g.id for g in grants if g.headers and DEPENDENCIES_HEADER in g.headers]
        if not waited or fetch is None:
            self.send(_leases_message(grants))
            return
        task = asyncio.create_task(self._deliver_with_results(grants, waited, fetch))
        self._delivering.add(task)
        task.add_done_callback(self._delivering.discard)

    async def _deliver_with_results(
        self,
        grants: list[Grant],
        waited: list[str],
        fetch: Callable[[list[str]], Awaitable[dict[str, list[tuple[str, str, str, bytes, bool]]]]],
    ) -> None:
        try:
            results = await fetch(waited)
        except Exception as exc:  # the handler runs without them rather than not at all
            self.log.warning("dependency results not read; leases sent without them", error=str(exc))
            results = {}
        # A message each for leases with results (up to dependencies.MAX_RESULTS_BYTES each), so
        # that no message grows with the round.
        plain = [g for g in grants if g.id not in results]
        if plain:
            self.send(_leases_message(plain))
        for g in grants:
            if g.id in results:
                self.send(_leases_message([g], results))

    def withdraw(self, job_id: str) -> Grant | None:
        """Take back a lease whose message has not been sent (its job is not due yet), if it is one:
        forgotten here, its slot free again. The caller settles its job (``LeaseReturns.return_unsent``)."""
        grant = self.unsent.get(job_id)
        if grant is not None:
            self.forget(job_id)
        return grant

    def withdraw_all(self) -> list[Grant]:
        return [grant for grant in list(self.unsent.values()) if self.withdraw(grant.id)]


def _leases_message(
    grants: list[Grant], results: dict[str, list[tuple[str, str, str, bytes, bool]]] | None = None
) -> pb.DispatcherMessage:
    # Each lease is added in place and its ref filled in place: building a Lease and a LeaseRef and
    # copying them in would cost more than the rest of the message.
    message = pb.DispatcherMessage()
    add = message.leases.leases.add
    for g in grants:
        lease = add(
            type=g.type,
            payload=g.payload,
            priority=priority_to_pb(g.priority),
            attempt=g.attempt,
            max_attempts=g.max_attempts,
            deadline_ms=g.deadline_ms,
            lease_ttl_ms=g.lease_ttl_ms,
            idempotency_key=g.idempotency_key,
            run_at_ms=g.run_at_ms,
            enqueued_at_ms=g.enqueued_at_ms,
            concurrency_key=g.concurrency_key,
        )
        if g.headers:
            if DEPENDENCIES_HEADER in g.headers:
                lease.headers.update(visible_headers(g.headers) or {})
                for job_id, job_type, state, result, cut in (results or {}).get(g.id, ()):
                    lease.dependency_results.add(
                        job_id=job_id, type=job_type, state=state, result=result, truncated=cut
                    )
            else:
                lease.headers.update(g.headers)
        ref = lease.ref
        ref.job_id, ref.token, ref.shard = g.id, g.token, g.shard
    return message


class ReadyHints:
    """Which (shard, type, class) queues are known to be empty, so a worker whose types span many
    shards asks only those that may have ready jobs. Everything is "maybe" until a lease finds it
    empty; whatever makes a job ready in a shard (a push, a promotion, an acquisition) runs in the
    shard's owner, which clears the mark, and an idle worker looks everywhere again now and then."""

    def __init__(self) -> None:
        self._empty: set[tuple[int, str, int]] = set()
        self.version = 0  # bumped whenever something may have become ready

    def maybe(self, shard: int, job_types: Iterable[str], cls: int) -> bool:
        return any((shard, t, int(cls)) not in self._empty for t in job_types)

    def mark_empty(self, shard: int, job_types: Iterable[str], classes: Iterable[int], seen: int) -> None:
        """What a lease call that began at version `seen` found empty. If anything became ready since,
        the finding may be stale and is dropped (a job promoted during the call must not be hidden)."""
        if seen != self.version:
            return
        for t in job_types:
            for c in classes:
                self._empty.add((shard, t, int(c)))

    def mark_ready(self, shard: int, job_type: str, cls: int) -> None:
        self.version += 1
        self._empty.discard((shard, job_type, int(cls)))

    def forget(self, shard: int, job_types: Iterable[str] | None = None) -> None:
        """Back to "maybe" for the shard (all types, or these)."""
        self.version += 1
        if job_types is None:
            self._empty = {e for e in self._empty if e[0] != shard}
        else:
            for t in job_types:
                for c in Priority:
                    self._empty.discard((shard, t, int(c)))


class SessionRegistry:
    """The worker streams of this process, by shard and by the leases they hold."""

    def __init__(self) -> None:
        #: Set once the process is shutting down: no new streams, no more leasing, and the leases of
        #: a stream that ends stay valid (the worker reclaims them from the shards' next owners).
        self.stopping = False
        self.hints = ReadyHints()
        self.sessions: set[WorkerSession] = set()
        self.by_shard: dict[int, set[WorkerSession]] = defaultdict(set)
        self.holders: dict[str, WorkerSession] = {}  # job id -> session holding its lease
        #: (shard, type) that a concurrency limit held back: the end of one of its leases wakes its
        #: workers (bounded by the types of this process's streams: dropped with the last of them).
        self.limited: set[tuple[int, str]] = set()
        self._none_left = asyncio.Event()
        self._none_left.set()

    def add(self, session: WorkerSession) -> None:
        self.sessions.add(session)
        self._none_left.clear()
        for shard in session.types_by_shard:
            self.by_shard[shard].add(session)

    def remove(self, session: WorkerSession) -> None:
        self.sessions.discard(session)
        for shard in session.types_by_shard:
            self.by_shard[shard].discard(session)
        for job_id in session.held:
            if self.holders.get(job_id) is session:
                del self.holders[job_id]
        self._forget_limited(session)
        if not self.sessions:
            self._none_left.set()

    def _forget_limited(self, session: WorkerSession) -> None:
        """The ended stream's limited types that no other stream of this process leases leave
        ``limited``, so it holds only the types of the streams here, not every type ever held back.
        Such a type is "maybe ready" again for the next stream that asks for it: no lease ending
        here wakes that stream, so it must not find the type marked empty."""
        for shard, types in session.types_by_shard.items():
            for job_type in types:
                if (shard, job_type) not in self.limited:
                    continue
                if not any(job_type in other.types_by_shard.get(shard, ()) for other in self.by_shard[shard]):
                    self.limited.discard((shard, job_type))
                    self.hints.forget(shard, [job_type])

    def forget_lease(self, job_id: str) -> None:
        """The job's lease ended here (it expired): its holder, if any, forgets it."""
        holder = self.holders.get(job_id)
        if holder is not None:
            holder.forget(job_id)

    def shut_down(self) -> None:
        """Stop leasing and tell every worker to reconnect later (their leases stay valid: tokens live
        in Redis)."""
        self.stopping = True
        for session in self.all():
            session.redirect("dispatcher shutting down")

    def shard_moved(self, shard: int) -> None:
        """Send the shard's workers where the shard went (their leases stay valid)."""
        for session in list(self.by_shard.get(shard, ())):
            session.redirect(f"shard {shard} moved")

    async def all_closed(self, timeout: float) -> bool:
        """Until every stream has ended (False after the timeout)."""
        try:
            async with asyncio.timeout(timeout):
                await self._none_left.wait()
        except TimeoutError:
            return False
        return True

    def notify_shard(self, shard: int) -> None:
        """Something may have become ready in the shard: look again."""
        self.hints.forget(shard)
        for session in self.by_shard.get(shard, ()):
            session.wake.set()

    def notify_ready(self, shard: int, queues: Iterable[tuple[str, int]]) -> None:
        """Jobs of these (type, class) queues became ready in the shard."""
        types = set()
        for job_type, cls in queues:
            self.hints.mark_ready(shard, job_type, cls)
            types.add(job_type)
        for session in self.by_shard.get(shard, ()):
            if types.intersection(session.job_types):
                session.wake.set()

    def leases_ended(self, ended: Iterable[tuple[int, str]]) -> None:
        """Leases of these (shard, type) ended here: a type a concurrency limit held back has a slot
        again (for the type, or for one of its keys), so its workers look again."""
        for shard, job_type in set(ended):
            if (shard, job_type) in self.limited:
                self.notify_ready(shard, [(job_type, int(c)) for c in Priority])

    def all(self) -> Iterable[WorkerSession]:
        return list(self.sessions)

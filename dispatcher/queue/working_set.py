"""The Redis working set: typed Python calls over the Lua transitions of one shard each."""

from __future__ import annotations

import os
import random
import secrets
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from shardq_common.clock import steady_ms
from shardq_common.errors import NotOwner

from ..config import RetryPolicy
from .keys import ShardKeys
from .records import JobRecord
from .scripting import Scripts
from .states import (
    PRIORITIES,
    AckCode,
    AcquireCode,
    CancelCode,
    DeadReason,
    EpochCode,
    FenceCode,
    JobState,
    PeekCode,
    Priority,
    RetryCode,
    ReturnCode,
)

_OUTCOMES = {
    RetryCode.DELAYED: JobState.DELAYED,
    RetryCode.DEAD: JobState.DEAD,
    RetryCode.CANCELLED: JobState.CANCELLED,
}
# Most leases one extend, ack or retry script call handles: a worker's message may name thousands,
# and a script holds Redis (every shard's callers) until it returns.
SCRIPT_BATCH = 1000


def _ref_batches(head: list[Any], refs: Sequence[tuple[str, str]]) -> Iterator[list[Any]]:
    """A script's arguments for (id, token) pairs: ``head``, then at most SCRIPT_BATCH pairs, per call."""
    for start in range(0, len(refs), SCRIPT_BATCH):
        args = list(head)
        for ref in refs[start : start + SCRIPT_BATCH]:
            args += ref
        yield args


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# The value objects made once or more per job (here and in store/base.py) are slotted, not frozen:
# a frozen dataclass sets each field through object.__setattr__, which costs several times the
# building itself. Nothing changes them once made.
@dataclass(slots=True)
class NewJob:
    id: str
    record: JobRecord
    payload: bytes


@dataclass(slots=True)
class Grant:
    """One lease handed to a worker."""

    id: str
    token: str
    shard: int
    priority: Priority
    type: str
    attempt: int
    max_attempts: int
    deadline_ms: int
    lease_ttl_ms: int
    idempotency_key: str
    run_at_ms: int
    enqueued_at_ms: int
    payload: bytes
    concurrency_key: str = ""
    headers: dict[str, str] | None = None
    rate_limited: int = 0  # times its handler raised RateLimited before this lease

    @property
    def run(self) -> int:
        """This lease's number among the job's runs (rate-limited ones count): its attempt history key."""
        return self.attempt + self.rate_limited


@dataclass(slots=True)
class Transition:
    """A job's state after a transition, as the status writer records it."""

    id: str
    shard: int
    state: JobState
    run_at_ms: int = 0
    attempts: int = 0
    failures: int = 0
    expirations: int = 0
    dead_reason: str = ""
    job_type: str = field(default="", compare=False)  # when the script reports it (for metrics)
    rate_limited: int = 0  # times its handler raised RateLimited

    @property
    def run(self) -> int:
        """The number of the run that ended in this transition (see Grant.run): attempts and rate-limited
        runs add up the same before and after an ack, nack or expiry."""
        return self.attempts + self.rate_limited


@dataclass(frozen=True)
class Promotion:
    promoted: int
    next_due: int  # ms, -1 when nothing is delayed
    queues: frozenset[tuple[str, int]]  # (type, class) of the jobs that became ready


@dataclass(frozen=True)
class DueJobs:
    """Delayed jobs of one shard listed for promotion, all due by ``at`` (ms); with none listed,
    ``at`` is the earliest run_at (-1: nothing delayed)."""

    at: int
    ids: list[str]
    ready: list[tuple[str, int] | None]  # per id its (type, class), None when its record is gone


@dataclass(frozen=True)
class Restored:
    """Jobs a restore put back: ``lost`` ones Redis had lost (or never had, unknown to anybody), and
    ``unpushed`` ones whose push had failed and been noted (note_unpushed)."""

    lost: int = 0
    unpushed: int = 0

    @property
    def total(self) -> int:
        return self.lost + self.unpushed

    def __add__(self, other: Restored) -> Restored:
        return Restored(self.lost + other.lost, self.unpushed + other.unpushed)


@dataclass(frozen=True)
class NackSpec:
    id: str
    token: str
    final_reason: str = ""  # '' retryable, else a DeadReason value
    delay_ms: int = -1
    #: The handler raised RateLimited: back after delay_ms, the attempt not charged, counted apart.
    rate_limited: bool = False
    #: With rate_limited: the job's concurrency key (its type without one) leases nothing until then.
    hold_siblings: bool = False


@dataclass(frozen=True)
class LeaseRound:
    """What one lease call gave and what held it back."""

    grants: list[Grant]
    #: Picks no ready job filled (with fallback: every class was empty, or held back).
    unfilled: list[Priority]
    #: When a queue held back by a rate limit or a RateLimited hold may lease again (steady ms; -1: none).
    wake_at_ms: int = -1
    #: (type, reason) of the queues flow control held back: paused, concurrency, rate, key_concurrency,
    #: key_rate.
    held_back: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class CancelOutcome:
    code: CancelCode
    state: str
    token: str


_RETURNED_AS = {ReturnCode.READY: JobState.READY, ReturnCode.CANCELLED: JobState.CANCELLED}
# Entries per job in the flat replies of these scripts (see each script's header).
_PEEK_ENTRIES = 3
_LEASE_ENTRIES = 15
_ACK_ENTRIES = 6
_RETRY_ENTRIES = 8
_REAP_ENTRIES = 8
_RETURN_ENTRIES = 2
_FINISHED_ENTRIES = 3


def _check_owner(result: Any, shard: int) -> None:
    if isinstance(result, int) and result == FenceCode.NOT_OWNER:
        raise NotOwner(f"not the owner of shard {shard} (stale epoch or shard lost)")


class WorkingSet:
    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self.scripts = Scripts(redis)

    # -- enqueue and promotion -------------------------------------------------

    async def enqueue(self, shard: int, epoch: int, now: int, jobs: Sequence[NewJob]) -> list[int]:
        """Returns per job an EnqueueCode: SKIPPED (already present, or cancelled meanwhile), READY or
        DELAYED (plain ints: the caller compares them with the members, no enum made per job)."""
        k = ShardKeys(shard)
        groups: dict[tuple[str, int, str], int] = {}  # (type, class, concurrency key) -> 1-based group
        job_args: list[Any] = []
        for job in jobs:
            rec = job.record
            group = groups.setdefault((rec.type, int(rec.priority), rec.concurrency_key), len(groups) + 1)
            state = JobState.READY if rec.run_at_ms <= now else JobState.DELAYED
            job_args += [job.id, rec.pack(state), job.payload, group, rec.run_at_ms]
        keys = [k.meta, k.jobs, k.payloads, k.delayed, k.counts, k.seq, k.cancelled_unqueued]
        keys += [
            k.key_ready(job_type, cls, key) if key else k.ready(job_type, cls)
            for job_type, cls, key in groups
        ]
        header = [epoch, now, len(groups), *(x for group in groups for x in group)]
        result = await self.scripts.enqueue(keys=keys, args=header + job_args)
        _check_owner(result, shard)
        return [int(x) for x in result]

    async def promote_due(self, shard: int, epoch: int, now: int, limit: int) -> tuple[int, int]:
        """Move up to ``limit`` due jobs to their ready sets. Returns (promoted, next due ms or -1)."""
        due = await self.peek_due(shard, epoch, now, limit)
        if not due.ids:
            return 0, due.at
        promotion = await self.promote_listed(shard, epoch, now, due)
        return promotion.promoted, promotion.next_due

    async def peek_due(self, shard: int, epoch: int, now: int, limit: int, lookahead_ms: int = 0) -> DueJobs:
        """Up to ``limit`` jobs due by ``now``; when none is, those due at the earliest run_at if it
        is within ``lookahead_ms`` (``at`` says when). Reads only: a job is moved by promote_listed."""
        k = ShardKeys(shard)
        reply = await self.scripts.peek_due(
            keys=[k.delayed, k.jobs, k.meta], args=[now, limit, epoch, lookahead_ms]
        )
        _check_owner(reply, shard)
        ids: list[str] = []
        ready: list[tuple[str, int] | None] = []
        for i in range(1, len(reply), _PEEK_ENTRIES):
            prio = int(reply[i + 2])
            ids.append(_s(reply[i]))
            ready.append((_s(reply[i + 1]), prio) if prio != PeekCode.NONE else None)
        return DueJobs(int(reply[0]), ids, ready)

    async def promote_listed(self, shard: int, epoch: int, now: int, due: DueJobs) -> Promotion:
        """Move the jobs peek_due listed that are still delayed and due by ``now`` to their ready sets
        (the script checks each one again: a job may have been cancelled or moved since)."""
        k = ShardKeys(shard)
        ready_keys: dict[str, int] = {}
        args: list[Any] = [epoch, now]
        for job_id, queue in zip(due.ids, due.ready, strict=True):
            idx = 0 if queue is None else ready_keys.setdefault(k.ready(*queue), len(ready_keys) + 1)
            args += [job_id, idx]
        keys = [k.meta, k.jobs, k.delayed, k.counts, k.seq, *ready_keys]
        result = await self.scripts.promote_delayed(keys=keys, args=args)
        _check_owner(result, shard)
        return Promotion(int(result[0]), int(result[1]), frozenset(q for q in due.ready if q is not None))

    # -- leases ------------------------------------------------------------------

    async def lease(
        self,
        shard: int,
        epoch: int,
        now: int,
        job_types: Sequence[str],
        picks: Sequence[int],
        *,
        fallback: bool = True,
        nonce: str | None = None,
        holder: str = "",
    ) -> LeaseRound:
        """Lease one job per pick to the worker stream ``holder``, within the types' flow control.

        Tokens are ``epoch:serial:nonce``; the nonce (random unless a test fixes it) makes them
        unguessable, since an ack with a valid token completes the job on any dispatcher."""
        k = ShardKeys(shard)
        keys = [k.meta, k.jobs, k.payloads, k.leased, k.counts, k.seq]
        keys += [k.ready(t, c) for c in Priority for t in job_types]
        result = await self.scripts.lease(
            keys=keys,
            args=[
                epoch,
                now,
                len(job_types),
                "".join(str(int(c)) for c in picks),
                int(fallback),
                secrets.token_hex(8) if nonce is None else nonce,
                holder,
                *job_types,
            ],
        )
        _check_owner(result, shard)
        unfilled = [PRIORITIES[int(c)] for c in _s(result[-3])]
        held = result[-1]
        held_back = [(_s(held[i]), _s(held[i + 1])) for i in range(0, len(held), 2)]
        grants = []
        for i in range(0, len(result) - 3, _LEASE_ENTRIES):
            (
                job_id,
                token,
                cls,
                job_type,
                attempt,
                max_attempts,
                deadline,
                ttl,
                key,
                run_at,
                enqueued,
                payload,
                concurrency_key,
                headers,
                rate_limited,
            ) = result[i : i + _LEASE_ENTRIES]
            grants.append(
                Grant(
                    job_id.decode(),
                    token.decode(),
                    shard,
                    PRIORITIES[cls],
                    job_type.decode(),
                    attempt,
                    max_attempts,
                    deadline,
                    ttl,
                    key.decode(),
                    run_at,
                    enqueued,
                    payload,
                    concurrency_key.decode(),
                    msgpack.unpackb(headers, raw=False) if headers else None,
                    int(rate_limited),
                )
            )
        return LeaseRound(grants, unfilled, int(result[-2]), held_back)

    async def extend(
        self, shard: int, now: int, refs: Sequence[tuple[str, str]], holder: str = ""
    ) -> list[int]:
        """Per (id, token): new deadline, ExtendCode.REJECTED, negative deadline if cancel was requested.
        A ``holder`` (a reclaim) makes that worker stream the holder of the leases extended."""
        k = ShardKeys(shard)
        out: list[int] = []
        for args in _ref_batches([now, holder], refs):
            out += [int(x) for x in await self.scripts.extend_lease(keys=[k.jobs, k.leased], args=args)]
        return out

    async def shorten(self, shard: int, until: int, holder: str, refs: Sequence[tuple[str, str]]) -> int:
        """The worker stream ``holder`` ended: these leases, of those it still holds, end at ``until``."""
        k = ShardKeys(shard)
        shortened = 0
        for args in _ref_batches([until, holder], refs):
            shortened += int(await self.scripts.shorten_lease(keys=[k.jobs, k.leased], args=args))
        return shortened

    async def return_leases(
        self, shard: int, leases: Sequence[tuple[str, str, str, Priority]]
    ) -> list[Transition | None]:
        """Per (id, token, type, priority) of a lease its worker never received: the job READY again
        with the attempt uncounted, CANCELLED if a cancel asked, None if the token no longer holds."""
        k = ShardKeys(shard)
        ready_keys: dict[str, int] = {}
        args: list[Any] = []
        for job_id, token, job_type, priority in leases:
            args += [job_id, token, ready_keys.setdefault(k.ready(job_type, priority), len(ready_keys) + 1)]
        keys = [k.jobs, k.payloads, k.leased, k.counts, k.seq, *ready_keys]
        r = await self.scripts.return_leases(keys=keys, args=args)
        out: list[Transition | None] = []
        for n, (job_id, *_) in enumerate(leases):
            i = n * _RETURN_ENTRIES
            state = _RETURNED_AS.get(int(r[i]))  # None: ReturnCode.STALE
            out.append(Transition(job_id, shard, state, attempts=int(r[i + 1])) if state else None)
        return out

    async def ack(
        self,
        shard: int,
        now: int,
        refs: Sequence[tuple[str, str]],
        results: Sequence[bytes | None] = (),
    ) -> list[Transition | None]:
        """Complete the leases ``refs`` (id, token); ``results`` (by position, None or missing for
        none) stay with the finished records until forget()."""
        if len(refs) > SCRIPT_BATCH:
            done: list[Transition | None] = []
            for start in range(0, len(refs), SCRIPT_BATCH):
                done += await self.ack(
                    shard, now, refs[start : start + SCRIPT_BATCH], results[start : start + SCRIPT_BATCH]
                )
            return done
        k = ShardKeys(shard)
        args: list[Any] = [now]
        for n, ref in enumerate(refs):
            args += [*ref, (results[n] if n < len(results) else None) or b""]
        r = await self.scripts.ack(keys=[k.jobs, k.payloads, k.leased, k.counts, k.results], args=args)
        out: list[Transition | None] = []
        for n, (job_id, _) in enumerate(refs):
            i = n * _ACK_ENTRIES
            code, attempts, failures, expirations, job_type, rate_limited = r[i : i + _ACK_ENTRIES]
            out.append(
                Transition(
                    job_id,
                    shard,
                    JobState.SUCCEEDED,
                    now,
                    int(attempts),
                    int(failures),
                    int(expirations),
                    job_type=_s(job_type),
                    rate_limited=int(rate_limited),
                )
                if int(code) == AckCode.SUCCEEDED
                else None
            )
        return out

    async def retry(
        self,
        shard: int,
        now: int,
        nacks: Sequence[NackSpec],
        policy: RetryPolicy,
        *,
        steady_now: int | None = None,
    ) -> list[Transition | None]:
        """Nack leases: retry after backoff (or the handler's delay), dead-letter, or, for RateLimited,
        back after its delay with the attempt not charged. ``now`` is wall time (run_at's clock);
        ``steady_now`` (default ``now``) times a RateLimited hold."""
        if len(nacks) > SCRIPT_BATCH:
            done: list[Transition | None] = []
            for start in range(0, len(nacks), SCRIPT_BATCH):
                batch = nacks[start : start + SCRIPT_BATCH]
                done += await self.retry(shard, now, batch, policy, steady_now=steady_now)
            return done
        k = ShardKeys(shard)
        args: list[Any] = [
            now,
            policy.base_ms,
            policy.cap_ms,
            policy.jitter,
            int(policy.count_expirations),
            now if steady_now is None else steady_now,
        ]
        for n in nacks:
            limited = ("hold" if n.hold_siblings else "limited") if n.rate_limited else ""
            args += [n.id, n.token, n.final_reason, n.delay_ms, random.random(), limited]
        r = await self.scripts.retry(keys=[k.jobs, k.payloads, k.leased, k.delayed, k.counts], args=args)
        out: list[Transition | None] = []
        for i, n in enumerate(nacks):
            j = i * _RETRY_ENTRIES
            outcome, run_at, attempts, failures, expirations, reason, rate_limited, job_type = r[
                j : j + _RETRY_ENTRIES
            ]
            if int(outcome) == RetryCode.STALE:
                out.append(None)
                continue
            out.append(
                Transition(
                    n.id,
                    shard,
                    _OUTCOMES[int(outcome)],
                    int(run_at),
                    int(attempts),
                    int(failures),
                    int(expirations),
                    _s(reason),
                    job_type=_s(job_type),
                    rate_limited=int(rate_limited),
                )
            )
        return out

    async def reap(
        self,
        shard: int,
        epoch: int,
        now: int,
        limit: int,
        policy: RetryPolicy,
        *,
        wall_now: int | None = None,
    ) -> tuple[list[Transition], int]:
        """Expire leases whose deadline is before ``now`` (steady time); their retries are due after
        backoff from ``wall_now`` (the run_at clock; default ``now``). Returns the transitions and the
        next deadline (-1: none)."""
        k = ShardKeys(shard)
        r = await self.scripts.reap_leases(
            keys=[k.meta, k.jobs, k.payloads, k.leased, k.delayed, k.counts],
            args=[
                epoch,
                now,
                limit,
                policy.base_ms,
                policy.cap_ms,
                policy.jitter,
                int(policy.count_expirations),
                random.random(),
                now if wall_now is None else wall_now,
            ],
        )
        _check_owner(r, shard)
        out = []
        for i in range(1, len(r), _REAP_ENTRIES):
            state = _OUTCOMES[int(r[i + 1])]
            out.append(
                Transition(
                    _s(r[i]),
                    shard,
                    state,
                    int(r[i + 2]),
                    int(r[i + 3]),
                    int(r[i + 4]),
                    int(r[i + 5]),
                    str(DeadReason.LEASE_EXPIRED) if state is JobState.DEAD else "",
                    _s(r[i + 6]),
                    int(r[i + 7]),
                )
            )
        return out, int(r[0])

    # -- cancel, restore, cleanup ----------------------------------------------------

    async def cancel(
        self, shard: int, job_id: str, job_type: str, priority: Priority, now: int
    ) -> CancelOutcome:
        k = ShardKeys(shard)
        keys = [k.jobs, k.payloads, k.delayed, k.ready(job_type, priority), k.counts, k.cancelled_unqueued]
        r = await self.scripts.cancel(keys=keys, args=[job_id, now])
        return CancelOutcome(CancelCode(int(r[0])), _s(r[1]), _s(r[2]))

    async def restore(
        self,
        shard: int,
        epoch: int,
        mode: str,
        jobs: Iterable[NewJob],
        lease_deadlines: Mapping[str, int] | None = None,
        now: int | None = None,
    ) -> Restored:
        """Mode 'restore': put back those of these jobs Redis does not hold (a requeue, 'requeue',
        also replaces dead records; it counts every job as lost). ``lease_deadlines``: per job whose
        row says leased, its lease's deadline (steady ms; ``now`` is steady too): one of a type with a
        concurrency limit comes back leased until then, its slot taken (restore_jobs.lua)."""
        k = ShardKeys(shard)
        deadlines = lease_deadlines or {}
        args: list[Any] = [epoch, mode, steady_ms() if now is None else now, secrets.token_hex(8)]
        for job in jobs:
            args += [job.id, job.record.pack(), job.payload, deadlines.get(job.id, "")]
        keys = [k.meta, k.jobs, k.payloads, k.delayed, k.counts, k.cancelled_unqueued, k.unpushed]
        keys.append(k.leased)
        r = await self.scripts.restore_jobs(keys=keys, args=args)
        _check_owner(r, shard)
        return Restored(int(r[0]), int(r[1]))

    async def run_now(self, shard: int, ids: Sequence[str], now: int) -> list[str]:
        """Make these delayed jobs due at ``now`` (run_now.lua); returns those it changed. The shard's
        promoter then moves them to their ready sets."""
        k = ShardKeys(shard)
        moved: list[str] = []
        for start in range(0, len(ids), SCRIPT_BATCH):
            r = await self.scripts.run_now(
                keys=[k.jobs, k.delayed], args=[now, *ids[start : start + SCRIPT_BATCH]]
            )
            moved += [_s(x) for x in r]
        return moved

    async def note_unpushed(self, shard: int, ids: Sequence[str], now: int) -> None:
        """These committed jobs' push failed: the reconciler that restores them knows it is no loss."""
        for start in range(0, len(ids), SCRIPT_BATCH):
            await self.scripts.note_unpushed(
                keys=[ShardKeys(shard).unpushed], args=[now, *ids[start : start + SCRIPT_BATCH]]
            )

    async def forget(self, shard: int, ids: Sequence[str]) -> int:
        k = ShardKeys(shard)
        return int(await self.scripts.forget_jobs(keys=[k.jobs, k.results], args=list(ids)))

    async def types_with_fields(self, shard: int) -> set[str]:
        """The job types with per-type fields in the shard's ``keyed``, ``kvt`` or ``kcfg`` hashes
        (a ``kvt``/``kcfg`` field is '<class>:<type>')."""
        k = ShardKeys(shard)
        found = {_s(name) async for name, _ in self.redis.hscan_iter(k.keyed, count=1000)}
        for per_class in (k.key_turns, k.key_settings_seen):
            async for name, _ in self.redis.hscan_iter(per_class, count=1000):
                found.add(_s(name).split(":", 1)[1])
        return found

    async def forget_types(
        self, shard: int, idle: Sequence[str], others: Sequence[str], now: int
    ) -> list[str]:
        """Forget the per-type fields of those of the ``idle`` types (no row, no settings row in the
        database) that have no active job in the shard and no settings in Redis either, checked in
        the script (forget_types.lua: a job arriving meanwhile is either counted before the check or
        starts the fields afresh after it); trim the per-key gates and holds past ``now`` (steady
        ms) of these and the ``others``. Returns the types forgotten."""
        k = ShardKeys(shard)
        keys = [k.counts, k.flow, k.keyed, k.key_turns, k.key_settings_seen]
        named = [(t, True) for t in idle] + [(t, False) for t in others]
        forgotten: list[str] = []
        for start in range(0, len(named), SCRIPT_BATCH):
            chunk = named[start : start + SCRIPT_BATCH]
            # the script takes the idle ones first: a chunk holds idle ones, then others
            n = sum(1 for _, is_idle in chunk if is_idle)
            args = [now, n, *(t for t, _ in chunk)]
            forgotten += [_s(t) for t in await self.scripts.forget_types(keys=keys, args=args)]
        return forgotten

    async def missing(self, shard: int, ids: Sequence[str]) -> dict[str, bool]:
        """Those of these jobs Redis does not hold, each with whether its push was noted as failed."""
        k = ShardKeys(shard)
        r = await self.scripts.missing_jobs(keys=[k.jobs, k.unpushed], args=list(ids))
        return {_s(r[i]): bool(int(r[i + 1])) for i in range(0, len(r), 2)}

    async def held_between(self, shard: int, lo: str | None, hi: str | None) -> list[str]:
        """The ids in [lo, hi) (None: unbounded) of the jobs whose records the shard holds: a scan of
        its records hash, matching the bounds' common prefix on the server, a page at a time."""
        prefix = os.path.commonprefix([lo, hi]) if lo and hi else ""
        match = prefix + "*"  # ids are letters and digits: no glob character to escape
        out = []
        async for name, _ in self.redis.hscan_iter(ShardKeys(shard).jobs, match=match, count=1000):
            job_id = _s(name)
            if (lo is None or job_id >= lo) and (hi is None or job_id < hi):
                out.append(job_id)
        return out

    async def finished(self, shard: int, ids: Sequence[str]) -> list[tuple[str, JobRecord, bytes | None]]:
        """Those of these jobs whose record in Redis is finished (succeeded, dead, cancelled), each
        with the result it was acked with (None: none)."""
        k = ShardKeys(shard)
        r = await self.scripts.finished_jobs(keys=[k.jobs, k.results], args=list(ids))
        return [
            (_s(r[i]), JobRecord.unpack(r[i + 1]), r[i + 2] or None)
            for i in range(0, len(r), _FINISHED_ENTRIES)
        ]

    async def acquire(
        self,
        shard: int,
        epoch: int,
        owner: str,
        now: int,
        until: int,
        *,
        incarnation: str = "",
        lapse_at: int | None = None,
    ) -> AcquireCode:
        """ACQUIRED, ACQUIRED_UNKNOWN (a shard Redis did not know: reconcile it) or HELD (another
        owner holds an unexpired lease); raises NotOwner when the shard already has an equal or
        higher epoch. Taken over from another process (another owner, or this owner's id in an
        earlier ``incarnation``: restarted), the shard's leases lapse by ``lapse_at`` at the latest
        (see acquire_shard.lua)."""
        k = ShardKeys(shard)
        r = await self.scripts.acquire_shard(
            keys=[k.meta, k.jobs, k.leased],
            args=[epoch, owner, now, until, incarnation, "" if lapse_at is None else lapse_at],
        )
        code = AcquireCode(int(r[0]))
        if code is AcquireCode.STALE_EPOCH:
            raise NotOwner(f"shard {shard} already has epoch {_s(r[1])} >= {epoch}")
        return code

    async def renew(self, shard: int, epoch: int, until: int) -> bool:
        r = await self.scripts.renew_shard(keys=[ShardKeys(shard).meta], args=[epoch, until])
        return int(r) == EpochCode.CURRENT

    async def release(self, shard: int, epoch: int) -> bool:
        r = await self.scripts.release_shard(keys=[ShardKeys(shard).meta], args=[epoch])
        return int(r) == EpochCode.CURRENT

    async def metas(self, shards: Sequence[int]) -> dict[int, tuple[str, int, int]]:
        """shard -> (owner, epoch, lease until) for the shards whose meta exists, in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for shard in shards:
                pipe.hmget(ShardKeys(shard).meta, "owner", "epoch", "until")
            replies = await pipe.execute()
        out = {}
        for shard, (owner, epoch, until) in zip(shards, replies, strict=True):
            if epoch is not None:
                out[shard] = (_s(owner or b""), int(epoch), int(until or 0))
        return out

    async def shard_counts(self, shards: Sequence[int]) -> dict[int, int]:
        """Pending (delayed + ready + leased) jobs per shard, in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for shard in shards:
                pipe.hvals(ShardKeys(shard).counts)
            replies = await pipe.execute()
        return {shard: sum(int(v) for v in values) for shard, values in zip(shards, replies, strict=True)}

    async def next_due(self, shard: int) -> int:
        head = await self.redis.zrange(ShardKeys(shard).delayed, 0, 0, withscores=True)
        return int(head[0][1]) if head else -1

    async def counts(self, shards: Sequence[int]) -> dict[tuple[str, int, str], int]:
        """Jobs per (type, class, state) over these shards, in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for shard in shards:
                pipe.hgetall(ShardKeys(shard).counts)
            replies = await pipe.execute()
        out: dict[tuple[str, int, str], int] = {}
        for raw in replies:
            for name, value in raw.items():
                job_type, prio, state = _s(name).rsplit("|", 2)
                key = (job_type, int(prio), state)
                out[key] = out.get(key, 0) + int(value)
        return out

    async def oldest_ready(self, shard: int, job_type: str, priority: int) -> int:
        """run_at of the oldest ready job of one queue, or 0."""
        k = ShardKeys(shard)
        head = await self.redis.zrange(k.ready(job_type, priority), 0, 0)
        if not head:
            return 0
        raw = await self.redis.hget(k.jobs, head[0])
        return JobRecord.unpack(raw).run_at_ms if raw else 0

    async def record(self, shard: int, job_id: str) -> JobRecord | None:
        raw = await self.redis.hget(ShardKeys(shard).jobs, job_id)
        return JobRecord.unpack(raw) if raw else None

    async def records(self, jobs: Sequence[tuple[int, str]]) -> dict[str, JobRecord]:
        """The records of these (shard, id) jobs that Redis holds, in one round trip (a pipeline)."""
        by_shard: dict[int, list[str]] = {}
        for shard, job_id in jobs:
            by_shard.setdefault(shard, []).append(job_id)
        if not by_shard:
            return {}
        async with self.redis.pipeline(transaction=False) as pipe:
            for shard, ids in by_shard.items():
                pipe.hmget(ShardKeys(shard).jobs, ids)
            replies = await pipe.execute()
        out = {}
        for ids, raws in zip(by_shard.values(), replies, strict=True):
            for job_id, raw in zip(ids, raws, strict=True):
                if raw:
                    out[job_id] = JobRecord.unpack(raw)
        return out

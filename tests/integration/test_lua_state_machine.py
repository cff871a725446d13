"""Stateful property test of the Redis working set.

A hypothesis ``RuleBasedStateMachine`` drives the REAL Lua transitions through
``dispatcher.queue.working_set.WorkingSet`` on a REAL redis-server, against a small
pure-Python model of one shard. The model predicts every answer (grants, tokens,
deadlines, transitions, backoff, counts) and, after every step, the whole shard
is read back from Redis and checked against the model and against invariants
that need no model:

* no job lost: every active job is in exactly one of the delayed zset, its own
  ready zset or the leased zset, matching its record's state (and terminal jobs
  in none, with no payload);
* never two valid leases of one job: a leased record holds the last token issued
  for it, tokens are unique, and a superseded token is rejected forever;
* attempts bounded: failures (+ expirations when counted) <= max_attempts, and a
  job that reached it is dead (or cancelled, when a cancel was pending);
* terminal states stay terminal: a succeeded/cancelled record never changes
  again, a dead one only through ``restore(mode='requeue')``;
* the counts hash equals the real cardinalities per (type, class, state);
* a job leased at time t had run_at <= t;
* with a stale fencing epoch, every fenced call raises NotOwner and changes nothing;
* every change of state a script makes is one of ``states.TRANSITIONS`` (each script call is
  observed on its own, also inside a multi-call step), a record appears only delayed or ready and
  goes only once terminal.

The scripts take ``now`` from ARGV, so the machine owns the clock. WorkingSet is
async: each machine runs its coroutines on one event loop of its own, so the test
itself is a plain synchronous test (no pytest-asyncio involvement).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import pytest
import redis.asyncio as aredis
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from dispatcher.config import RetryPolicy
from dispatcher.queue.keys import ShardKeys
from dispatcher.queue.records import JobRecord
from dispatcher.queue.scripting import LUA_CODE_TABLES, SCRIPT_NAMES, codes_include
from dispatcher.queue.states import ACTIVE, TERMINAL, TRANSITIONS, DeadReason, JobState, Priority
from dispatcher.queue.working_set import (
    CancelOutcome,
    Grant,
    NackSpec,
    NewJob,
    Restored,
    Transition,
    WorkingSet,
)
from shardq_common.errors import NotOwner
from tests.support.state_machines import machine_settings

T = TypeVar("T")

SHARD = 3  # not 0, so a key built for the wrong shard would show up as a stray key
TYPES = ("alpha", "beta", "gamma")
T0 = 1_700_000_000_000  # realistic epoch milliseconds: exercises Lua doubles and msgpack ints
RETRYABLE = ("", "handler_error", "lease_expired")  # retry_or_dead treats these as retryable

DELAYED, READY, LEASED = JobState.DELAYED, JobState.READY, JobState.LEASED
SUCCEEDED, DEAD, CANCELLED = JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED

MACHINE_SETTINGS = machine_settings(max_examples=40, steps=40)


# -- the model ----------------------------------------------------------------------------------


@dataclass
class MJob:
    """The model of one job record (same fields as records.JobRecord) plus its ready-set score."""

    id: str
    type: str
    prio: Priority
    state: JobState
    run_at: int
    enqueued_at: int
    max_attempts: int
    ttl: int
    idem: str
    payload: bytes
    attempts: int = 0
    failures: int = 0
    expirations: int = 0
    token: str = ""
    deadline: int = 0
    cancel: bool = False
    dead_reason: str = ""  # kept in the record once dead
    holder: str = ""  # the worker stream holding its lease
    ready_seq: int = 0  # its score in the ready zset (the shard's seq when it became ready)
    frozen: bytes | None = None  # the raw record, once seen terminal: it must never change again
    result: bytes = b""  # what its ack carried: kept in the results hash until it is forgotten

    def record(self) -> JobRecord:
        return JobRecord(
            type=self.type,
            priority=self.prio,
            state=self.state,
            run_at_ms=self.run_at,
            enqueued_at_ms=self.enqueued_at,
            max_attempts=self.max_attempts,
            lease_ttl_ms=self.ttl,
            attempts=self.attempts,
            failures=self.failures,
            expirations=self.expirations,
            token=self.token,
            deadline_ms=self.deadline,
            idempotency_key=self.idem,
            cancel_requested=self.cancel,
            dead_reason=self.dead_reason,
            holder=self.holder,
        )


@dataclass(frozen=True)
class Outcome:
    """The model's retry_or_dead decision; with jitter run_at is only known within [lo, hi]."""

    state: JobState
    lo: int
    hi: int
    reason: str


JOB_SPECS = st.tuples(
    st.sampled_from(TYPES),
    st.sampled_from(list(Priority)),
    st.one_of(st.just(0), st.integers(-100, -1), st.integers(1, 300)),  # run_at offset from now
    st.integers(1, 4),  # max_attempts
    st.integers(20, 200),  # lease ttl (ms)
    st.sampled_from(["", "", "idem-1", "clé-ü"]),
    st.binary(max_size=6),
)

POLICIES = st.builds(
    lambda base, cap_factor, jitter, count: RetryPolicy(
        base_ms=base, cap_ms=base * cap_factor, jitter=jitter, count_expirations=count
    ),
    st.sampled_from([1, 10, 25]),
    st.sampled_from([1, 4, 8]),
    st.sampled_from([0.0, 0.0, 0.5]),
    st.booleans(),
)

GARBAGE_TOKENS = ("", "nope", "0:0", "99999:1", "1:")
STREAMS = ("", "stream-a", "stream-b")  # worker streams holding leases ('' records none)


class LuaStateMachine(RuleBasedStateMachine):
    def __init__(self, port: int) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.redis: Any = self.run(self._connect(port))
        self.ws = WorkingSet(self.redis)
        self.k = ShardKeys(SHARD)
        for name in SCRIPT_NAMES:
            setattr(self.ws.scripts, name, self._observed(getattr(self.ws.scripts, name)))
        self.now = T0
        self.epoch = 1
        self.stale_epochs: list[int] = []
        self.policy = RetryPolicy(base_ms=10, cap_ms=80)
        self.seq = 0  # the shard's seq counter: ready order and lease token serials
        self.jobs: dict[str, MJob] = {}  # every record Redis should hold
        self.forgotten: set[str] = set()
        self.cancelled_unqueued: set[str] = set()  # cancelled while not in Redis: a later push skips them
        self.unpushed: set[str] = set()  # noted as committed but not pushed: a restore says so
        self.tokens: dict[str, str] = {}  # every token ever issued -> its job
        self.last_token: dict[str, str] = {}  # job -> the last token issued for it
        self.superseded: set[str] = set()  # tokens that stopped holding a lease: rejected forever
        self.serial = 0
        self.ready_keys = {self.k.ready(t, c): (t, c) for t in TYPES for c in Priority}
        assert self.run(self.ws.acquire(SHARD, self.epoch, "owner-1", self.now, self.now)) == 1

    async def _connect(self, port: int) -> Any:
        client = aredis.Redis(host="127.0.0.1", port=port)
        await client.flushall()
        return client

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    async def _states(self) -> dict[bytes, JobState]:
        return {i: JobRecord.unpack(raw).state for i, raw in (await self.redis.hgetall(self.k.jobs)).items()}

    def _observed(self, script: Any) -> Any:
        """The script, checking that each call changes states only along TRANSITIONS."""

        async def call(keys: list[Any], args: list[Any]) -> Any:
            before = await self._states()
            result = await script(keys=keys, args=args)
            after = await self._states()
            for job_id, state in after.items():
                old = before.get(job_id)
                if old is None:
                    assert state in (DELAYED, READY), f"{job_id!r} appeared {state}"
                elif old is not state:
                    assert state in TRANSITIONS[old], f"{job_id!r}: {old} -> {state} is not in TRANSITIONS"
            for job_id, old in before.items():
                assert job_id in after or old in TERMINAL, f"{job_id!r} dropped while {old}"
            return result

        return call

    def teardown(self) -> None:
        try:
            self.run(self.redis.aclose())
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()

    # -- model helpers ------------------------------------------------------------------------

    def fresh_id(self) -> str:
        self.serial += 1
        return f"job-{self.serial:04d}"

    def new_record(self, spec: tuple[Any, ...], state: JobState) -> JobRecord:
        """The record of a job drawn from JOB_SPECS, enqueued now."""
        job_type, prio, offset, max_attempts, ttl, idem, _payload = spec
        return JobRecord(
            type=job_type,
            priority=prio,
            state=state,
            run_at_ms=self.now + offset,
            enqueued_at_ms=self.now,
            max_attempts=max_attempts,
            lease_ttl_ms=ttl,
            idempotency_key=idem,
        )

    def in_state(self, *states: JobState) -> list[MJob]:
        return sorted((j for j in self.jobs.values() if j.state in states), key=lambda j: j.id)

    def holds(self, job_id: str, token: str) -> bool:
        j = self.jobs.get(job_id)
        return j is not None and j.state is LEASED and j.token == token

    def end_lease(self, j: MJob) -> None:
        self.superseded.add(j.token)
        j.token = ""
        j.holder = ""

    def decide(self, j: MJob, final_reason: str, override: int) -> Outcome:
        """retry_or_dead, as the spec says: j.failures / j.expirations already count this attempt."""
        now = self.now
        if j.cancel:
            return Outcome(CANCELLED, now, now, "")
        if final_reason not in RETRYABLE:
            return Outcome(DEAD, now, now, final_reason)
        spent = j.failures + (j.expirations if self.policy.count_expirations else 0)
        if spent >= j.max_attempts:
            return Outcome(DEAD, now, now, final_reason)
        if override >= 0:
            return Outcome(DELAYED, now + override, now + override, "")
        n = max(spent, 1)
        delay = min(self.policy.cap_ms, self.policy.base_ms * 2 ** (n - 1))
        jitter = self.policy.jitter
        return Outcome(
            DELAYED, now + math.floor(delay * (1 - jitter)), now + math.floor(delay * (1 + jitter)), ""
        )

    def apply_outcome(self, j: MJob, outcome: Outcome, got: Transition, expected: Transition) -> None:
        """Compare a nack/reap transition with the prediction (run_at within the jitter range)."""
        assert replace(got, run_at_ms=0) == replace(expected, run_at_ms=0), (got, expected)
        assert outcome.lo <= got.run_at_ms <= outcome.hi, (got, outcome)
        self.end_lease(j)
        j.deadline = 0
        j.state = outcome.state
        if outcome.state is DELAYED:
            j.run_at = got.run_at_ms
        if outcome.state is DEAD:
            j.dead_reason = expected.dead_reason

    def next_delayed(self) -> int:
        return min((j.run_at for j in self.in_state(DELAYED)), default=-1)

    def next_deadline(self) -> int:
        return min((j.deadline for j in self.in_state(LEASED)), default=-1)

    def make_ready(self, j: MJob) -> None:
        self.seq += 1
        j.state = READY
        j.ready_seq = self.seq

    def draw_refs(self, data: st.DataObject) -> list[tuple[str, str]]:
        """1..3 (id, token) refs: held leases, superseded tokens, other jobs' tokens, garbage."""
        held = [(j.id, j.token) for j in self.in_state(LEASED)]
        stale = sorted((self.tokens[t], t) for t in self.superseded)
        ids = sorted(self.jobs) + ["ghost-0"]
        if held and data.draw(st.integers(0, 9), label="bias") < 6:
            return data.draw(st.lists(st.sampled_from(held), min_size=1, max_size=3), label="held refs")
        options: list[st.SearchStrategy[tuple[str, str]]] = []
        if held:
            options.append(st.sampled_from(held))
        if stale:
            options.append(st.sampled_from(stale))
        if self.tokens:
            options.append(st.tuples(st.sampled_from(ids), st.sampled_from(sorted(self.tokens))))
        options.append(st.tuples(st.sampled_from(ids), st.sampled_from(GARBAGE_TOKENS)))
        return data.draw(st.lists(st.one_of(options), min_size=1, max_size=3), label="refs")

    async def _dump(self) -> dict[str, Any]:
        """The whole shard in one round trip: every key a script may write, and the names of all keys."""
        k = self.k
        pipe = self.redis.pipeline(transaction=False)
        pipe.keys(f"{k.tag}:*")
        for key in (k.meta, k.jobs, k.payloads, k.counts, k.results):
            pipe.hgetall(key)
        for key in (k.delayed, k.leased, *self.ready_keys):
            pipe.zrange(key, 0, -1, withscores=True)
        pipe.get(k.seq)
        results = iter(await pipe.execute())
        out: dict[str, Any] = {"keys": sorted(key.decode() for key in next(results))}
        for key in (k.meta, k.jobs, k.payloads, k.counts, k.results):
            out[key] = next(results)
        for key in (k.delayed, k.leased, *self.ready_keys):
            out[key] = [(member, int(score)) for member, score in next(results)]
        out[k.seq] = next(results)
        return out

    def dump(self) -> dict[str, Any]:
        return self.run(self._dump())

    # -- setup ----------------------------------------------------------------------------------

    @initialize(policy=POLICIES)
    def choose_policy(self, policy: RetryPolicy) -> None:
        self.policy = policy

    # -- enqueue and promotion --------------------------------------------------------------------

    @rule(data=st.data())
    def enqueue(self, data: st.DataObject) -> None:
        specs = data.draw(st.lists(JOB_SPECS, min_size=1, max_size=4), label="specs")
        for i in range(1, len(specs)):
            if data.draw(st.booleans(), label="alike the previous"):  # same kind, its own payload
                specs[i] = (*specs[i - 1][:6], specs[i][6])
        batch: list[NewJob] = []
        expected: list[int] = []
        new_jobs: dict[str, MJob] = {}
        records: dict[tuple[object, ...], JobRecord] = {}  # jobs alike share one record, as ingest's do
        for spec in specs:
            job_type, prio, offset, max_attempts, ttl, idem, payload = spec
            known = sorted(self.jobs) + sorted(new_jobs)
            # A push that arrives after its job was cancelled (enqueues are acknowledged at commit).
            late = sorted(self.cancelled_unqueued - self.jobs.keys() - new_jobs.keys())
            reuse = data.draw(st.integers(0, 3), label="reuse")
            if known and reuse == 0:
                job_id = data.draw(st.sampled_from(known), label="existing id")  # must be skipped
            elif late and reuse == 1:
                job_id = data.draw(st.sampled_from(late), label="cancelled before its push")
            else:
                job_id = self.fresh_id()
            run_at = self.now + offset
            record = records.setdefault(spec[:6], self.new_record(spec, DELAYED))
            batch.append(NewJob(job_id, record, payload))
            if job_id in self.jobs or job_id in new_jobs or job_id in self.cancelled_unqueued:
                expected.append(0)  # a note stays: a reconcile's restore of the job may come after
                continue
            j = MJob(job_id, job_type, prio, DELAYED, run_at, self.now, max_attempts, ttl, idem, payload)
            new_jobs[job_id] = j
            if run_at <= self.now:
                self.make_ready(j)
                expected.append(1)
            else:
                expected.append(2)
        got = self.run(self.ws.enqueue(SHARD, self.epoch, self.now, batch))
        assert got == expected
        self.jobs.update(new_jobs)

    @precondition(lambda self: any(j.state is DELAYED for j in self.jobs.values()))
    @rule(limit=st.integers(1, 5))
    def promote_due(self, limit: int) -> None:
        due = sorted((j.run_at, j.id) for j in self.in_state(DELAYED) if j.run_at <= self.now)[:limit]
        for _, job_id in due:
            self.make_ready(self.jobs[job_id])
        got = self.run(self.ws.promote_due(SHARD, self.epoch, self.now, limit))
        assert got == (len(due), self.next_delayed())

    @precondition(lambda self: any(j.state is DELAYED for j in self.jobs.values()))
    @rule(limit=st.integers(1, 5), lookahead=st.integers(0, 300))
    def list_then_promote_at_the_instant(self, limit: int, lookahead: int) -> None:
        """The promoter's way: list the next jobs due (the due ones, else those at the earliest
        run_at within the look-ahead), let the clock reach that instant, promote the list."""
        delayed = sorted((j.run_at, j.id) for j in self.in_state(DELAYED))
        at = self.now if delayed[0][0] <= self.now else delayed[0][0]
        listed = [job_id for run_at, job_id in delayed if run_at <= at][:limit]
        if at > self.now + lookahead:
            listed = []
        due = self.run(self.ws.peek_due(SHARD, self.epoch, self.now, limit, lookahead))
        assert (due.at, due.ids) == (at, listed)
        if not listed:
            return
        self.now = at
        for job_id in listed:
            self.make_ready(self.jobs[job_id])
        got = self.run(self.ws.promote_listed(SHARD, self.epoch, self.now, due))
        assert (got.promoted, got.next_due) == (len(listed), self.next_delayed())

    # -- leases -----------------------------------------------------------------------------------

    @rule(
        job_types=st.lists(st.sampled_from(TYPES), unique=True, min_size=1, max_size=3),
        picks=st.lists(st.sampled_from([0, 1, 2]), min_size=1, max_size=4),
        fallback=st.booleans(),
        empty=st.integers(0, 9),
        holder=st.sampled_from(STREAMS),
    )
    def lease(self, job_types: list[str], picks: list[int], fallback: bool, empty: int, holder: str) -> None:
        if empty == 0:  # now and then a worker with no types, or no credit
            job_types, picks = ([], picks) if picks[0] == 0 else (job_types, [])
        self.lease_jobs(job_types, picks, fallback, holder)

    @precondition(lambda self: any(j.state is READY for j in self.jobs.values()))
    @rule(picks=st.lists(st.sampled_from([0, 1, 2]), min_size=1, max_size=4), holder=st.sampled_from(STREAMS))
    def lease_any_type(self, picks: list[int], holder: str) -> None:
        self.lease_jobs(list(TYPES), picks, True, holder)

    def lease_jobs(
        self, job_types: list[str], picks: list[int], fallback: bool, holder: str = ""
    ) -> list[Grant]:
        """One lease per pick: the oldest ready job of the pick's class among the worker's types.
        An empty class falls back to the highest non-empty class (fallback) or leaves the pick
        unfilled; once every class is empty, this and the remaining picks are unfilled. The leases'
        holder is the worker stream ``holder``."""
        expected: list[Grant] = []
        unfilled: list[Priority] = []
        taken: set[str] = set()
        nonce = f"{len(self.tokens):x}"  # the caller's random part of the tokens, fixed here to predict them

        def oldest(cls: int) -> MJob | None:
            ready = [
                j
                for j in self.in_state(READY)
                if j.type in job_types and int(j.prio) == cls and j.id not in taken
            ]
            return min(ready, key=lambda j: j.ready_seq, default=None)

        for cls in picks:
            j = oldest(cls)
            if j is None and fallback:
                j = next((c for c in map(oldest, range(3)) if c is not None), None)
            if j is None:
                unfilled.append(Priority(cls))
                continue
            taken.add(j.id)
            self.seq += 1
            token = f"{self.epoch}:{self.seq}:{nonce}"
            j.state, j.token, j.deadline, j.holder = LEASED, token, self.now + j.ttl, holder
            j.attempts += 1
            expected.append(
                Grant(
                    id=j.id,
                    token=token,
                    shard=SHARD,
                    priority=j.prio,
                    type=j.type,
                    attempt=j.attempts,
                    max_attempts=j.max_attempts,
                    deadline_ms=j.deadline,
                    lease_ttl_ms=j.ttl,
                    idempotency_key=j.idem,
                    run_at_ms=j.run_at,
                    enqueued_at_ms=j.enqueued_at,
                    payload=j.payload,
                )
            )
        leased = self.run(
            self.ws.lease(
                SHARD, self.epoch, self.now, job_types, picks, fallback=fallback, nonce=nonce, holder=holder
            )
        )
        grants, left = leased.grants, leased.unfilled
        assert grants == expected
        assert left == unfilled, (picks, fallback, left, unfilled)
        for g in grants:
            assert g.run_at_ms <= self.now, f"{g.id} leased at {self.now} before its run_at {g.run_at_ms}"
            assert g.token not in self.tokens, f"token {g.token} issued twice"
            self.tokens[g.token] = g.id
            self.last_token[g.id] = g.token
        return grants

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data())
    def extend(self, data: st.DataObject) -> None:
        """A heartbeat (no holder: the leases' holders stay) or a reclaim by a worker stream, which
        holds the leases from now on."""
        refs = self.draw_refs(data)
        holder = data.draw(st.sampled_from(STREAMS), label="reclaiming stream")
        was_superseded = [token in self.superseded for _, token in refs]
        expected: list[int] = []
        for job_id, token in refs:
            if self.holds(job_id, token):
                j = self.jobs[job_id]
                j.deadline = self.now + j.ttl
                j.holder = holder or j.holder
                expected.append(-j.deadline if j.cancel else j.deadline)
            else:
                expected.append(0)
        self.check_token_call(
            refs, was_superseded, lambda: self.ws.extend(SHARD, self.now, refs, holder), expected, 0
        )

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data(), offset=st.integers(-50, 150))
    def shorten(self, data: st.DataObject, offset: int) -> None:
        """A worker stream ended: of its leases, only those it still holds (or that record no holder)
        end by ``until``; one reclaimed by another stream keeps its deadline."""
        refs = self.draw_refs(data)
        ended = data.draw(st.sampled_from(STREAMS), label="ended stream")
        until = self.now + offset
        n = 0
        for job_id, token in refs:
            if not self.holds(job_id, token):
                continue
            j = self.jobs[job_id]
            if j.holder in ("", ended) and j.deadline > until:
                j.deadline = until
                n += 1
        assert self.run(self.ws.shorten(SHARD, until, ended, refs)) == n

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data())
    def return_unsent(self, data: st.DataObject) -> None:
        """Leases taken back before their worker received them: the job is ready again with the attempt
        uncounted, or cancelled when a cancel asked meanwhile."""
        refs = self.draw_refs(data)
        held = [job_id for job_id, token in refs if self.holds(job_id, token)]
        if held and data.draw(st.booleans(), label="cancelled while unsent"):
            self.cancel_job(held[0])
        was_superseded = [token in self.superseded for _, token in refs]
        leases, expected = [], []
        for job_id, token in refs:
            j = self.jobs.get(job_id)
            leases.append((job_id, token, j.type if j else "alpha", j.prio if j else Priority.DEFAULT))
            if j is None or not self.holds(job_id, token):
                expected.append(None)
                continue
            self.end_lease(j)
            j.deadline = 0
            j.attempts -= 1
            if j.cancel:
                j.state = CANCELLED
            else:
                self.make_ready(j)
            expected.append(Transition(job_id, SHARD, j.state, attempts=j.attempts))
        self.check_token_call(
            refs, was_superseded, lambda: self.ws.return_leases(SHARD, leases), expected, None
        )

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        self.ack_refs(data, self.draw_refs(data))

    def ack_refs(self, data: st.DataObject, refs: list[tuple[str, str]]) -> None:
        was_superseded = [token in self.superseded for _, token in refs]
        # Binary results (not UTF-8 text), empty ones and none at all.
        results = data.draw(
            st.lists(
                st.one_of(st.none(), st.just(b""), st.binary(min_size=1, max_size=24)),
                min_size=len(refs),
                max_size=len(refs),
            ),
            label="results",
        )
        expected: list[Transition | None] = []
        for (job_id, token), result in zip(refs, results, strict=True):
            if self.holds(job_id, token):
                j = self.jobs[job_id]
                self.end_lease(j)  # ack keeps the last deadline in the record
                j.state = SUCCEEDED
                j.result = result or b""
                expected.append(
                    Transition(job_id, SHARD, SUCCEEDED, self.now, j.attempts, j.failures, j.expirations)
                )
            else:
                expected.append(None)
        self.check_token_call(
            refs, was_superseded, lambda: self.ws.ack(SHARD, self.now, refs, results), expected, None
        )

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data())
    def nack(self, data: st.DataObject) -> None:
        self.nack_refs(data, self.draw_refs(data))

    def nack_refs(self, data: st.DataObject, refs: list[tuple[str, str]]) -> None:
        nacks = [
            NackSpec(
                job_id,
                token,
                final_reason=data.draw(
                    st.sampled_from(["", "", "", "not_retryable", "no_handler", "handler_error"]),
                    label="reason",
                ),
                delay_ms=data.draw(st.sampled_from([-1, -1, -1, 0, 7, 40]), label="delay"),
            )
            for job_id, token in refs
        ]
        superseded = [n.token in self.superseded for n in nacks]
        before = self.dump() if not any(self.holds(n.id, n.token) for n in nacks) else None
        got = self.run(self.ws.retry(SHARD, self.now, nacks, self.policy))
        assert len(got) == len(nacks)
        for n, result, was_superseded in zip(nacks, got, superseded, strict=True):
            if was_superseded:
                assert result is None, f"superseded token {n.token} accepted by retry"
            if not self.holds(n.id, n.token):
                assert result is None, (n, result)
                continue
            j = self.jobs[n.id]
            j.failures += 1
            outcome = self.decide(j, n.final_reason or str(DeadReason.HANDLER_ERROR), n.delay_ms)
            expected = Transition(
                n.id, SHARD, outcome.state, outcome.lo, j.attempts, j.failures, j.expirations, outcome.reason
            )
            assert result is not None, (n, expected)
            self.apply_outcome(j, outcome, result, expected)
        if before is not None:
            assert self.dump() == before, "a retry with only stale tokens changed Redis"

    @precondition(lambda self: bool(self.jobs))
    @rule(
        data=st.data(),
        picks=st.lists(st.sampled_from([0, 1, 2]), min_size=1, max_size=3),
        fallback=st.booleans(),
    )
    def worker_round(self, data: st.DataObject, picks: list[int], fallback: bool) -> None:
        """A dispatcher tick and a worker's answers in one step: reap, promote, lease, then ack, nack
        or keep each grant. (The same checked operations as the single rules; it only makes long
        lifecycles, retries up to dead-lettering, likely within the step budget.)"""
        self.reap(5)
        self.promote_due(5)
        grants = self.lease_jobs(list(TYPES), picks, fallback)
        answers = [
            data.draw(st.sampled_from(["ack", "nack", "nack", "keep"]), label="answer") for _ in grants
        ]
        acks = [(g.id, g.token) for g, a in zip(grants, answers, strict=True) if a == "ack"]
        nacks = [(g.id, g.token) for g, a in zip(grants, answers, strict=True) if a == "nack"]
        if acks:
            self.ack_refs(data, acks)
        if nacks:
            self.nack_refs(data, nacks)

    def check_token_call(
        self,
        refs: list[tuple[str, str]],
        was_superseded: list[bool],
        call: Any,
        expected: list[Any],
        rejected: Any,
    ) -> None:
        """Run a token-checked call and compare with the model. Independently of the model, a token
        superseded before the call is rejected, and a call the model says rejects every ref leaves
        Redis byte-for-byte unchanged."""
        before = self.dump() if all(e == rejected for e in expected) else None
        got = self.run(call())
        assert got == expected, (refs, got, expected)
        for (_, token), result, stale in zip(refs, got, was_superseded, strict=True):
            if stale:
                assert result == rejected, f"superseded token {token} accepted"
        if before is not None:
            assert self.dump() == before, f"a call with only stale tokens changed Redis: {refs}"

    @precondition(lambda self: any(j.state is LEASED for j in self.jobs.values()))
    @rule(limit=st.integers(1, 5))
    def reap(self, limit: int) -> None:
        expired = sorted((j.deadline, j.id) for j in self.in_state(LEASED) if j.deadline <= self.now)[:limit]
        predicted: list[tuple[MJob, Outcome, Transition]] = []
        for _, job_id in expired:
            j = self.jobs[job_id]
            j.expirations += 1
            outcome = self.decide(j, str(DeadReason.LEASE_EXPIRED), -1)
            reason = str(DeadReason.LEASE_EXPIRED) if outcome.state is DEAD else ""
            predicted.append(
                (
                    j,
                    outcome,
                    Transition(
                        job_id,
                        SHARD,
                        outcome.state,
                        outcome.lo,
                        j.attempts,
                        j.failures,
                        j.expirations,
                        reason,
                    ),
                )
            )
        transitions, next_deadline = self.run(self.ws.reap(SHARD, self.epoch, self.now, limit, self.policy))
        assert [t.id for t in transitions] == [j.id for j, _, _ in predicted]
        for (j, outcome, expected), got in zip(predicted, transitions, strict=True):
            self.apply_outcome(j, outcome, got, expected)
        assert next_deadline == self.next_deadline()

    # -- cancel, restore, forget ------------------------------------------------------------------

    @precondition(lambda self: bool(self.jobs))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        candidates = sorted(self.jobs) + sorted(self.forgotten) + ["ghost-0"]
        self.cancel_job(data.draw(st.sampled_from(candidates), label="cancel id"))

    def cancel_job(self, job_id: str) -> None:
        j = self.jobs.get(job_id)
        if j is None:
            job_type, prio, expected = "alpha", Priority.DEFAULT, CancelOutcome(0, "", "")
            self.cancelled_unqueued.add(job_id)
        else:
            job_type, prio = j.type, j.prio
            if j.state in (DELAYED, READY):
                j.state = CANCELLED
                expected = CancelOutcome(1, "cancelled", "")
            elif j.state is LEASED:
                j.cancel = True
                expected = CancelOutcome(2, "leased", j.token)
            else:
                expected = CancelOutcome(3, str(j.state), "")
        assert self.run(self.ws.cancel(SHARD, job_id, job_type, prio, self.now)) == expected

    @precondition(lambda self: any(j.state is DEAD for j in self.jobs.values()))
    @rule(
        data=st.data(),
        offset=st.integers(0, 100),
        max_attempts=st.integers(1, 4),
        payload=st.binary(max_size=4),
    )
    def requeue_dead(self, data: st.DataObject, offset: int, max_attempts: int, payload: bytes) -> None:
        dead = [j.id for j in self.in_state(DEAD)]
        ids = data.draw(st.lists(st.sampled_from(dead), min_size=1, max_size=2, unique=True), label="dead")
        others = [j.id for j in self.jobs.values() if j.state is not DEAD]
        if len(others) > 0 and data.draw(st.booleans(), label="with a live one"):
            ids.append(data.draw(st.sampled_from(sorted(others)), label="live id"))  # must be left alone
        batch = []
        for job_id in ids:
            j = self.jobs[job_id]
            # As the DB hands it back: counters reset, the state it had (restore ignores it).
            record = JobRecord(
                type=j.type,
                priority=j.prio,
                state=j.state,
                run_at_ms=self.now + offset,
                enqueued_at_ms=j.enqueued_at,
                max_attempts=max_attempts,
                lease_ttl_ms=j.ttl,
                idempotency_key=j.idem,
            )
            batch.append(NewJob(job_id, record, payload))
        n = 0
        for job_id in ids:
            j = self.jobs[job_id]
            if j.state is DEAD:
                n += 1
                self.jobs[job_id] = MJob(
                    job_id,
                    j.type,
                    j.prio,
                    DELAYED,
                    self.now + offset,
                    j.enqueued_at,
                    max_attempts,
                    j.ttl,
                    j.idem,
                    payload,
                )
        assert self.run(self.ws.restore(SHARD, self.epoch, "requeue", batch)) == Restored(n, 0)

    @rule(data=st.data(), spec=JOB_SPECS)
    def restore_missing(self, data: st.DataObject, spec: tuple[Any, ...]) -> None:
        """Reconciliation after data loss: only ids Redis does not know are put back (as delayed), and
        not one cancelled while Redis did not know it (its row was read before the cancel)."""
        job_type, prio, offset, max_attempts, ttl, idem, payload = spec
        noted = sorted(self.cancelled_unqueued - self.jobs.keys())
        pool = sorted(self.forgotten) + noted + [self.fresh_id()]
        ids = [data.draw(st.sampled_from(pool), label="missing id")]
        if len(self.jobs) > 0 and data.draw(st.booleans(), label="with a known one"):
            ids.append(data.draw(st.sampled_from(sorted(self.jobs)), label="known id"))  # must be left alone
        run_at = self.now + offset
        batch = [NewJob(job_id, self.new_record(spec, READY), payload) for job_id in ids]
        noted = ids[0] in self.unpushed
        self.unpushed.difference_update(ids)  # each is in Redis now, or cancelled
        if ids[0] in self.cancelled_unqueued:
            assert self.run(self.ws.restore(SHARD, self.epoch, "restore", batch)) == Restored()
            return
        self.jobs[ids[0]] = MJob(
            ids[0], job_type, prio, DELAYED, run_at, self.now, max_attempts, ttl, idem, payload
        )
        self.forgotten.discard(ids[0])
        expected = Restored(unpushed=1) if noted else Restored(lost=1)
        assert self.run(self.ws.restore(SHARD, self.epoch, "restore", batch)) == expected

    @rule(data=st.data())
    def note_unpushed(self, data: st.DataObject) -> None:
        """A push of committed jobs failed: their ids are noted for the reconcile that restores them
        (a job may be noted and in Redis after all: a hand-off that timed out yet arrived)."""
        pool = sorted(self.forgotten) + sorted(self.jobs) + [self.fresh_id()]
        ids = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3, unique=True), label="ids")
        self.run(self.ws.note_unpushed(SHARD, ids, self.now))
        self.unpushed.update(ids)

    @precondition(lambda self: bool(self.jobs))
    @rule(data=st.data())
    def forget(self, data: st.DataObject) -> None:
        candidates = sorted(self.jobs) + sorted(self.forgotten) + ["ghost-0"]
        ids = data.draw(
            st.lists(st.sampled_from(candidates), min_size=1, max_size=3, unique=True), label="ids"
        )
        finished = [
            (job_id, self.jobs[job_id].record(), self.jobs[job_id].result or None)
            for job_id in ids
            if job_id in self.jobs and self.jobs[job_id].state in TERMINAL
        ]
        assert self.run(self.ws.finished(SHARD, ids)) == finished
        n = 0
        for job_id in ids:
            j = self.jobs.get(job_id)
            if j is not None and j.state in TERMINAL:
                del self.jobs[job_id]
                self.forgotten.add(job_id)
                n += 1
        assert self.run(self.ws.forget(SHARD, ids)) == n
        missing = {i: i in self.unpushed for i in ids if i not in self.jobs}
        assert self.run(self.ws.missing(SHARD, ids)) == missing

    # -- clock and fencing ------------------------------------------------------------------------

    @rule(ms=st.integers(1, 250))
    def advance_clock(self, ms: int) -> None:
        self.now += ms

    @precondition(
        lambda self: any(
            (j.state is DELAYED and j.run_at > self.now) or (j.state is LEASED and j.deadline > self.now)
            for j in self.jobs.values()
        )
    )
    @rule()
    def advance_clock_to_next_event(self) -> None:
        """Land exactly on a run_at or deadline: the <= boundaries of promote and reap."""
        events = [j.run_at for j in self.in_state(DELAYED)] + [j.deadline for j in self.in_state(LEASED)]
        self.now = min(e for e in events if e > self.now)

    @rule(data=st.data(), step=st.integers(1, 3))
    def take_over_with_higher_epoch(self, data: st.DataObject, step: int) -> None:
        """A new owner fences the old one out; an epoch not above the current one is refused."""
        refused = data.draw(st.integers(0, self.epoch), label="not newer epoch")
        before = self.dump()
        with pytest.raises(NotOwner):
            self.run(self.ws.acquire(SHARD, refused, "usurper", self.now, self.now))
        assert self.dump() == before, "a refused acquire changed Redis"
        self.stale_epochs.append(self.epoch)
        self.epoch += step
        assert self.run(self.ws.acquire(SHARD, self.epoch, f"owner-{self.epoch}", self.now, self.now)) == 0

    @precondition(lambda self: bool(self.stale_epochs))
    @rule(
        data=st.data(), op=st.sampled_from(["enqueue", "promote", "lease", "reap", "restore"]), spec=JOB_SPECS
    )
    def stale_epoch_is_fenced(self, data: st.DataObject, op: str, spec: tuple[Any, ...]) -> None:
        old = data.draw(st.sampled_from(self.stale_epochs), label="stale epoch")
        ghost = NewJob("fenced-out", self.new_record(spec, DELAYED), spec[-1])
        calls: dict[str, Any] = {
            "enqueue": lambda: self.ws.enqueue(SHARD, old, self.now, [ghost]),
            "promote": lambda: self.ws.promote_due(SHARD, old, self.now, 5),
            "lease": lambda: self.ws.lease(SHARD, old, self.now, list(TYPES), [0, 1, 2, 2], fallback=True),
            "reap": lambda: self.ws.reap(SHARD, old, self.now, 5, self.policy),
            "restore": lambda: self.ws.restore(SHARD, old, "restore", [ghost]),
        }
        before = self.dump()
        try:
            result = self.run(calls[op]())
        except NotOwner:
            pass
        else:
            raise AssertionError(f"{op} with stale epoch {old} did not raise NotOwner: {result}")
        assert self.dump() == before, f"{op} with stale epoch {old} changed Redis"

    # -- invariants -------------------------------------------------------------------------------

    @invariant()
    def redis_matches_model(self) -> None:
        k = self.k
        dump = self.dump()
        ready_keys = self.ready_keys
        # Nothing is kept per job type beyond its jobs' records, sets and counts: a set of every type
        # ever enqueued (read by nothing) grew with each new type name for the life of the shard.
        allowed = {k.meta, k.jobs, k.payloads, k.delayed, k.leased, k.counts, k.seq, k.results}
        allowed.update(ready_keys)
        allowed.update((k.cancelled_unqueued, k.unpushed))
        assert set(dump["keys"]) <= allowed, f"stray keys: {set(dump['keys']) - allowed}"
        noted = self.run(self.redis.zrange(k.cancelled_unqueued, 0, -1))
        assert {n.decode() for n in noted} == self.cancelled_unqueued
        unpushed = self.run(self.redis.zrange(k.unpushed, 0, -1))
        assert {n.decode() for n in unpushed} == self.unpushed

        records = {i.decode(): JobRecord.unpack(raw) for i, raw in dump[k.jobs].items()}
        raw_records = {i.decode(): raw for i, raw in dump[k.jobs].items()}
        assert set(records) == set(self.jobs), "job records lost or invented"

        # Where each job sits: (state, ready key or None, score) per zset membership.
        where: dict[str, list[tuple[JobState, str | None, int]]] = {}
        for member, score in dump[k.delayed]:
            where.setdefault(member.decode(), []).append((DELAYED, None, score))
        for member, score in dump[k.leased]:
            where.setdefault(member.decode(), []).append((LEASED, None, score))
        for key, _ in ready_keys.items():
            for member, score in dump[key]:
                where.setdefault(member.decode(), []).append((READY, key, score))
        assert set(where) <= set(records), f"zset members without a record: {set(where) - set(records)}"

        real_counts: Counter[tuple[str, int, str]] = Counter()
        for job_id, rec in records.items():
            j = self.jobs[job_id]
            assert rec == j.record(), f"{job_id}: redis {rec} != model {j.record()}"
            places = where.get(job_id, [])
            if rec.state in ACTIVE:
                # No job lost: exactly one place, the one its record's state names.
                assert len(places) == 1, f"{job_id} ({rec.state}) is in {places}"
                state, ready_key, score = places[0]
                assert state is rec.state, f"{job_id}: record says {rec.state}, zset says {state}"
                if state is DELAYED:
                    assert score == rec.run_at_ms
                elif state is LEASED:
                    assert score == rec.deadline_ms and rec.token, job_id
                else:
                    assert ready_key == k.ready(rec.type, rec.priority), (job_id, ready_key)
                    assert score == j.ready_seq, (job_id, score, j.ready_seq)
                real_counts[(rec.type, int(rec.priority), str(state))] += 1
            else:
                assert not places, f"terminal {job_id} ({rec.state}) still in {places}"
                # Terminal states stay terminal: the record never changes again (a requeue resets it).
                if j.frozen is None:
                    j.frozen = raw_records[job_id]
                assert raw_records[job_id] == j.frozen, f"terminal {job_id} changed: {rec}"
            # Never two valid leases: only the last token issued can be held.
            if rec.state is LEASED:
                assert rec.token == self.last_token[job_id] and self.tokens[rec.token] == job_id
                assert rec.token not in self.superseded
            else:
                assert rec.token == "", f"{job_id} ({rec.state}) still holds token {rec.token}"
            # Attempts bounded by max_attempts; a job that reached it is dead (cancelled if flagged).
            spent = rec.failures + (rec.expirations if self.policy.count_expirations else 0)
            assert spent <= rec.max_attempts, f"{job_id}: {spent} attempts spent of {rec.max_attempts}"
            if spent >= rec.max_attempts:
                assert rec.state in (DEAD, CANCELLED), f"{job_id} out of attempts but {rec.state}"
            in_lease = 1 if rec.state in (LEASED, SUCCEEDED) else 0
            assert rec.attempts == rec.failures + rec.expirations + in_lease, f"{job_id}: {rec}"

        # The counts hash equals the real set cardinalities per (type, class, state), and the model.
        counts: dict[tuple[str, int, str], int] = {}
        for raw_field, value in dump[k.counts].items():
            job_type, cls, state_name = raw_field.decode().rsplit("|", 2)
            counts[(job_type, int(cls), state_name)] = int(value)
        assert all(v > 0 for v in counts.values()), f"non-positive counts: {counts}"
        assert counts == dict(real_counts), f"counts hash {counts} != sets {dict(real_counts)}"
        model_counts = Counter(
            (j.type, int(j.prio), str(j.state)) for j in self.jobs.values() if j.state in ACTIVE
        )
        assert dict(real_counts) == dict(model_counts)
        for key, (t, c) in ready_keys.items():
            assert len(dump[key]) == counts.get((t, int(c), "ready"), 0), key

        # Payloads exactly for active jobs; seq, fencing epoch and types as the model says.
        payloads = {i.decode(): v for i, v in dump[k.payloads].items()}
        assert payloads == {j.id: j.payload for j in self.jobs.values() if j.state in ACTIVE}
        # Results exactly for the succeeded jobs acked with one, until they are forgotten.
        results = {i.decode(): v for i, v in dump[k.results].items()}
        assert results == {j.id: j.result for j in self.jobs.values() if j.result}
        assert all(self.jobs[i].state is SUCCEEDED for i in results)
        assert int(dump[k.seq] or 0) == self.seq
        assert dump[k.meta][b"epoch"] == str(self.epoch).encode()


def test_lua_state_machine(redis_port: int) -> None:
    run_state_machine_as_test(lambda: LuaStateMachine(redis_port), settings=MACHINE_SETTINGS)


# -- pinned bugs ---------------------------------------------------------------------------------


def test_enqueue_counts_a_record_packed_with_a_state(redis_port: int) -> None:
    async def scenario() -> dict[tuple[str, int, str], int]:
        client = aredis.Redis(host="127.0.0.1", port=redis_port)
        try:
            await client.flushall()
            ws = WorkingSet(client)
            await ws.acquire(SHARD, 1, "owner", T0, T0)

            def job(job_id: str, run_at: int) -> NewJob:
                # What dispatcher/queue/ingest.py builds: state=DELAYED for every new job.
                return NewJob(job_id, JobRecord("alpha", Priority.DEFAULT, DELAYED, run_at, T0, 3, 100), b"")

            await ws.enqueue(SHARD, 1, T0, [job("d1", T0 + 50), job("d2", T0 + 50), job("r1", T0)])
            return await ws.counts([SHARD])
        finally:
            await client.aclose()

    loop = asyncio.new_event_loop()
    try:
        counts = loop.run_until_complete(scenario())
    finally:
        loop.close()
    # Two delayed jobs and one ready job; Redis reports delayed 0 (d1 +1, d2 -1 +1, r1 -1) and ready 1.
    assert counts == {("alpha", 1, "delayed"): 2, ("alpha", 1, "ready"): 1}


def test_lua_reads_the_states_and_codes_python_defines(redis_port: int) -> None:
    """The `codes` include, run by Redis, holds the values of the enums in dispatcher/queue/states.py."""
    tables = ["STATE", "REASON", *LUA_CODE_TABLES]
    script = (
        codes_include()
        + "return cjson.encode({"
        + ", ".join(f"{t} = {t}" for t in tables)
        + ", ACTIVE = ACTIVE, TERMINAL = TERMINAL})"
    )

    async def scenario() -> Any:
        client = aredis.Redis(host="127.0.0.1", port=redis_port)
        try:
            return json.loads(await client.eval(script, 0))
        finally:
            await client.aclose()

    loop = asyncio.new_event_loop()
    try:
        lua = loop.run_until_complete(scenario())
    finally:
        loop.close()
    assert lua["STATE"] == {m.name: m.value for m in JobState}
    assert lua["REASON"] == {m.name: m.value for m in DeadReason}
    for table, codes in LUA_CODE_TABLES.items():
        assert lua[table] == {name: int(m) for name, m in codes.__members__.items()}, table
    assert set(lua["ACTIVE"]) == {str(s) for s in ACTIVE}
    assert set(lua["TERMINAL"]) == {str(s) for s in TERMINAL}

"""Stateful property test of flow control in the REAL Lua transitions on a REAL redis-server.

A hypothesis ``RuleBasedStateMachine`` enqueues jobs with and without concurrency keys, leases,
acks, nacks (RateLimited too, with and without a hold), expires, returns and cancels them, and
changes the types' settings (pause, type and per-key concurrency limits, per-key overrides and
weights, rates) between steps, written into the shard's ``flow`` hash as the dispatcher's mirror
writes them. The job records Redis holds are the model of states (test_lua_state_machine.py checks
the transitions themselves); what this machine checks, after every step and at every lease, is what
flow control promises (with the type sweep among the steps: it must change none of this):

* never more running than a limit: a lease never takes a key or a type past its concurrency limit
  (one already over it, after a limit was lowered, gets nothing until it is under again), never
  leases a paused class, and at one instant leases no more of a rate-limited type than its burst;
* slots never leaked: each key's running count in Redis equals its leased records, whatever ended
  their leases;
* no key lost: every ready keyed job is in its key's ready set (and in no other), and every key with
  ready jobs is in its type's round robin, or waits for its rate, or is blocked at its limit with
  leases running (and comes back when one ends or the settings change);
* no key starved: a lease that may take a ready job (its type and key under their limits, nothing
  paused or rate-limited) takes one; and leasing one type with as many picks as it has keys with
  ready jobs in a class and no limit in the way serves every one of those keys.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Coroutine
from typing import Any, TypeVar

import redis.asyncio as aredis
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from dispatcher.config import RetryPolicy
from dispatcher.queue.flow import QueueSettings, Rate
from dispatcher.queue.keys import ShardKeys
from dispatcher.queue.records import JobRecord
from dispatcher.queue.states import ACTIVE, JobState, Priority
from dispatcher.queue.working_set import NackSpec, NewJob, WorkingSet
from tests.support.state_machines import machine_settings

T = TypeVar("T")

SHARD = 5
TYPES = ("alpha", "beta")
KEYS = ("", "k1", "k2", "k3")  # '' is no key
T0 = 1_700_000_000_000
READY, LEASED = JobState.READY, JobState.LEASED

MACHINE_SETTINGS = machine_settings(max_examples=30, steps=50)


def settings_strategy(job_type: str) -> st.SearchStrategy[QueueSettings]:
    return st.builds(
        QueueSettings,
        job_type=st.just(job_type),
        paused=st.frozensets(st.sampled_from(list(Priority)), max_size=2),
        concurrency=st.sampled_from([0, 0, 1, 2, 3]),
        key_concurrency=st.sampled_from([0, 0, 1, 2]),
        key_concurrency_overrides=st.sampled_from([{}, {}, {"k1": 1}, {"k2": 3}]),
        key_weights=st.sampled_from([{}, {}, {"k2": 3}]),
        rate=st.sampled_from([None, None, None, Rate(2.0, 2)]),
        key_rate=st.sampled_from([None, None, None, Rate(1.0, 1)]),
    )


class FlowStateMachine(RuleBasedStateMachine):
    def __init__(self, port: int) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.redis: Any = self.run(self._connect(port))
        self.ws = WorkingSet(self.redis)
        self.k = ShardKeys(SHARD)
        self.now = T0
        self.serial = 0
        self.policy = RetryPolicy(base_ms=10, cap_ms=80)
        self.settings = {t: QueueSettings(t) for t in TYPES}
        self.held: dict[str, str] = {}  # job id -> token of its lease
        self.ids: list[str] = []
        assert self.run(self.ws.acquire(SHARD, 1, "owner", self.now, self.now)) == 1

    async def _connect(self, port: int) -> Any:
        client = aredis.Redis(host="127.0.0.1", port=port)
        await client.flushall()
        return client

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        try:
            self.run(self.redis.aclose())
        finally:
            self.loop.close()

    # -- what Redis holds -----------------------------------------------------------------------

    def records(self) -> dict[str, JobRecord]:
        raw = self.run(self.redis.hgetall(self.k.jobs))
        return {i.decode(): JobRecord.unpack(v) for i, v in raw.items()}

    def leased_by_key(self, recs: dict[str, JobRecord]) -> Counter[tuple[str, str]]:
        return Counter((r.type, r.concurrency_key) for r in recs.values() if r.state is LEASED)

    def key_limit(self, job_type: str, key: str) -> int:
        s = self.settings[job_type]
        return s.key_concurrency_overrides.get(key, s.key_concurrency)

    def gated(self, job_type: str) -> bool:
        """A rate limit or a hold may keep the type or one of its keys waiting."""
        s = self.settings[job_type]
        if s.rate or s.key_rate:
            return True
        times = [self.run(self.redis.zscore(key, job_type)) for key in (self.k.gate, self.k.hold)]
        for key in (self.k.key_gate(job_type), self.k.key_hold(job_type)):
            times += [score for _, score in self.run(self.redis.zrange(key, 0, -1, withscores=True))]
        return any(t is not None and t > self.now for t in times)

    def leasable(self, recs: dict[str, JobRecord], job_types: list[str], classes: set[int]) -> bool:
        """Some ready job of these types and classes may be leased now by the settings' rules."""
        leased = self.leased_by_key(recs)
        for r in recs.values():
            if r.state is not READY or r.type not in job_types or int(r.priority) not in classes:
                continue
            s = self.settings[r.type]
            if r.priority in s.paused or self.gated(r.type):
                continue
            type_leased = sum(n for (t, _), n in leased.items() if t == r.type)
            if s.concurrency and type_leased >= s.concurrency:
                continue
            limit = self.key_limit(r.type, r.concurrency_key) if r.concurrency_key else 0
            if limit and leased[(r.type, r.concurrency_key)] >= limit:
                continue
            return True
        return False

    # -- rules -----------------------------------------------------------------------------------

    @rule(
        specs=st.lists(
            st.tuples(
                st.sampled_from(TYPES),
                st.sampled_from(list(Priority)),
                st.sampled_from(KEYS),
                st.sampled_from([0, 0, 0, 30]),
            ),
            min_size=1,
            max_size=6,
        )
    )
    def enqueue(self, specs: list[tuple[str, Priority, str, int]]) -> None:
        jobs = []
        for job_type, prio, key, delay in specs:
            self.serial += 1
            job_id = f"job-{self.serial:04d}"
            record = JobRecord(
                job_type, prio, READY, self.now + delay, self.now, 3, 1000, concurrency_key=key
            )
            jobs.append(NewJob(job_id, record, b"p"))
            self.ids.append(job_id)
        self.run(self.ws.enqueue(SHARD, 1, self.now, jobs))

    @rule(
        job_type=st.sampled_from(TYPES),
        prio=st.sampled_from(list(Priority)),
        key=st.sampled_from(KEYS),
        n=st.integers(3, 8),
    )
    def enqueue_backlog(self, job_type: str, prio: Priority, key: str, n: int) -> None:
        """A tenant's burst: several ready jobs of one key, which must not crowd the others out."""
        self.enqueue([(job_type, prio, key, 0)] * n)

    @rule(ms=st.sampled_from([1, 10, 40, 400, 1500]))
    def advance_clock_and_promote(self, ms: int) -> None:
        self.now += ms
        self.run(self.ws.promote_due(SHARD, 1, self.now, 1000))

    @rule(job_type=st.sampled_from(TYPES), data=st.data())
    def change_settings(self, job_type: str, data: st.DataObject) -> None:
        s = data.draw(settings_strategy(job_type))
        self.settings[job_type] = s
        self.run(self.redis.hset(self.k.flow, job_type, s.pack()))

    @rule(
        job_types=st.sampled_from([["alpha"], ["beta"], ["alpha", "beta"]]),
        picks=st.lists(st.sampled_from([0, 1, 2]), min_size=1, max_size=6),
        fallback=st.booleans(),
    )
    def lease(self, job_types: list[str], picks: list[int], fallback: bool) -> None:
        before = self.records()
        leased_before = self.leased_by_key(before)
        classes = {0, 1, 2} if fallback else set(picks)
        could = self.leasable(before, job_types, classes)
        fairness = self.fairness_case(before, job_types, picks, fallback)
        got = self.run(self.ws.lease(SHARD, 1, self.now, job_types, picks, fallback=fallback, holder="w"))
        for g in got.grants:
            self.held[g.id] = g.token
        after = self.records()
        leased_after = self.leased_by_key(after)
        per_type = Counter(g.type for g in got.grants)
        for g in got.grants:
            s = self.settings[g.type]
            assert g.priority not in s.paused, f"{g.id} leased from a paused class {g.priority.name}"
            assert before[g.id].concurrency_key == g.concurrency_key
        for job_type in job_types:
            s = self.settings[job_type]
            now_running = sum(n for (t, _), n in leased_after.items() if t == job_type)
            was_running = sum(n for (t, _), n in leased_before.items() if t == job_type)
            if s.concurrency:
                assert now_running <= max(s.concurrency, was_running), (
                    f"{job_type}: {now_running} running over its limit {s.concurrency}"
                )
            if s.rate and per_type[job_type]:
                assert per_type[job_type] <= s.rate.burst, (
                    f"{job_type}: {per_type[job_type]} leases at one instant"
                )
        for (job_type, key), n in leased_after.items():
            limit = self.key_limit(job_type, key) if key else 0
            if limit and n > leased_before[(job_type, key)]:
                assert n <= limit, f"{job_type}/{key}: {n} running over its limit {limit}"
            if key and self.settings[job_type].key_rate:
                assert n - leased_before[(job_type, key)] <= self.settings[job_type].key_rate.burst
        if could:
            assert got.grants, f"nothing leased though a job could be ({job_types}, picks {picks})"
        if fairness is not None:
            served = {g.concurrency_key for g in got.grants}
            assert fairness <= served, f"keys {sorted(fairness - served)} not served in one round of {picks}"

    @rule(job_type=st.sampled_from(TYPES), cls=st.sampled_from([0, 1, 2]))
    def lease_one_round(self, job_type: str, cls: int) -> None:
        """As many picks of one class as the type has keys with ready jobs in it: one turn each."""
        recs = self.records()
        keys = {
            r.concurrency_key
            for r in recs.values()
            if r.state is READY and r.type == job_type and r.priority == cls
        }
        self.lease([job_type], [cls] * max(1, len(keys)), fallback=False)

    def fairness_case(
        self, recs: dict[str, JobRecord], job_types: list[str], picks: list[int], fallback: bool
    ) -> set[str] | None:
        """The keys one lease must serve: one type, one class, no limit or gate in the way, no
        weights, as many picks as keys with ready jobs (None: not such a case)."""
        if len(job_types) != 1 or len(set(picks)) != 1 or fallback:
            return None
        job_type, cls = job_types[0], picks[0]
        s = self.settings[job_type]
        if s != QueueSettings(job_type) or self.gated(job_type):
            return None
        keys = {
            r.concurrency_key
            for r in recs.values()
            if r.state is READY and r.type == job_type and r.priority == cls
        }
        if not keys or len(picks) < len(keys):
            return None
        return keys

    def pick_held(self, data: st.DataObject) -> list[tuple[str, str]]:
        ids = data.draw(st.lists(st.sampled_from(sorted(self.held)), min_size=1, max_size=3, unique=True))
        return [(i, self.held.pop(i)) for i in ids]

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        self.run(self.ws.ack(SHARD, self.now, self.pick_held(data)))

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data(), how=st.sampled_from(["fail", "rate_limited", "hold"]))
    def nack(self, data: st.DataObject, how: str) -> None:
        refs = self.pick_held(data)
        before = self.records()
        nacks = [
            NackSpec(
                i,
                t,
                delay_ms=25 if how != "fail" else -1,
                rate_limited=how != "fail",
                hold_siblings=how == "hold",
            )
            for i, t in refs
        ]
        out = self.run(self.ws.retry(SHARD, self.now, nacks, self.policy, steady_now=self.now))
        for (job_id, _), t in zip(refs, out, strict=True):
            assert t is not None
            if how != "fail":
                assert t.attempts == before[job_id].attempts - 1, "a rate-limited attempt was charged"
                assert t.failures == before[job_id].failures
                assert t.rate_limited == before[job_id].rate_limited + 1

    @precondition(lambda self: bool(self.held))
    @rule()
    def expire_every_lease(self) -> None:
        self.now += 1001
        self.run(self.ws.reap(SHARD, 1, self.now, 1000, self.policy))
        self.held.clear()

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data())
    def return_unsent(self, data: st.DataObject) -> None:
        refs = self.pick_held(data)
        recs = self.records()
        self.run(self.ws.return_leases(SHARD, [(i, t, recs[i].type, recs[i].priority) for i, t in refs]))

    @precondition(lambda self: bool(self.ids))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(self.ids))
        rec = self.records().get(job_id)
        if rec is not None:
            self.run(self.ws.cancel(SHARD, job_id, rec.type, rec.priority, self.now))

    @rule()
    def sweep_types(self) -> None:
        """The type sweep (forget_types.lua) as if the database had no row of either type: it may
        forget only a type with no active job and no settings in Redis, and the invariants and every
        later lease must hold as if it had not run."""
        forgotten = self.run(self.ws.forget_types(SHARD, list(TYPES), [], self.now))
        recs = self.records()
        for job_type in forgotten:
            assert not self.run(self.redis.hexists(self.k.flow, job_type)), (
                f"{job_type} forgotten with settings"
            )
            active = [i for i, r in recs.items() if r.type == job_type and r.state in ACTIVE]
            assert not active, f"{job_type} forgotten with active jobs {active}"

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    def slots_are_never_leaked(self) -> None:
        recs = self.records()
        leased = self.leased_by_key(recs)
        for job_type in TYPES:
            running = {
                k.decode(): int(v)
                for k, v in self.run(self.redis.hgetall(self.k.key_running(job_type))).items()
            }
            expected = {key: n for (t, key), n in leased.items() if t == job_type and key}
            assert running == expected, f"{job_type}: running per key {running}, leased records {expected}"

    @invariant()
    def no_key_is_lost(self) -> None:
        recs = self.records()
        leased = self.leased_by_key(recs)
        for job_id, r in recs.items():
            if r.state is not READY:
                continue
            plain = self.run(self.redis.zscore(self.k.ready(r.type, r.priority), job_id))
            if not r.concurrency_key:
                assert plain is not None, f"{job_id} ready but in no ready set"
                continue
            key = r.concurrency_key
            assert plain is None, f"keyed {job_id} in its type's ready set"
            assert (
                self.run(self.redis.zscore(self.k.key_ready(r.type, r.priority, key), job_id)) is not None
            ), f"{job_id} ready but not in its key's set"
            in_round = self.run(self.redis.zscore(self.k.eligible_keys(r.type, r.priority), key)) is not None
            waiting = self.run(self.redis.zscore(self.k.waiting_keys(r.type, r.priority), key)) is not None
            classes = int(self.run(self.redis.hget(self.k.blocked_keys(r.type), key)) or 0)
            blocked = bool(classes & (1 << int(r.priority)))
            if blocked:
                assert leased[(r.type, key)] > 0, f"key {key} of {r.type} blocked with nothing running"
            assert in_round or waiting or blocked, (
                f"key {key} of {r.type} has ready {job_id} but left the round"
            )


def test_flow_state_machine(redis_port: int) -> None:
    run_state_machine_as_test(lambda: FlowStateMachine(redis_port), settings=MACHINE_SETTINGS)


# -- pinned defects (found in review; each failed before its fix) ------------------------------------


_pinned_serial = iter(range(1, 1_000_000))


def _job(job_type: str, prio: int, key: str = "") -> NewJob:
    record = JobRecord(job_type, Priority(prio), READY, T0, T0, 3, 60_000, concurrency_key=key)
    return NewJob(f"pin-{next(_pinned_serial):05d}", record, b"p")


def _pinned(redis_port: int, scenario: Any) -> Any:
    async def run() -> Any:
        client = aredis.Redis(host="127.0.0.1", port=redis_port)
        try:
            await client.flushall()
            ws = WorkingSet(client)
            await ws.acquire(SHARD, 1, "owner", T0, T0 + 10**9)
            return await scenario(client, ws, ShardKeys(SHARD))
        finally:
            await client.aclose()

    return asyncio.run(run())


def test_a_key_weighed_in_one_class_is_weighed_again_after_a_lease_in_another(redis_port: int) -> None:
    """A key's candidate cached for class 0 (another type's job was older) must not be leased after
    the same call leased the key in class 1 up to its limit of 1."""

    async def scenario(client: Any, ws: WorkingSet, k: ShardKeys) -> dict[bytes, bytes]:
        await client.hset(k.flow, "alpha", QueueSettings("alpha", key_concurrency=1).pack())
        await ws.enqueue(SHARD, 1, T0, [_job("beta", 0)])
        await ws.enqueue(SHARD, 1, T0, [_job("alpha", 0, "k1")])
        await ws.enqueue(SHARD, 1, T0, [_job("alpha", 1, "k1")])
        await ws.lease(SHARD, 1, T0, ["alpha", "beta"], [0, 1, 0], fallback=False, holder="w")
        return await client.hgetall(k.key_running("alpha"))

    assert _pinned(redis_port, scenario) == {b"k1": b"1"}


def test_a_changed_rate_holds_from_the_next_lease(redis_port: int) -> None:
    """A type leased under 0.001/s, then raised to 1000/s burst 3, then no rate at all: each change
    holds at once, not after the old rate's next token (1,000 s away). The raised rate starts with
    an empty bucket (one lease now, the next a millisecond later)."""

    async def scenario(client: Any, ws: WorkingSet, k: ShardKeys) -> list[int]:
        await client.hset(k.flow, "alpha", QueueSettings("alpha", rate=Rate(0.001, 1)).pack())
        await ws.enqueue(SHARD, 1, T0, [_job("alpha", 1) for _ in range(9)])
        leased = [len((await ws.lease(SHARD, 1, T0, ["alpha"], [1], holder="w")).grants)]
        await client.hset(k.flow, "alpha", QueueSettings("alpha", rate=Rate(1000.0, 3)).pack())
        leased.append(len((await ws.lease(SHARD, 1, T0 + 5000, ["alpha"], [1] * 5, holder="w")).grants))
        await client.hdel(k.flow, "alpha")
        leased.append(len((await ws.lease(SHARD, 1, T0 + 5000, ["alpha"], [1] * 5, holder="w")).grants))
        return leased

    assert _pinned(redis_port, scenario) == [1, 1, 5]


def test_a_returned_lease_keeps_its_place_in_its_keys_order(redis_port: int) -> None:
    """An ordering key (limit 1): j1 leased, its lease returned unsent, then j1 runs first still."""

    async def scenario(client: Any, ws: WorkingSet, k: ShardKeys) -> list[str]:
        await client.hset(k.flow, "alpha", QueueSettings("alpha", key_concurrency=1).pack())
        jobs = [_job("alpha", 1, "order-7") for _ in range(3)]
        await ws.enqueue(SHARD, 1, T0, jobs)
        (first,) = (await ws.lease(SHARD, 1, T0, ["alpha"], [1], holder="w")).grants
        await ws.return_leases(SHARD, [(first.id, first.token, "alpha", Priority(1))])
        order = []
        for _ in jobs:
            (grant,) = (await ws.lease(SHARD, 1, T0, ["alpha"], [1], holder="w")).grants
            order.append(grant.id)
            await ws.ack(SHARD, T0, [(grant.id, grant.token)])
        return order == [j.id for j in jobs] or order

    assert _pinned(redis_port, scenario) is True


def test_gates_of_keys_are_forgotten_once_past(redis_port: int) -> None:
    """10,000 one-job keys under a per-key rate: once their gates are past, a lease drops them (the
    gates would otherwise grow with every key ever seen)."""

    async def scenario(client: Any, ws: WorkingSet, k: ShardKeys) -> tuple[int, int]:
        await client.hset(k.flow, "alpha", QueueSettings("alpha", key_rate=Rate(1.0, 1)).pack())
        await ws.enqueue(SHARD, 1, T0, [_job("alpha", 1, f"key-{i}") for i in range(10_000)])
        leased = 0
        while leased < 10_000:
            leased += len((await ws.lease(SHARD, 1, T0, ["alpha"], [1] * 64, holder="w")).grants)
        during = await client.zcard(k.key_gate("alpha"))
        await ws.enqueue(SHARD, 1, T0 + 2000, [_job("alpha", 1, "late")])
        await ws.lease(SHARD, 1, T0 + 2000, ["alpha"], [1], holder="w")
        return during, await client.zcard(k.key_gate("alpha"))

    assert _pinned(redis_port, scenario) == (10_000, 1)

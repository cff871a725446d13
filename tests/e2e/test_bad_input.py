"""Bad input, end to end: every malformed request is refused with INVALID_ARGUMENT naming the field,
and nothing is written (not to Redis, not to the DB). Real dispatcher processes, raw gRPC stubs (the
Python client validates some fields itself), raw worker streams, raw TCP garbage, and dispatcherctl."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import redis

from dispatcher.queue.records import JobRecord
from dispatcher.queue.states import JobState, Priority
from shardq_common.pb import shardq_pb2 as pb
from shardq_common.pb import shardq_pb2_grpc as pb_grpc
from tests.support.processes import ROOT, read_ledger
from tests.support.snapshots import count_jobs, db_digest, db_status, redis_digest
from tests.support.wait import wait_until
from worker_sdk import Client

MiB = 1 << 20
DAY_MS = 24 * 3600 * 1000
CENTURY_MS = 100 * 365 * DAY_MS


# -- helpers ------------------------------------------------------------------------------------


def spec(job_type: str = "noop", **fields: Any) -> pb.JobSpec:
    return pb.JobSpec(type=job_type, **fields)


def enqueue(**fields: Any) -> tuple[str, Any]:
    return "Enqueue", pb.EnqueueRequest(job=spec(**fields))


def batch_with_bad_fifth(**bad: Any) -> tuple[str, Any]:
    jobs = [spec(payload=b'{"i": %d}' % i) for i in range(10)]
    jobs[5] = spec(**bad)
    return "EnqueueMany", pb.EnqueueManyRequest(jobs=jobs)


# (description, (method, request), substrings the details must contain)
JOB_SERVICE_CASES: list[tuple[str, tuple[str, Any], tuple[str, ...]]] = [
    ("empty type", enqueue(job_type=""), ("type",)),
    ("201-character type", enqueue(job_type="a" * 201), ("type",)),
    ("type with a space", enqueue(job_type="bad type"), ("type",)),
    ("type with a leading space", enqueue(job_type=" noop"), ("type",)),
    ("type with a trailing newline", enqueue(job_type="noop\n"), ("type",)),
    ("type with a NUL", enqueue(job_type="no\x00op"), ("type",)),
    ("type with a tab", enqueue(job_type="no\top"), ("type",)),
    ("type with a C1 control (NEL)", enqueue(job_type="no\u0085op"), ("type",)),
    ("type with a bidi override", enqueue(job_type="no\u202eop"), ("type",)),
    ("type with a non-ASCII letter", enqueue(job_type="n\u00f6op"), ("type",)),
    ("type starting with punctuation", enqueue(job_type="-noop"), ("type",)),
    ("unknown priority 7", enqueue(priority=7), ("priority",)),
    ("unknown priority -1", enqueue(priority=-1), ("priority",)),
    ("max_attempts 0", enqueue(max_attempts=0), ("max_attempts",)),
    ("max_attempts 1001", enqueue(max_attempts=1001), ("max_attempts",)),
    ("lease_ttl_ms 0", enqueue(lease_ttl_ms=0), ("lease_ttl_ms",)),
    ("lease_ttl_ms 50", enqueue(lease_ttl_ms=50), ("lease_ttl_ms",)),
    ("lease_ttl_ms over 24 h", enqueue(lease_ttl_ms=DAY_MS + 1), ("lease_ttl_ms",)),
    ("both delay and run_at", enqueue(delay_ms=1000, run_at_ms=2_000_000_000_000), ("run_at", "delay")),
    ("negative delay", enqueue(delay_ms=-1), ("delay",)),
    ("delay over a century", enqueue(delay_ms=CENTURY_MS + 1), ("delay",)),
    ("run_at_ms 0", enqueue(run_at_ms=0), ("run_at",)),
    ("negative run_at_ms", enqueue(run_at_ms=-5), ("run_at",)),
    ("run_at_ms more than 100 years ahead", enqueue(run_at_ms=2_000_000_000_000 + CENTURY_MS), ("run_at",)),
    ("payload of 1 MiB + 1 byte", enqueue(payload=b"x" * (MiB + 1)), ("payload",)),
    ("201-character idempotency key", enqueue(idempotency_key="k" * 201), ("idempotency_key",)),
    ("EnqueueMany with no jobs", ("EnqueueMany", pb.EnqueueManyRequest(jobs=[])), ("jobs",)),
    (
        "EnqueueMany with 10,001 jobs",
        ("EnqueueMany", pb.EnqueueManyRequest(jobs=[spec() for _ in range(10_001)])),
        ("jobs",),
    ),
    ("EnqueueMany, jobs[5] has an empty type", batch_with_bad_fifth(job_type=""), ("jobs[5]", "type")),
    (
        "EnqueueMany, jobs[5] has lease_ttl_ms 0",
        batch_with_bad_fifth(lease_ttl_ms=0),
        ("jobs[5]", "lease_ttl_ms"),
    ),
    (
        "EnqueueMany, jobs[5] has an oversized payload",
        batch_with_bad_fifth(payload=b"x" * (MiB + 1)),
        ("jobs[5]", "payload"),
    ),
    ("GetJob with an empty id", ("GetJob", pb.GetJobRequest(job_id="")), ("job_id",)),
    ("GetJob with a 65-character id", ("GetJob", pb.GetJobRequest(job_id="a" * 65)), ("job_id",)),
    ("GetJob with a control character in the id", ("GetJob", pb.GetJobRequest(job_id="ab\ncd")), ("job_id",)),
    ("CancelJob with an empty id", ("CancelJob", pb.CancelJobRequest(job_id="")), ("job_id",)),
    ("CancelJob with a 65-character id", ("CancelJob", pb.CancelJobRequest(job_id="a" * 65)), ("job_id",)),
    ("ListDead with limit 10001", ("ListDead", pb.ListDeadRequest(limit=10_001)), ("limit",)),
    (
        "ListDead with reason 99",
        ("ListDead", pb.ListDeadRequest(filter=pb.DeadFilter(reason=99))),
        ("filter.reason",),
    ),
    (
        "ListDead with a bad type filter",
        ("ListDead", pb.ListDeadRequest(filter=pb.DeadFilter(type="bad type"))),
        ("filter.type",),
    ),
    (
        "ListDead with a 65-character after_id",
        ("ListDead", pb.ListDeadRequest(after_id="a" * 65)),
        ("after_id",),
    ),
    ("RequeueDead with neither ids nor all", ("RequeueDead", pb.RequeueDeadRequest()), ("job_ids", "all")),
    (
        "RequeueDead with both ids and all",
        ("RequeueDead", pb.RequeueDeadRequest(job_ids=["abc"], all=True)),
        ("job_ids", "all"),
    ),
    ("RequeueDead with an empty id", ("RequeueDead", pb.RequeueDeadRequest(job_ids=[""])), ("job_ids[0]",)),
    (
        "RequeueDead all with reason 99",
        ("RequeueDead", pb.RequeueDeadRequest(all=True, filter=pb.DeadFilter(reason=99))),
        ("filter.reason",),
    ),
    (
        "PurgeDead with a bad type filter",
        ("PurgeDead", pb.PurgeDeadRequest(filter=pb.DeadFilter(type="bad type"))),
        ("filter.type",),
    ),
    (
        "PurgeDead with reason 99",
        ("PurgeDead", pb.PurgeDeadRequest(filter=pb.DeadFilter(reason=99))),
        ("filter.reason",),
    ),
    # Ends of the integer ranges, and fields not covered above.
    ("Enqueue without a job", ("Enqueue", pb.EnqueueRequest()), ("type",)),
    ("unknown priority 4", enqueue(priority=4), ("priority",)),
    ("max_attempts 2^32 - 1", enqueue(max_attempts=2**32 - 1), ("max_attempts",)),
    ("lease_ttl_ms 2^32 - 1", enqueue(lease_ttl_ms=2**32 - 1), ("lease_ttl_ms",)),
    ("delay_ms 2^63 - 1", enqueue(delay_ms=2**63 - 1), ("delay",)),
    ("delay_ms -2^63", enqueue(delay_ms=-(2**63)), ("delay",)),
    ("run_at_ms 2^63 - 1", enqueue(run_at_ms=2**63 - 1), ("run_at",)),
    ("idempotency key with a newline", enqueue(idempotency_key="a\nb"), ("idempotency_key",)),
    ("GetJob with a non-ASCII id", ("GetJob", pb.GetJobRequest(job_id="j\u00f6b")), ("job_id",)),
    (
        "ListDead with a 201-character type filter",
        ("ListDead", pb.ListDeadRequest(filter=pb.DeadFilter(type="a" * 201))),
        ("filter.type",),
    ),
    (
        "ListDead with a control character in after_id",
        ("ListDead", pb.ListDeadRequest(after_id="a\x01b")),
        ("after_id",),
    ),
    (
        "RequeueDead with a 65-character id",
        ("RequeueDead", pb.RequeueDeadRequest(job_ids=["ok", "a" * 65])),
        ("job_ids[1]",),
    ),
    (
        "RequeueDead all with a bad type filter",
        ("RequeueDead", pb.RequeueDeadRequest(all=True, filter=pb.DeadFilter(type="bad type"))),
        ("filter.type",),
    ),
]

# The catalogue: per RPC ("Service/Method"), its bad requests as (description, request, fragments
# the error details must contain). Every case must get INVALID_ARGUMENT, change nothing in Redis or
# the DB, and leave the dispatcher answering. An RPC added later is one more entry.
CATALOGUE: dict[str, list[tuple[str, Any, tuple[str, ...]]]] = {}
for _description, (_method, _request), _fields in JOB_SERVICE_CASES:
    CATALOGUE.setdefault(f"JobService/{_method}", []).append((_description, _request, _fields))
CATALOGUE["ShardService/PushJobs"] = [
    ("shard 9999", pb.PushJobsRequest(shard=9999, jobs=[pb.PushedJob(id="x")]), ("shard",)),
    (
        "a job with an empty id",
        pb.PushJobsRequest(shard=0, jobs=[pb.PushedJob(id="", record=b"")]),
        ("jobs[0].id",),
    ),
    (
        "a record that is not msgpack",
        pb.PushJobsRequest(shard=0, jobs=[pb.PushedJob(id="x", record=b"\x93garbage")]),
        ("jobs[0].record",),
    ),
    (
        "a record missing its fields",
        pb.PushJobsRequest(shard=0, jobs=[pb.PushedJob(id="x", record=b"\x80")]),
        ("jobs[0].record",),
    ),
]


def pushed(job_type: str = "other", payload: bytes = b"{}", **fields: Any) -> pb.PushJobsRequest:
    """A hand-off of one new job to shard 0 (the type "other" hashes to shard 0 of 8)."""
    values: dict[str, Any] = {
        "type": job_type,
        "priority": Priority.DEFAULT,
        "state": JobState.DELAYED,
        "run_at_ms": 1_800_000_000_000,
        "enqueued_at_ms": 1_800_000_000_000,
        "max_attempts": 5,
        "lease_ttl_ms": 60_000,
        **fields,
    }
    record = JobRecord(**values).pack()
    return pb.PushJobsRequest(shard=0, jobs=[pb.PushedJob(id="pushed-1", record=record, payload=payload)])


CATALOGUE["ShardService/PushJobs"] += [
    ("a job whose type is of another shard", pushed("noop"), ("jobs[0]", "shard")),
    ("a record with a bad type", pushed("bad type"), ("jobs[0]", "type")),
    ("a payload of 1 MiB + 1 byte", pushed(payload=b"x" * (MiB + 1)), ("jobs[0].payload",)),
    ("a record with lease TTL 0", pushed(lease_ttl_ms=0), ("jobs[0]", "lease_ttl_ms")),
    ("a record with max_attempts 0", pushed(max_attempts=0), ("jobs[0]", "max_attempts")),
    ("a record already leased", pushed(state=JobState.LEASED, token="t", attempts=1), ("jobs[0]", "record")),
    ("a record with a run_at of 0", pushed(run_at_ms=0), ("jobs[0]", "run_at")),
    ("a 201-character idempotency key", pushed(idempotency_key="k" * 201), ("jobs[0]", "idempotency_key")),
]


def schedule(**fields: Any) -> pb.UpsertScheduleRequest:
    base: dict[str, Any] = {"name": "nightly", "cron": "30 2 * * *", "type": "noop"}
    return pb.UpsertScheduleRequest(schedule=pb.ScheduleSpec(**{**base, **fields}))


CATALOGUE["ScheduleService/UpsertSchedule"] = [
    ("no spec", pb.UpsertScheduleRequest(), ("schedule.name",)),
    ("an empty name", schedule(name=""), ("schedule.name",)),
    ("a name with spaces", schedule(name="bad name"), ("schedule.name",)),
    ("a name of 201 characters", schedule(name="n" * 201), ("schedule.name",)),
    ("an empty cron", schedule(cron=""), ("schedule.cron", "empty")),
    ("minute 61", schedule(cron="61 * * * *"), ("schedule.cron", "61")),
    ("three fields", schedule(cron="* * *"), ("schedule.cron", "3 fields")),
    ("seven fields", schedule(cron="* * * * * * *"), ("schedule.cron", "7 fields")),
    ("an unknown alias", schedule(cron="@sometimes"), ("schedule.cron", "@sometimes")),
    ("a cron that never fires", schedule(cron="0 0 30 2 *"), ("schedule.cron", "never fires")),
    ("the H extension", schedule(cron="H * * * *"), ("schedule.cron", "H and R")),
    ("a cron of 300 characters", schedule(cron="1," * 150), ("schedule.cron",)),
    ("an unknown zone", schedule(timezone="Mars/Olympus"), ("schedule.timezone", "Mars/Olympus")),
    ("a path as zone", schedule(timezone="../../etc/passwd"), ("schedule.timezone",)),
    ("max lag 0", schedule(max_lag_ms=0), ("schedule.max_lag_ms",)),
    ("max lag negative", schedule(max_lag_ms=-5), ("schedule.max_lag_ms",)),
    ("max lag of a year", schedule(max_lag_ms=365 * 86_400_000), ("schedule.max_lag_ms",)),
    ("catch-up 99", schedule(catch_up=99), ("schedule.catch_up",)),
    ("an empty type", schedule(type=""), ("schedule.type",)),
    ("a bad type", schedule(type="bad type"), ("schedule.type",)),
    ("priority 99", schedule(priority=99), ("schedule.priority",)),
    ("max attempts 0", schedule(max_attempts=0), ("schedule.max_attempts",)),
    ("lease TTL 1 ms", schedule(lease_ttl_ms=1), ("schedule.lease_ttl_ms",)),
    ("a 2 MiB payload", schedule(payload=b"x" * (2 << 20)), ("schedule.payload",)),
]
for _method, _request in (
    ("GetSchedule", pb.GetScheduleRequest(name="")),
    ("PauseSchedule", pb.ScheduleNameRequest(name="")),
    ("ResumeSchedule", pb.ScheduleNameRequest(name="bad name")),
    ("DeleteSchedule", pb.ScheduleNameRequest(name="")),
    ("NextOccurrences", pb.NextOccurrencesRequest(name="")),
):
    CATALOGUE[f"ScheduleService/{_method}"] = [("a bad name", _request, ("name",))]

# Flow control: every field of the settings, out of its bounds. The settings are checked whole before
# anything is written (test_queue_settings.py checks that the stored settings did not change).
CATALOGUE["JobService/Enqueue"] += [
    ("a 129-character concurrency key", enqueue(concurrency_key="k" * 129)[1], ("job.concurrency_key",)),
    ("a concurrency key with a newline", enqueue(concurrency_key="a\nb")[1], ("job.concurrency_key",)),
]
CATALOGUE["JobService/EnqueueMany"] += [
    (
        "jobs[5] with a 129-character concurrency key",
        batch_with_bad_fifth(concurrency_key="k" * 129)[1],
        ("jobs[5].concurrency_key",),
    ),
]


def queue_settings(**fields: Any) -> pb.SetQueueSettingsRequest:
    return pb.SetQueueSettingsRequest(type="noop", settings=pb.QueueSettings(**fields))


def overrides(named: dict[str, int]) -> pb.SetQueueSettingsRequest:
    return queue_settings(key_concurrency_overrides=named)


def bucket(per_s: float, burst: int) -> pb.TokenBucket:
    return pb.TokenBucket(per_s=per_s, burst=burst)


OVERRIDES = ("settings.key_concurrency_overrides",)


CATALOGUE["QueueService/SetQueueSettings"] = [
    ("an empty type", pb.SetQueueSettingsRequest(type=""), ("type",)),
    ("a bad type", pb.SetQueueSettingsRequest(type="bad type"), ("type",)),
    ("an unknown field name", pb.SetQueueSettingsRequest(type="noop", fields=["speed"]), ("fields[0]",)),
    ("a negative concurrency", queue_settings(concurrency=-1), ("settings.concurrency",)),
    ("an absurd concurrency", queue_settings(concurrency=10**7), ("settings.concurrency",)),
    ("a negative key concurrency", queue_settings(key_concurrency=-2), ("settings.key_concurrency",)),
    ("an override of 0", overrides({"a": 0}), OVERRIDES),
    ("an override of an empty key", overrides({"": 3}), OVERRIDES),
    ("an override of a 129-character key", overrides({"k" * 129: 3}), OVERRIDES),
    ("1,001 overrides", overrides({f"k{i}": 1 for i in range(1001)}), OVERRIDES),
    ("a weight of 0", queue_settings(key_weights={"a": 0}), ("settings.key_weights",)),
    ("a weight of 1001", queue_settings(key_weights={"a": 1001}), ("settings.key_weights",)),
    ("a rate of 0", queue_settings(rate=bucket(0, 1)), ("settings.rate.per_s",)),
    ("a negative rate", queue_settings(rate=bucket(-5, 1)), ("settings.rate.per_s",)),
    ("an infinite rate", queue_settings(rate=bucket(float("inf"), 1)), ("settings.rate.per_s",)),
    ("a NaN rate", queue_settings(rate=bucket(float("nan"), 1)), ("settings.rate.per_s",)),
    ("an absurd rate", queue_settings(rate=bucket(1e9, 1)), ("settings.rate.per_s",)),
    ("a burst of 0", queue_settings(rate=bucket(10, 0)), ("settings.rate.burst",)),
    ("a key rate burst of 0", queue_settings(key_rate=bucket(10, 0)), ("settings.key_rate.burst",)),
    ("an absurd key rate", queue_settings(key_rate=bucket(2e6, 5)), ("settings.key_rate.per_s",)),
    ("paused class unspecified", queue_settings(paused=[0]), ("settings.paused[0]",)),
    ("paused class 9", queue_settings(paused=[1, 9]), ("settings.paused[1]",)),
]  # fmt: skip
CATALOGUE["QueueService/GetQueue"] = [("a bad type", pb.GetQueueRequest(type="bad type"), ("type",))]
CATALOGUE["QueueService/PauseQueue"] = [
    ("an empty type", pb.PauseQueueRequest(type=""), ("type",)),
    ("priority 9", pb.PauseQueueRequest(type="noop", priority=9), ("priority",)),
]
CATALOGUE["QueueService/ResumeQueue"] = [
    ("a type of 201 characters", pb.PauseQueueRequest(type="a" * 201), ("type",)),
    ("priority -1", pb.PauseQueueRequest(type="noop", priority=-1), ("priority",)),
]


# Bytes no client library would send, to a method path: a field of the wrong wire type (it is an
# unknown field to protobuf, so the real one is empty), bad UTF-8 in a string, a truncated message,
# noise. Undecodable requests are refused by grpc itself before the dispatcher sees them, with
# UNKNOWN and the protobuf parse error as details.
RAW_CASES: list[tuple[str, str, bytes, grpc.StatusCode, str]] = [
    (
        "Enqueue: job.type sent as a varint",
        "JobService/Enqueue",
        b"\x0a\x02\x08\x05",
        grpc.StatusCode.INVALID_ARGUMENT,
        "type",
    ),
    (
        "Enqueue: job.type is not UTF-8",
        "JobService/Enqueue",
        b"\x0a\x04\x0a\x02\xff\xfe",
        grpc.StatusCode.UNKNOWN,
        "UTF-8",
    ),
    ("Enqueue: truncated", "JobService/Enqueue", b"\x0a\x10\x0a", grpc.StatusCode.UNKNOWN, "corrupt"),
    (
        "GetJob: 256 bytes of noise",
        "JobService/GetJob",
        bytes(range(256)),
        grpc.StatusCode.UNKNOWN,
        "parsing",
    ),
    (
        "EnqueueMany: jobs sent as a varint",
        "JobService/EnqueueMany",
        b"\x08\x01",
        grpc.StatusCode.INVALID_ARGUMENT,
        "jobs",
    ),
    ("a method that does not exist", "JobService/DropEverything", b"", grpc.StatusCode.UNIMPLEMENTED, ""),
]


def send_garbage(target: str, data: bytes) -> None:
    """Write ``data`` to the gRPC port over a plain TCP socket, then close it."""
    host, port = target.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        with contextlib.suppress(OSError):  # the server may hang up before we are done
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(5)
            while sock.recv(4096):  # until the server closes its side
                pass


class WorkerStream:
    """A raw WorkerService.Connect stream: ``send`` messages, read ``responses``, ``close`` our side."""

    _END = object()

    def __init__(self, channel: grpc.Channel, timeout: float = 15.0) -> None:
        self._outbox: queue.Queue[Any] = queue.Queue()
        self.responses = pb_grpc.WorkerServiceStub(channel).Connect(self._requests(), timeout=timeout)

    def _requests(self) -> Iterator[pb.WorkerMessage]:
        while True:
            item = self._outbox.get()
            if item is self._END:
                return
            yield item

    def send(self, **message: Any) -> None:
        self._outbox.put(pb.WorkerMessage(**message))

    def close(self) -> None:
        self._outbox.put(self._END)

    def next(self) -> pb.DispatcherMessage:
        return next(self.responses)

    def __enter__(self) -> WorkerStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        self.responses.cancel()


def hello(
    worker_id: str = "bad-input-test",
    job_types: tuple[str, ...] = ("unused_type",),
    concurrency: int = 1,
    **extra: Any,
) -> pb.Hello:
    return pb.Hello(worker_id=worker_id, job_types=list(job_types), concurrency=concurrency, **extra)


def ref(job_id: str = "some-job", token: str = "made-up-token", shard: int = 0) -> pb.LeaseRef:
    return pb.LeaseRef(job_id=job_id, token=token, shard=shard)


def stream_error(
    channel: grpc.Channel, messages: list[dict[str, Any]]
) -> tuple[grpc.StatusCode, str, list[str]]:
    """Send ``messages`` on a fresh stream and read until it fails; (code, details, kinds received)."""
    kinds: list[str] = []
    with WorkerStream(channel, timeout=5) as stream:
        for message in messages:
            stream.send(**message)
        try:
            for response in stream.responses:
                kinds.append(str(response.WhichOneof("msg")))
        except grpc.RpcError as exc:
            return exc.code(), exc.details() or "", kinds
    return grpc.StatusCode.OK, "", kinds


# -- JobService ---------------------------------------------------------------------------------


def test_job_service_rejects_bad_requests_and_writes_nothing(dispatcher, redis_url, db_url):
    before_redis, before_db = redis_digest(redis_url), db_digest(db_url)
    assert before_db[0] == 0
    failures = []
    with grpc.insecure_channel(dispatcher.target) as channel:
        stub = pb_grpc.JobServiceStub(channel)

        def check_nothing_changed(description: str) -> None:
            changed = redis_digest(redis_url).changed(before_redis)
            if changed:
                failures.append(f"{description}: changed Redis keys {changed}")
            if db_digest(db_url) != before_db:
                failures.append(f"{description}: changed the jobs table")
            try:
                stub.GetVersion(pb.GetVersionRequest(), timeout=10)
            except grpc.RpcError as exc:
                failures.append(f"{description}: the dispatcher stopped answering ({exc.code().name})")

        for rpc_name, cases in CATALOGUE.items():
            service, method = rpc_name.split("/")
            rpc_stub = getattr(pb_grpc, f"{service}Stub")(channel)
            for description, request, fields in cases:
                label = f"{rpc_name} {description}"
                try:
                    response = getattr(rpc_stub, method)(request, timeout=20)
                except grpc.RpcError as exc:
                    code, details = exc.code(), exc.details() or ""
                    if code is not grpc.StatusCode.INVALID_ARGUMENT:
                        failures.append(f"{label}: {code.name} ({details!r}), expected INVALID_ARGUMENT")
                    elif not all(f in details for f in fields):
                        failures.append(f"{label}: details {details!r} do not name {fields}")
                else:
                    failures.append(f"{label}: accepted ({type(response).__name__} {response})")
                check_nothing_changed(label)

        for description, path, data, expected, fragment in RAW_CASES:
            call = channel.unary_unary(f"/shardq.v1.{path}")  # bytes in, bytes out
            try:
                call(data, timeout=20)
                failures.append(f"raw {description}: accepted")
            except grpc.RpcError as exc:
                if exc.code() is not expected or fragment not in (exc.details() or ""):
                    failures.append(
                        f"raw {description}: {exc.code().name} {exc.details()!r}, expected "
                        f"{expected.name} with {fragment!r}"
                    )
            check_nothing_changed(f"raw {description}")
        assert not failures, "\n".join(failures)

        # Well-formed ids of jobs that do not exist: NOT_FOUND, not INVALID_ARGUMENT.
        for method, request in (
            ("GetJob", pb.GetJobRequest(job_id="no-such-job")),
            ("CancelJob", pb.CancelJobRequest(job_id="no-such-job")),
        ):
            with pytest.raises(grpc.RpcError) as info:
                getattr(stub, method)(request, timeout=10)
            assert info.value.code() is grpc.StatusCode.NOT_FOUND, (method, info.value.details())

        # Garbage on the gRPC port: random bytes, and random bytes after a valid HTTP/2 preface.
        send_garbage(dispatcher.target, os.urandom(4096))
        send_garbage(dispatcher.target, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + os.urandom(4096))
        send_garbage(dispatcher.target, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + os.urandom(1024))
        assert dispatcher.process is not None and dispatcher.process.poll() is None, dispatcher.log_tail()

        # Nothing changed: no Redis key, no row.
        assert redis_digest(redis_url).changed(before_redis) == []
        assert db_digest(db_url) == before_db
        with Client(dispatcher.target, timeout=10) as client:
            assert client.stats() == []

        # It still serves, and the limits themselves (smallest and largest allowed values) are accepted.
        version = stub.GetVersion(pb.GetVersionRequest(), timeout=10)
        assert version.protocol >= 1 and version.shard_count == 8
        boundary = [
            spec("a" * 200),
            spec(payload=b"x" * MiB),
            spec(max_attempts=1),
            spec(max_attempts=1000),
            spec(lease_ttl_ms=100),
            spec(lease_ttl_ms=DAY_MS),
            spec(idempotency_key="k" * 200),
            spec(delay_ms=0),
            spec(priority=pb.PRIORITY_LOW),
            spec("Z9_.:/-x"),
        ]
        response = stub.EnqueueMany(pb.EnqueueManyRequest(jobs=boundary), timeout=20)
        assert len(response.job_ids) == len(boundary) and all(response.created)
        one = stub.Enqueue(pb.EnqueueRequest(job=spec(payload=b"{}")), timeout=20)
        assert stub.GetJob(pb.GetJobRequest(job_id=one.job_id), timeout=10).status == pb.JOB_STATUS_READY
    assert count_jobs(db_url) == len(boundary) + 1


def test_nul_byte_in_idempotency_key_is_refused_or_stored_and_hurts_no_other_enqueue(dispatcher, db_url):
    """A NUL in the one free-form text field of a job. Refusing it (INVALID_ARGUMENT naming the field)
    and accepting it (then it dedups like any key) are both fine; an internal error is not, and neither
    is failing other clients' enqueues that happened to share its group-commit transaction."""
    key = "order\x0042"
    problems = []
    with grpc.insecure_channel(dispatcher.target) as channel:
        stub = pb_grpc.JobServiceStub(channel)
        requests = [pb.EnqueueRequest(job=spec(payload=b'{"i": %d}' % i)) for i in range(300)]
        requests[150] = pb.EnqueueRequest(job=spec(idempotency_key=key))
        futures = [stub.Enqueue.future(r, timeout=30) for r in requests]
        for i, future in enumerate(futures):
            if i == 150:
                continue
            try:
                future.result()
            except grpc.RpcError as exc:
                problems.append(f"innocent enqueue #{i} failed with {exc.code().name}: {exc.details()!r}")
        with contextlib.suppress(grpc.RpcError):
            futures[150].result()
        for attempt in ("first", "second"):
            try:
                response = stub.Enqueue(pb.EnqueueRequest(job=spec(idempotency_key=key)), timeout=20)
            except grpc.RpcError as exc:
                details = exc.details() or ""
                if exc.code() is not grpc.StatusCode.INVALID_ARGUMENT or "idempotency_key" not in details:
                    problems.append(
                        f"{attempt} enqueue with a NUL in the key: {exc.code().name} "
                        f"{details!r}, expected INVALID_ARGUMENT naming idempotency_key, or OK"
                    )
            else:
                if attempt == "first":
                    first = response.job_id
                elif response.job_id != first or response.created:
                    problems.append(f"a key with a NUL did not dedup: {first} then {response}")
    assert not problems, "\n".join(problems)
    assert count_jobs(db_url) in (299, 300)


def test_nack_error_with_nul_byte_does_not_stop_status_writes(dispatcher, db_url, start_worker, ledger):
    """Worker error text is arbitrary (a traceback can hold any character): a NUL in it must not keep
    this job's status, or any later job's, from reaching the database."""
    with Client(dispatcher.target, timeout=20) as client, grpc.insecure_channel(dispatcher.target) as channel:
        job_id = client.enqueue("final_nul", {"x": 1})
        with WorkerStream(channel) as stream:
            stream.send(hello=hello(job_types=("final_nul",)))
            assert stream.next().WhichOneof("msg") == "welcome"
            stream.send(credit=pb.Credit(slots=1))
            message = stream.next()
            assert message.WhichOneof("msg") == "leases", message
            [lease] = message.leases.leases
            assert lease.ref.job_id == job_id
            nack = pb.Nack(lease=lease.ref, error="boom\x00tail", retryable=False)
            stream.send(nacks=pb.Nacks(nacks=[nack]))
            stream.close()
            assert list(stream.responses) == []
        start_worker(dispatcher.target, types="noop")
        later = client.enqueue("noop", {"after": "nul"})
        wait_until(
            lambda: any(e["job"] == later and e["event"] == "end" for e in read_ledger(ledger)), timeout=20
        )
        wait_until(
            lambda: db_status(db_url, job_id) == "dead" and db_status(db_url, later) == "succeeded",
            timeout=10,
            interval=0.1,
            message=lambda: (
                f"DB rows: the job nacked with a NUL is {db_status(db_url, job_id)!r} "
                f"(expected 'dead'), a later acked job is {db_status(db_url, later)!r} "
                f"(expected 'succeeded'); dispatcher log:\n{dispatcher.log_tail(10)}"
            ),
        )
        job = client.get_job(job_id)
        assert (job.status, job.dead_reason) == ("dead", "not_retryable")
        assert "boom" in job.last_error


# -- WorkerService ------------------------------------------------------------------------------


def test_worker_stream_bad_input(dispatcher, redis_url, start_worker, ledger):
    with grpc.insecure_channel(dispatcher.target) as channel:
        cases: list[tuple[str, list[dict[str, Any]], str, list[str]]] = [
            # (description, messages, substring of the details, messages received before the error)
            ("first message is a credit", [{"credit": pb.Credit(slots=1)}], "hello", []),
            ("first message is an ack", [{"acks": pb.Acks(acks=[pb.Ack(lease=ref())])}], "hello", []),
            ("first message is empty", [{}], "hello", []),
            ("hello without job types", [{"hello": hello(job_types=())}], "job_types", []),
            ("hello with concurrency 0", [{"hello": hello(concurrency=0)}], "concurrency", []),
            ("hello with concurrency 10001", [{"hello": hello(concurrency=10_001)}], "concurrency", []),
            ("hello with a bad job type", [{"hello": hello(job_types=("ok", "bad type"))}], "job_types", []),
            ("hello with an empty worker id", [{"hello": hello(worker_id="")}], "worker_id", []),
            ("hello holding a lease of shard 9999", [{"hello": hello(held=[ref(shard=9999)])}], "shard", []),
            ("hello sent twice", [{"hello": hello()}, {"hello": hello()}], "hello", ["welcome"]),
            ("an empty message after hello", [{"hello": hello()}, {}], "message", ["welcome"]),
            (
                "an ack with shard 9999",
                [{"hello": hello()}, {"acks": pb.Acks(acks=[pb.Ack(lease=ref(shard=9999))])}],
                "shard",
                ["welcome"],
            ),
            (
                "an ack with an empty token",
                [{"hello": hello()}, {"acks": pb.Acks(acks=[pb.Ack(lease=ref(token=""))])}],
                "token",
                ["welcome"],
            ),
            (
                "a nack with shard 9999",
                [{"hello": hello()}, {"nacks": pb.Nacks(nacks=[pb.Nack(lease=ref(shard=9999))])}],
                "shard",
                ["welcome"],
            ),
            (
                "a nack with a negative retry delay",
                [{"hello": hello()}, {"nacks": pb.Nacks(nacks=[pb.Nack(lease=ref(), retry_delay_ms=-1)])}],
                "retry_delay_ms",
                ["welcome"],
            ),
            (
                "a rate-limited nack without a delay",
                [{"hello": hello()}, {"nacks": pb.Nacks(nacks=[pb.Nack(lease=ref(), rate_limited=True)])}],
                "retry_delay_ms",
                ["welcome"],
            ),
            (
                "a rate-limited nack with a delay of 0",
                [
                    {"hello": hello()},
                    {"nacks": pb.Nacks(nacks=[pb.Nack(lease=ref(), rate_limited=True, retry_delay_ms=0)])},
                ],
                "nacks[0].retry_delay_ms",
                ["welcome"],
            ),
            (
                "a rate-limited nack with a delay over a day",
                [
                    {"hello": hello()},
                    {
                        "nacks": pb.Nacks(
                            nacks=[pb.Nack(lease=ref(), rate_limited=True, retry_delay_ms=DAY_MS + 1)]
                        )
                    },
                ],
                "nacks[0].retry_delay_ms",
                ["welcome"],
            ),
            (
                "a nack holding its siblings without being rate limited",
                [{"hello": hello()}, {"nacks": pb.Nacks(nacks=[pb.Nack(lease=ref(), hold_siblings=True)])}],
                "nacks[0].hold_siblings",
                ["welcome"],
            ),
            (
                "a heartbeat with a 65-character job id",
                [{"hello": hello()}, {"heartbeat": pb.Heartbeat(leases=[ref(job_id="a" * 65)])}],
                "job_id",
                ["welcome"],
            ),
            # Counts: the most a message may carry (SHARDQ_MAX_WORKER_TYPES, SHARDQ_MAX_LEASE_REFS) + 1.
            (
                "hello with 1,001 job types",
                [{"hello": hello(job_types=tuple(f"t{i}" for i in range(1001)))}],
                "hello.job_types",
                [],
            ),
            (
                "hello holding 10,001 leases",
                [{"hello": hello(held=[ref(job_id=f"j{i}") for i in range(10_001)])}],
                "hello.held",
                [],
            ),
            (
                "a heartbeat of 10,001 leases",
                [
                    {"hello": hello()},
                    {"heartbeat": pb.Heartbeat(leases=[ref(job_id=f"j{i}") for i in range(10_001)])},
                ],
                "heartbeat.leases",
                ["welcome"],
            ),
            (
                "10,001 acks",
                [
                    {"hello": hello()},
                    {"acks": pb.Acks(acks=[pb.Ack(lease=ref(job_id=f"j{i}")) for i in range(10_001)])},
                ],
                "acks",
                ["welcome"],
            ),
            (
                "10,001 nacks",
                [
                    {"hello": hello()},
                    {"nacks": pb.Nacks(nacks=[pb.Nack(lease=ref(job_id=f"j{i}")) for i in range(10_001)])},
                ],
                "nacks",
                ["welcome"],
            ),
        ]
        failures = []
        before_redis = redis_digest(redis_url)
        for description, messages, field, received in cases:
            code, details, kinds = stream_error(channel, messages)
            if code is not grpc.StatusCode.INVALID_ARGUMENT or field not in details or kinds != received:
                failures.append(
                    f"{description}: {code.name} {details!r} after {kinds}; expected "
                    f"INVALID_ARGUMENT naming {field!r} after {received}"
                )
            if redis_digest(redis_url).changed(before_redis):
                failures.append(f"{description}: changed Redis")
        assert not failures, "\n".join(failures)

        # Acks, nacks and heartbeats for a lease never issued: rejected; the job is untouched.
        with Client(dispatcher.target, timeout=10) as client:
            job_id = client.enqueue("noop", {"fake": "token"})
            job = client.get_job(job_id)
            assert job.status == "ready"
            jobs_key = f"shardq:{{s{job.shard}}}:jobs"
            with redis.Redis.from_url(redis_url) as r:
                record_before = r.hget(jobs_key, job_id)
            assert record_before is not None
            fake = ref(job_id=job_id, token="999999-made-up", shard=job.shard)
            with WorkerStream(channel) as stream:
                stream.send(hello=hello())
                assert stream.next().WhichOneof("msg") == "welcome"
                stream.send(acks=pb.Acks(acks=[pb.Ack(lease=fake, result=b"forged")]))
                stream.send(nacks=pb.Nacks(nacks=[pb.Nack(lease=fake, error="forged", retryable=False)]))
                stream.send(heartbeat=pb.Heartbeat(leases=[fake]))
                rejected = []
                for _ in range(3):
                    message = stream.next()
                    assert message.WhichOneof("msg") == "rejected", message
                    rejected += [(r.ref.job_id, r.ref.token) for r in message.rejected.leases]
                assert rejected == [(job_id, fake.token)] * 3
                stream.close()
                assert list(stream.responses) == []  # we closed our side: the stream ends cleanly
            with redis.Redis.from_url(redis_url) as r:
                assert r.hget(jobs_key, job_id) == record_before
            job = client.get_job(job_id)
            assert (job.status, job.attempts, job.failures, job.result) == ("ready", 0, 0, b"")

            # A real worker then runs it, exactly once.
            start_worker(dispatcher.target, types="noop", concurrency=2)
            wait_until(lambda: client.get_job(job_id).status == "succeeded", timeout=20)
            marker = client.enqueue("noop", {"marker": True})  # same shard: it runs after a duplicate would
            wait_until(lambda: client.get_job(marker).status == "succeeded", timeout=20)
            starts = [e for e in read_ledger(ledger) if e["event"] == "start" and e["job"] == job_id]
            assert len(starts) == 1, starts
            job = client.get_job(job_id)
            assert job.attempts == 1 and job.failures == 0 and job.result == b""
    assert dispatcher.process is not None and dispatcher.process.poll() is None


# -- dispatcherctl ------------------------------------------------------------------------------


CLI_CASES: list[tuple[list[str], str]] = [
    # (arguments after --target, a pattern the one stderr line must match)
    (["enqueue", "bad type"], r"\btype\b"),
    (["enqueue", "x", "--payload", "{"], r"--payload"),
    (["enqueue", "x", "--delay", "-1"], r"--delay"),
    (["enqueue", "x", "--at", "notatime"], r"--at"),
    (["enqueue", "x", "--delay", "1", "--at", "2030-01-01T00:00:00Z"], r"--delay.*--at|--at.*--delay"),
    (["enqueue", "x", "--priority", "urgent"], r"--priority|urgent"),
    (["enqueue", "x", "--max-attempts", "0"], r"max[-_]attempts"),
    (["job", "show", ""], r"job_id|\bid\b"),
    (["dlq", "requeue"], r"--all"),
    (["dlq", "list", "--reason", "nope"], r"--reason|nope"),
    (["enqueue", "x", "--max-attempts", "1001"], r"max[-_]attempts"),
    (["enqueue", "x", "--lease-ttl", "0"], r"lease[-_]ttl"),
    (["enqueue", "x", "--delay", "nan"], r"--delay"),
    (["enqueue", "x", "--key", "k" * 201], r"idempotency_key|--key"),
    (["enqueue", "x", "--payload", "[1, 2"], r"--payload"),
    (["schedule", "add", "s", "--type", "t", "--cron", "61 * * * *"], r"schedule\.cron"),
    (
        ["schedule", "add", "s", "--type", "t", "--cron", "* * * * *", "--tz", "No/Where"],
        r"schedule\.timezone",
    ),
    (["schedule", "add", "s", "--type", "t", "--cron", "* * * * *", "--max-lag", "0"], r"max_lag"),
    (["schedule", "add", "s", "--type", "t", "--cron", "* * * * *", "--max-lag", "soon"], r"--max-lag"),
    (["schedule", "add", "s", "--type", "t", "--cron", "* * * * *", "--catch-up", "some"], r"--catch-up"),
    (["schedule", "add", "bad name", "--type", "t", "--cron", "* * * * *"], r"schedule\.name"),
    (["schedule", "show", ""], r"\bname\b"),
    (["schedule", "next", "s", "--count", "0"], r"--count"),
    (["job", "show", "a" * 65], r"job_id|\bid\b"),
    (["job", "cancel", ""], r"job_id|\bid\b"),
    (["job", "cancel", "ab\ncd"], r"job_id|\bid\b"),
    (["job"], r"job|show|cancel"),
    (["dlq", "list", "--type", "bad type"], r"type"),
    (["dlq", "list", "--limit", "10001"], r"limit"),
    (["dlq", "requeue", "abc", "--all"], r"--all"),
    (["dlq", "requeue", "--all", "--type", "bad type"], r"type"),
    (["dlq", "purge", "--reason", "nope"], r"--reason|nope"),
    (["dlq", "purge", "--type", "bad type"], r"type"),
    (["stats", "extra"], r"extra|unrecognized"),
    (["rebalance", "--wait", "-1"], r"--wait"),
    (["frobnicate"], r"frobnicate|invalid choice"),
]


def test_dispatcherctl_bad_input(dispatcher, redis_url, db_url):
    before_redis, before_db = redis_digest(redis_url), db_digest(db_url)
    env = {k: v for k, v in os.environ.items() if k != "SHARDQ_TARGET"}
    base = [sys.executable, "-m", "dispatcher.cli.ctl", "--target", dispatcher.target, "--timeout", "20"]
    procs = [
        (
            args,
            pattern,
            subprocess.Popen(
                base + args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            ),
        )
        for args, pattern in CLI_CASES
    ]
    failures = []
    for args, pattern, proc in procs:
        out, err = proc.communicate(timeout=60)
        lines = err.splitlines()
        problems = []
        if proc.returncode == 0:
            problems.append("exit status 0")
        if out:
            problems.append(f"stdout {out!r}")
        if len(lines) != 1:
            problems.append(f"{len(lines)} stderr lines, not 1")
        if not re.search(pattern, err):
            problems.append(f"stderr does not match {pattern!r}")
        if problems:
            failures.append(
                f"dispatcherctl {' '.join(map(repr, args))}: {'; '.join(problems)}\n    stderr: {err!r}"
            )
    assert not failures, "\n".join(failures)
    assert redis_digest(redis_url).changed(before_redis) == []
    assert db_digest(db_url) == before_db
    assert dispatcher.ready()

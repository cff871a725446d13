"""Check every field of a job, a lease reference or a worker message before anything is written;
errors name the field. Whatever brings a job in (an RPC, a hand-off, a schedule) checks it here."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from shardq_common.errors import InvalidArgument
from shardq_common.pb import shardq_pb2 as pb

from ..config import Settings
from . import flow
from .states import PRIORITIES, DeadReason, Priority

TYPE_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,199}")
MAX_KEY_LENGTH = 200
MAX_ATTEMPTS_LIMIT = 1000
MIN_LEASE_TTL_MS = 100
MAX_LEASE_TTL_MS = 24 * 3600 * 1000
MAX_HORIZON_MS = 100 * 365 * 24 * 3600 * 1000  # run_at at most a century ahead
MAX_ID_LENGTH = 64
MAX_TOKEN_LENGTH = 64
# A job's headers are metadata (the trace context above all), stored in its row and its Redis record
# and sent with each lease: bounded so that they never cost more than a small payload.
MAX_HEADERS = 16
MAX_HEADER_VALUE_LENGTH = 1024
MAX_HEADERS_BYTES = 4096
HEADER_KEY_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
#: Issue 21: the header that marks a job with dependencies, so that its leases carry their results.
#: No client can give it (a header name starts with a letter or digit); the dispatcher sets it, it
#: travels with the job's record (pushes, hand-offs, restores) and is never shown or delivered.
DEPENDENCIES_HEADER = ":deps"


def visible_headers(headers: Mapping[str, str] | None) -> dict[str, str] | None:
    """The headers a client or a handler sees: the dispatcher's own left out."""
    if not headers:
        return None
    return {k: v for k, v in headers.items() if not k.startswith(":")} or None


@dataclass(slots=True)  # not frozen: made per job (a frozen one sets each field through object.__setattr__)
class ValidJob:
    type: str
    payload: bytes
    priority: Priority
    run_at_ms: int
    max_attempts: int
    lease_ttl_ms: int
    idempotency_key: str
    concurrency_key: str = ""
    headers: str | None = None  # the headers as the row stores them (JSON), None without any
    #: Issue 21: (a ref of the same request or a job id, "fail" | "ignore") per dependency.
    depends_on: tuple[tuple[str, str], ...] = ()
    ref: str = ""  # its name within its request, for the others' depends_on
    #: (a waiting job's id, policy): jobs that get this one as one more dependency.
    blocks: tuple[tuple[str, str], ...] = ()


MAX_DEPENDENCIES = 1000
MAX_REF_LENGTH = 200
_POLICIES = {
    pb.DEPENDENCY_POLICY_UNSPECIFIED: "fail",
    pb.DEPENDENCY_POLICY_FAIL: "fail",
    pb.DEPENDENCY_POLICY_IGNORE: "ignore",
}
POLICY_TO_PB = {"fail": pb.DEPENDENCY_POLICY_FAIL, "ignore": pb.DEPENDENCY_POLICY_IGNORE}


def job_type(value: str, field: str) -> str:
    if not value:
        raise InvalidArgument(f"{field}: must not be empty")
    if not TYPE_PATTERN.fullmatch(value):
        raise InvalidArgument(
            f"{field}: {value[:60]!r} is not a job type: 1..200 characters of letters, digits and _.:/-, "
            "starting with a letter or digit"
        )
    return value


def priority(value: int, field: str) -> Priority:
    if value == pb.PRIORITY_UNSPECIFIED:
        return Priority.DEFAULT
    if value not in (pb.PRIORITY_HIGH, pb.PRIORITY_DEFAULT, pb.PRIORITY_LOW):
        raise InvalidArgument(f"{field}: unknown priority {value}")
    return PRIORITIES[value - 1]  # the inverse of priority_to_pb; the enum's constructor is slower


def priority_to_pb(p: Priority | int) -> int:
    return int(p) + 1


def job_spec(spec: pb.JobSpec, field: str, settings: Settings, now: int) -> ValidJob:
    jt = job_type(spec.type, f"{field}.type")
    if len(spec.payload) > settings.max_payload_bytes:
        raise InvalidArgument(
            f"{field}.payload: {len(spec.payload)} bytes is over the limit of {settings.max_payload_bytes}"
        )
    prio = priority(spec.priority, f"{field}.priority")
    has_run_at, has_delay = spec.HasField("run_at_ms"), spec.HasField("delay_ms")
    if has_run_at and has_delay:
        raise InvalidArgument(f"{field}: give run_at or delay, not both")
    if has_delay:
        if spec.delay_ms < 0:
            raise InvalidArgument(f"{field}.delay_ms: must not be negative")
        if spec.delay_ms > MAX_HORIZON_MS:
            raise InvalidArgument(f"{field}.delay_ms: more than a century")
        run_at = now + spec.delay_ms
    elif has_run_at:
        if spec.run_at_ms <= 0:
            raise InvalidArgument(f"{field}.run_at_ms: must be a positive Unix time in milliseconds")
        if spec.run_at_ms > now + MAX_HORIZON_MS:
            raise InvalidArgument(f"{field}.run_at_ms: more than a century ahead")
        run_at = spec.run_at_ms
    else:
        run_at = now
    max_attempts = settings.max_attempts
    if spec.HasField("max_attempts"):
        if not 1 <= spec.max_attempts <= MAX_ATTEMPTS_LIMIT:
            raise InvalidArgument(f"{field}.max_attempts: must be in 1..{MAX_ATTEMPTS_LIMIT}")
        max_attempts = spec.max_attempts
    ttl = settings.lease_ttl_ms
    if spec.HasField("lease_ttl_ms"):
        if not MIN_LEASE_TTL_MS <= spec.lease_ttl_ms <= MAX_LEASE_TTL_MS:
            raise InvalidArgument(f"{field}.lease_ttl_ms: must be in {MIN_LEASE_TTL_MS}..{MAX_LEASE_TTL_MS}")
        ttl = spec.lease_ttl_ms
    if len(spec.idempotency_key) > MAX_KEY_LENGTH:
        raise InvalidArgument(f"{field}.idempotency_key: longer than {MAX_KEY_LENGTH} characters")
    if not spec.idempotency_key.isprintable():
        raise InvalidArgument(f"{field}.idempotency_key: must not contain control characters")
    key = (
        flow.concurrency_key(spec.concurrency_key, f"{field}.concurrency_key") if spec.concurrency_key else ""
    )
    headers = job_headers(spec.headers, f"{field}.headers") if spec.headers else None
    job = ValidJob(jt, spec.payload, prio, run_at, max_attempts, ttl, spec.idempotency_key, key, headers)
    if spec.ref:
        if len(spec.ref) > MAX_REF_LENGTH or not spec.ref.isprintable():
            raise InvalidArgument(f"{field}.ref: 1..{MAX_REF_LENGTH} printable characters")
        job.ref = spec.ref
    if spec.depends_on:
        at_most(len(spec.depends_on), MAX_DEPENDENCIES, f"{field}.depends_on", "dependencies")
        deps = []
        for k, dep in enumerate(spec.depends_on):
            name = f"{field}.depends_on[{k}]"
            if not dep.job or len(dep.job) > MAX_REF_LENGTH or not dep.job.isprintable():
                raise InvalidArgument(
                    f"{name}.job: a job id or a ref of the request (1..{MAX_REF_LENGTH} characters)"
                )
            if dep.on_failure not in _POLICIES:
                raise InvalidArgument(f"{name}.on_failure: unknown policy {dep.on_failure}")
            deps.append((dep.job, _POLICIES[dep.on_failure]))
        if len({d for d, _ in deps}) != len(deps):
            raise InvalidArgument(f"{field}.depends_on: a dependency is named twice")
        job.depends_on = tuple(deps)
    if spec.blocks:
        at_most(len(spec.blocks), MAX_DEPENDENCIES, f"{field}.blocks", "jobs")
        blocked = []
        for k, dep in enumerate(spec.blocks):
            job_id(dep.job, f"{field}.blocks[{k}].job")
            if dep.on_failure not in _POLICIES:
                raise InvalidArgument(f"{field}.blocks[{k}].on_failure: unknown policy {dep.on_failure}")
            blocked.append((dep.job, _POLICIES[dep.on_failure]))
        if len({b for b, _ in blocked}) != len(blocked):
            raise InvalidArgument(f"{field}.blocks: a job is named twice")
        job.blocks = tuple(blocked)
    return job


@dataclass(frozen=True, slots=True)
class GraphEdge:
    job: int  # the waiting job's index in the request
    depends_on: int | None  # the index of the job it waits for in the request, or None:
    job_id: str  # an existing job's id
    on_failure: str


def job_graph(jobs: list[ValidJob], field: str = "jobs") -> list[GraphEdge]:
    """The dependencies of a request's jobs, refs resolved to indexes. Refused (naming the job):
    a ref used twice, a dependency that is neither a ref of the request nor a job id, a cycle."""
    index: dict[str, int] = {}
    for i, job in enumerate(jobs):
        if job.ref:
            if job.ref in index:
                raise InvalidArgument(
                    f"{field}[{i}].ref: {job.ref!r} is already the ref of {field}[{index[job.ref]}]"
                )
            index[job.ref] = i
    edges: list[GraphEdge] = []
    for i, job in enumerate(jobs):
        for k, (name, policy) in enumerate(job.depends_on):
            target = index.get(name)
            if target is None:
                if len(name) > MAX_ID_LENGTH or not name.isascii():
                    raise InvalidArgument(
                        f"{field}[{i}].depends_on[{k}].job: {name[:60]!r} is neither a ref of the request "
                        "nor a job id"
                    )
            elif target == i:
                raise InvalidArgument(f"{field}[{i}].depends_on[{k}]: the job depends on itself (a cycle)")
            edges.append(GraphEdge(i, target, "" if target is not None else name, policy))
    _refuse_cycles(len(jobs), edges, jobs, field)
    return edges


def _refuse_cycles(n: int, edges: list[GraphEdge], jobs: list[ValidJob], field: str) -> None:
    """Kahn's algorithm over the request's own edges: the jobs left over are on (or behind) a cycle."""
    waits = [0] * n
    dependents: list[list[int]] = [[] for _ in range(n)]
    for e in edges:
        if e.depends_on is not None:
            waits[e.job] += 1
            dependents[e.depends_on].append(e.job)
    free = [i for i in range(n) if not waits[i]]
    done = 0
    while free:
        i = free.pop()
        done += 1
        for j in dependents[i]:
            waits[j] -= 1
            if not waits[j]:
                free.append(j)
    if done < n:
        first = min(i for i in range(n) if waits[i])
        name = f" ({jobs[first].ref!r})" if jobs[first].ref else ""
        raise InvalidArgument(f"{field}[{first}]{name}.depends_on: the dependencies form a cycle")


def job_headers(headers: Mapping[str, str], field: str, *, internal: bool = False) -> str:
    """Checked headers as the DB row keeps them: a JSON object with sorted keys. ``internal``: a
    record from another dispatcher, which may carry DEPENDENCIES_HEADER."""
    if internal and DEPENDENCIES_HEADER in headers:
        headers = {k: v for k, v in headers.items() if k != DEPENDENCIES_HEADER}
    if len(headers) > MAX_HEADERS:
        raise InvalidArgument(f"{field}: {len(headers)} headers is over the limit of {MAX_HEADERS}")
    size = 0
    for key, value in headers.items():
        if not HEADER_KEY_PATTERN.fullmatch(key):
            raise InvalidArgument(
                f"{field}: {key[:60]!r} is not a header name: 1..64 characters of letters, digits and "
                "_.-, starting with a letter or digit"
            )
        if len(value) > MAX_HEADER_VALUE_LENGTH:
            raise InvalidArgument(
                f"{field}[{key!r}]: {len(value)} characters is over the limit of {MAX_HEADER_VALUE_LENGTH}"
            )
        if not value.isprintable():
            raise InvalidArgument(f"{field}[{key!r}]: must not contain control characters")
        size += len(key) + len(value.encode())
    if size > MAX_HEADERS_BYTES:
        raise InvalidArgument(f"{field}: {size} bytes is over the limit of {MAX_HEADERS_BYTES}")
    return headers_json(headers)


def headers_json(headers: Mapping[str, str]) -> str:
    """Headers as their row holds them: compact JSON, sorted by name."""
    return json.dumps(dict(sorted(headers.items())), separators=(",", ":"), ensure_ascii=False)


def error_text(value: str, limit: int) -> str:
    """A worker's error message as the DB can store it: no NUL bytes, bounded length."""
    return value[:limit].replace("\x00", "\\0")


def progress_report(value: str, limit: int, field: str) -> str:
    """A handler's progress report: JSON of a number 0..1 or an object, at most ``limit`` bytes."""
    size = len(value.encode())
    if not size or size > limit:
        raise InvalidArgument(f"{field}: {size} bytes; a progress report is 1..{limit} bytes of JSON")
    try:
        decoded = json.loads(value)
    except ValueError:
        raise InvalidArgument(f"{field}: not JSON") from None
    if isinstance(decoded, dict):
        return value
    if isinstance(decoded, int | float) and not isinstance(decoded, bool) and 0 <= decoded <= 1:
        return value
    raise InvalidArgument(f"{field}: a progress report is a number from 0 to 1 or an object")


def at_most(n: int, limit: int, field: str, what: str) -> None:
    """A repeated field holds no more than ``limit`` items."""
    if n > limit:
        raise InvalidArgument(f"{field}: {n} {what} is over the limit of {limit}")


def batch_size(n: int, settings: Settings) -> None:
    if n == 0:
        raise InvalidArgument("jobs: the batch is empty")
    if n > settings.max_batch:
        raise InvalidArgument(f"jobs: {n} jobs is over the batch limit of {settings.max_batch}")


def job_id(value: str, field: str = "job_id") -> str:
    if not value:
        raise InvalidArgument(f"{field}: must not be empty")
    if len(value) > MAX_ID_LENGTH or not value.isascii() or not value.isprintable():
        raise InvalidArgument(f"{field}: not a job id")
    return value


def lease_ref(ref: pb.LeaseRef, field: str, shard_count: int) -> tuple[str, str, int]:
    job_id(ref.job_id, f"{field}.job_id")
    if not ref.token or len(ref.token) > MAX_TOKEN_LENGTH:
        raise InvalidArgument(f"{field}.token: not a lease token")
    if ref.shard >= shard_count:
        raise InvalidArgument(f"{field}.shard: {ref.shard} is not a shard (0..{shard_count - 1})")
    return ref.job_id, ref.token, ref.shard


_REASONS = {
    pb.DEAD_REASON_HANDLER_ERROR: DeadReason.HANDLER_ERROR,
    pb.DEAD_REASON_NOT_RETRYABLE: DeadReason.NOT_RETRYABLE,
    pb.DEAD_REASON_LEASE_EXPIRED: DeadReason.LEASE_EXPIRED,
    pb.DEAD_REASON_NO_HANDLER: DeadReason.NO_HANDLER,
}
REASON_TO_PB = {v: k for k, v in _REASONS.items()}


def dead_reason(value: int, field: str) -> str:
    if value == pb.DEAD_REASON_UNSPECIFIED:
        return ""
    if value not in _REASONS:
        raise InvalidArgument(f"{field}: unknown dead-letter reason {value}")
    return str(_REASONS[value])

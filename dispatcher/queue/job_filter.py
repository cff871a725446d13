"""A search's filter and its page cursor, checked: the JobFilter message of ListJobs and the bulk
actions becomes a store.JobQuery, and every bad field is refused naming it, before any query runs.

Job-type patterns and the caller's scope are resolved against the job types the DB has (a loose
index scan, one probe per type) into an exact list of types, so both are conditions on the
``jobs_type_id`` index, and a caller scoped to ``billing.*`` is never shown another type's row.

A cursor is the last id of a page, the order, and a digest of the filter, in URL-safe base64: a
cursor made for another filter or order, or altered, is refused. It is an integrity check, not a
secret: the cursor grants nothing (every page is filtered by the caller's scope again).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase

from shardq_common.errors import InvalidArgument
from shardq_common.pb import shardq_pb2 as pb

from ..store import JobQuery, PayloadCondition, SearchPosition
from . import ids, validation
from .states import JobState

DEFAULT_PAGE = 50
MAX_PAGE = 500
MAX_TYPES = 50
MAX_PATTERNS = 10
MAX_PAYLOAD_MATCHES = 4
MAX_PAYLOAD_PATH_KEYS = 8
MAX_ERROR_TEXT = 200
MAX_VALUE_JSON = 1024
DEFAULT_PAYLOAD_BYTES = 1024
MAX_PAYLOAD_BYTES = 65536
MAX_CURSOR = 200
#: How far apart the clocks of the process that made a job's id and the one that finished it may be.
CLOCK_MARGIN_MS = 10 * 60_000
#: Greatest time a filter may name (ms): the ids' 48 bits of milliseconds.
MAX_TIME_MS = (1 << 48) - 1

STATUS_FROM_PB = {
    pb.JOB_STATUS_DELAYED: JobState.DELAYED,
    pb.JOB_STATUS_READY: JobState.READY,
    pb.JOB_STATUS_LEASED: JobState.LEASED,
    pb.JOB_STATUS_SUCCEEDED: JobState.SUCCEEDED,
    pb.JOB_STATUS_DEAD: JobState.DEAD,
    pb.JOB_STATUS_CANCELLED: JobState.CANCELLED,
    pb.JOB_STATUS_WAITING: "waiting",  # issue 21: in the DB only, no Redis state of its own
}
_PATTERN = re.compile(r"[A-Za-z0-9_.:/\-*?\[\]!]{1,200}")
_PATH_KEY = re.compile(r"[A-Za-z0-9_]{1,64}")


@dataclass(frozen=True)
class SearchFilter:
    """A checked JobFilter whose type patterns are not resolved yet (see ``resolve``)."""

    query: JobQuery
    types: tuple[str, ...]
    patterns: tuple[str, ...]

    def digest(self, newest_first: bool) -> str:
        text = repr((self.query, self.types, self.patterns, newest_first))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def needs_known_types(self, scoped: bool) -> bool:
        """Whether ``resolve`` reads the DB's job types: for patterns or a type scope. An
        idempotency key or a dead reason without a type needs none: each has an index of its own
        (migration 0019), where reading type by type costs a scan per type and partition."""
        return bool(self.patterns or scoped)

    def resolve(self, known_types: Iterable[str], may_use: Callable[[str], bool], scoped: bool) -> JobQuery:
        """The query with its types made exact: those named, or those of the DB matching a pattern,
        limited to the ones the caller may use (``scoped``: the caller has a type scope)."""
        if not self.needs_known_types(scoped):
            return self.query if not self.types else replace(self.query, types=self.types)
        candidates = self.types if self.types and not self.patterns else tuple(known_types)
        named = frozenset(self.types)

        def wanted(t: str) -> bool:  # any of the types named or patterns given
            if not named and not self.patterns:
                return True
            return t in named or any(fnmatchcase(t, p) for p in self.patterns)

        chosen = tuple(t for t in candidates if may_use(t) and wanted(t))
        return replace(self.query, types=chosen)


def parse(f: pb.JobFilter, field: str = "filter") -> SearchFilter:
    validation.at_most(len(f.types), MAX_TYPES, f"{field}.types", "types")
    types = tuple(sorted({validation.job_type(t, f"{field}.types[{i}]") for i, t in enumerate(f.types)}))
    validation.at_most(len(f.type_patterns), MAX_PATTERNS, f"{field}.type_patterns", "patterns")
    for i, p in enumerate(f.type_patterns):
        if not _PATTERN.fullmatch(p):
            raise InvalidArgument(
                f"{field}.type_patterns[{i}]: {p[:60]!r} is not a job-type pattern: up to 200 characters "
                "of letters, digits, _.:/- and the wildcards * ? [...]"
            )
    patterns = tuple(sorted(set(f.type_patterns)))
    validation.at_most(len(f.statuses), len(STATUS_FROM_PB), f"{field}.statuses", "statuses")
    statuses = []
    for i, s in enumerate(f.statuses):
        if s not in STATUS_FROM_PB:
            raise InvalidArgument(f"{field}.statuses[{i}]: unknown job status {s}")
        statuses.append(str(STATUS_FROM_PB[s]))
    validation.at_most(len(f.priorities), 3, f"{field}.priorities", "priorities")
    priorities = []
    for i, p in enumerate(f.priorities):
        if p == pb.PRIORITY_UNSPECIFIED:
            raise InvalidArgument(f"{field}.priorities[{i}]: give high, default or low")
        priorities.append(int(validation.priority(p, f"{field}.priorities[{i}]")))
    for name in ("created_after_ms", "created_before_ms", "finished_after_ms", "finished_before_ms"):
        value = getattr(f, name)
        if value < 0 or value > MAX_TIME_MS:
            raise InvalidArgument(f"{field}.{name}: {value} is not a time in epoch milliseconds")
    for low, high in (("created_after_ms", "created_before_ms"), ("finished_after_ms", "finished_before_ms")):
        if getattr(f, low) and getattr(f, high) and getattr(f, low) >= getattr(f, high):
            raise InvalidArgument(f"{field}.{high}: must be after {low}")
    if len(f.idempotency_key) > validation.MAX_KEY_LENGTH:
        raise InvalidArgument(f"{field}.idempotency_key: over {validation.MAX_KEY_LENGTH} characters")
    if len(f.schedule) > 200:
        raise InvalidArgument(f"{field}.schedule: over 200 characters")
    if len(f.error_contains) > MAX_ERROR_TEXT or "\x00" in f.error_contains:
        raise InvalidArgument(f"{field}.error_contains: at most {MAX_ERROR_TEXT} characters, no NUL")
    validation.at_most(len(f.payload), MAX_PAYLOAD_MATCHES, f"{field}.payload", "payload conditions")
    payload = tuple(payload_condition(m, f"{field}.payload[{i}]") for i, m in enumerate(f.payload))
    max_id = _id_floor(f.created_before_ms) if f.created_before_ms else ""
    if f.finished_before_ms:
        # A job finished before T was created before it: the id range bounds the scan (with a
        # margin for the clocks of the processes that made the id and the finish time).
        bound = _id_floor(min(MAX_TIME_MS, f.finished_before_ms + CLOCK_MARGIN_MS))
        max_id = min(max_id, bound) if max_id else bound
    query = JobQuery(
        statuses=tuple(sorted(set(statuses))),
        priorities=tuple(sorted(set(priorities))),
        min_id=_id_floor(f.created_after_ms) if f.created_after_ms else "",
        max_id=max_id,
        finished_after_ms=f.finished_after_ms or None,
        finished_before_ms=f.finished_before_ms or None,
        idem_key=f.idempotency_key,
        schedule=f.schedule,
        error_contains=f.error_contains,
        payload=payload,
        dead_reason=validation.dead_reason(f.dead_reason, f"{field}.dead_reason"),
    )
    return SearchFilter(query, types, patterns)


def payload_condition(m: pb.PayloadMatch, field: str) -> PayloadCondition:
    keys = m.path.split(".")
    if m.path.startswith("payload."):  # the way people write it: payload.customer_id
        keys = keys[1:]
    if not m.path or len(keys) > MAX_PAYLOAD_PATH_KEYS or not all(_PATH_KEY.fullmatch(k) for k in keys):
        raise InvalidArgument(
            f"{field}.path: {m.path[:80]!r} is not a payload field: 1..{MAX_PAYLOAD_PATH_KEYS} keys of "
            "letters, digits and _ (1..64 characters each), separated by dots, e.g. customer.id"
        )
    if len(m.value_json) > MAX_VALUE_JSON:
        raise InvalidArgument(f"{field}.value_json: over {MAX_VALUE_JSON} characters")
    try:
        value = json.loads(m.value_json, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        raise InvalidArgument(
            f'{field}.value_json: {m.value_json[:60]!r} is not JSON (42, "text", true, false, null)'
        ) from None
    if value is None:
        kind = "null"
    elif value is True or value is False:
        kind = "true" if value else "false"
    elif isinstance(value, int | float):
        kind = "number"
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidArgument(f"{field}.value_json: not a finite number")
    elif isinstance(value, str):
        kind = "string"
        if "\x00" in value:
            raise InvalidArgument(f"{field}.value_json: a string without NUL")
    else:
        raise InvalidArgument(f"{field}.value_json: must be a JSON scalar, not an object or an array")
    return PayloadCondition(tuple(keys), json.dumps(value), kind, value)


def _no_constant(name: str) -> None:
    raise ValueError(name)


def _id_floor(ms: int) -> str:
    """The smallest job id made at ``ms``: ids made before it sort below, those at or after above."""
    return ids.ids_from(ms, b"\x00" * 16)[0]


def page_size(limit: int) -> int:
    if limit > MAX_PAGE:
        raise InvalidArgument(f"limit: {limit} is over the page size limit of {MAX_PAGE}")
    return limit or DEFAULT_PAGE


def payload_bytes(limit: int) -> int:
    if limit > MAX_PAYLOAD_BYTES:
        raise InvalidArgument(f"max_payload_bytes: {limit} is over {MAX_PAYLOAD_BYTES}")
    return limit or DEFAULT_PAYLOAD_BYTES


def encode_cursor(last: SearchPosition, digest: str, newest_first: bool) -> str:
    """A cursor after ``last``: a job id, or (finished_at, id) for a search in finish-time order."""
    order = "d" if newest_first else "a"
    position = last if isinstance(last, str) else f"{last[0]}:{last[1]}"
    text = f"1|{order}|{position}|{_seal(digest, order, position)}"
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_cursor(cursor: str, digest: str, newest_first: bool) -> SearchPosition:
    """Where the previous page ended; INVALID_ARGUMENT unless the cursor was made by this search
    (the same filter and order, which also fix whether it holds a finish time) and is unaltered."""
    refused = InvalidArgument("cursor: not a cursor of this search (same filter and order); start again")
    if len(cursor) > MAX_CURSOR:
        raise refused
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    except (binascii.Error, ValueError):
        raise refused from None
    parts = text.split("|")
    if len(parts) != 4 or parts[0] != "1" or parts[1] not in ("a", "d"):
        raise refused
    if parts[1] != ("d" if newest_first else "a"):
        raise InvalidArgument("cursor: made for the other order; start again from the first page")
    if parts[3] != _seal(digest, parts[1], parts[2]):
        raise refused
    finished_at, colon, last_id = parts[2].rpartition(":")
    if not colon:
        return validation.job_id(last_id, "cursor")
    if not finished_at.isdigit():
        raise refused
    return int(finished_at), validation.job_id(last_id, "cursor")


def _seal(digest: str, order: str, last_id: str) -> str:
    return hashlib.sha256(f"{digest}|{order}|{last_id}".encode()).hexdigest()[:16]

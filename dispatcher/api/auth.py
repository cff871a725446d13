"""Who may call what: bearer tokens, their roles and job-type scopes, and the method -> roles table.

Tokens file (``SHARDQ_AUTH_TOKENS_FILE``, or the same text in ``SHARDQ_AUTH_TOKENS``, where ``;``
also separates entries): one token per line, ``#`` starts a comment::

    sha256:<64 hex digits>  role=producer  types=billing.*,email.send  name=billing-api
    <the token itself>      role=worker    types=resize
    sha256:<64 hex digits>  role=viewer    types=billing.* name=billing-oncall
    sha256:<64 hex digits>  role=admin     name=ops

The first field is the token, or ``sha256:`` and the hex SHA-256 of its UTF-8 bytes (so the file
need not hold the secret: ``printf %s "$TOKEN" | sha256sum``). A plain token must be at least 16
characters. ``types`` are comma-separated patterns (``*``, ``?``, ``[...]``, matched against the
whole job type); without it a producer, worker or viewer token covers every type. ``name`` labels the
token in logs (default ``<role>@line<n>``). Admin tokens have no type scope.

A token is checked by comparing SHA-256 digests with ``hmac.compare_digest`` against every entry,
so the time taken does not tell how much of a guess was right.
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from fnmatch import fnmatchcase
from pathlib import Path

from shardq_common.errors import ConfigError, PermissionDenied
from shardq_common.redaction import SECRETS


class Role(StrEnum):
    #: Enqueues jobs and reads or cancels the jobs of the types it may enqueue.
    PRODUCER = "producer"
    #: Connects a worker stream for the job types of its scope and reads the shard map.
    WORKER = "worker"
    #: Reads everything an operator looks at (jobs, stats, dead letters, schedules, queues, workers,
    #: the shard map) within its type scope, and changes nothing: the dashboard's read-only role.
    VIEWER = "viewer"
    #: Everything in the table: dead-letter queue, rebalancing, schedules, and what the others may do.
    ADMIN = "admin"
    #: Another dispatcher (``SHARDQ_PEER_TOKEN``): hand-offs of new jobs and the shard map.
    PEER = "peer"


PRODUCER, WORKER, VIEWER, ADMIN, PEER = Role.PRODUCER, Role.WORKER, Role.VIEWER, Role.ADMIN, Role.PEER
_ONLY_ADMIN: frozenset[Role] = frozenset()
_JOBS, _WORKERS, _SHARDS, _SCHEDULES, _QUEUES = (
    "/shardq.v1.JobService/",
    "/shardq.v1.WorkerService/",
    "/shardq.v1.ShardService/",
    "/shardq.v1.ScheduleService/",
    "/shardq.v1.QueueService/",
)

#: Full gRPC method name -> the roles besides admin that may call it. Admin may call every method
#: listed here; a method that is not listed is refused to everyone (PERMISSION_DENIED), so a new
#: RPC stays closed until it is given a line here.
METHOD_ROLES: dict[str, frozenset[Role]] = {
    _JOBS + "Enqueue": frozenset({PRODUCER}),
    _JOBS + "EnqueueMany": frozenset({PRODUCER}),
    _JOBS + "EnqueueStream": frozenset({PRODUCER}),
    _JOBS + "GetJob": frozenset({PRODUCER, VIEWER}),
    _JOBS + "WatchJob": frozenset({PRODUCER, VIEWER}),
    _JOBS + "CancelJob": frozenset({PRODUCER}),
    _JOBS + "Stats": frozenset({PRODUCER, VIEWER}),
    _JOBS + "GetVersion": frozenset({PRODUCER, WORKER, VIEWER, PEER}),
    _JOBS + "WhoAmI": frozenset({PRODUCER, WORKER, VIEWER, PEER}),
    _JOBS + "ListDead": frozenset({VIEWER}),
    _JOBS + "RequeueDead": _ONLY_ADMIN,
    _JOBS + "PurgeDead": _ONLY_ADMIN,
    _JOBS + "PruneJobs": _ONLY_ADMIN,
    # A producer or viewer searches the jobs of the types of its scope (the scope filters the query).
    _JOBS + "ListJobs": frozenset({PRODUCER, VIEWER}),
    _JOBS + "BulkJobs": _ONLY_ADMIN,
    _WORKERS + "Connect": frozenset({WORKER}),
    _WORKERS + "ListWorkers": frozenset({VIEWER}),
    # Clients send jobs to shard owners; viewers see who owns what.
    _SHARDS + "GetShardMap": frozenset({PRODUCER, WORKER, VIEWER, PEER}),
    _SHARDS + "Rebalance": _ONLY_ADMIN,
    _SHARDS + "PushJobs": frozenset({PEER}),
    _SCHEDULES + "UpsertSchedule": _ONLY_ADMIN,
    _SCHEDULES + "GetSchedule": frozenset({VIEWER}),
    _SCHEDULES + "ListSchedules": frozenset({VIEWER}),
    _SCHEDULES + "PauseSchedule": _ONLY_ADMIN,
    _SCHEDULES + "ResumeSchedule": _ONLY_ADMIN,
    _SCHEDULES + "DeleteSchedule": _ONLY_ADMIN,
    _SCHEDULES + "NextOccurrences": frozenset({VIEWER}),
    # Flow control: an operator's, like schedules (settings name other producers' tenants).
    _QUEUES + "SetQueueSettings": _ONLY_ADMIN,
    _QUEUES + "GetQueue": frozenset({VIEWER}),
    _QUEUES + "ListQueues": frozenset({VIEWER}),
    _QUEUES + "PauseQueue": _ONLY_ADMIN,
    _QUEUES + "ResumeQueue": _ONLY_ADMIN,
}

#: Served without a token, so that probes (Kubernetes, load balancers, grpcurl) need no secret:
#: health answers SERVING / NOT_SERVING only, reflection describes the public proto.
OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.v1.", "/grpc.reflection.v1alpha.")

MIN_TOKEN_CHARS = 16
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
_TYPE_PATTERN = re.compile(r"[A-Za-z0-9_.:/\-*?\[\]!]+")
_FILE_ROLES = (PRODUCER, WORKER, VIEWER, ADMIN)


def is_open(method: str) -> bool:
    return method.startswith(OPEN_PREFIXES)


@dataclass(frozen=True)
class Principal:
    """The caller a token stands for."""

    name: str
    role: Role
    #: Job-type patterns (fnmatch, whole type); empty: every type.
    types: tuple[str, ...] = ()

    def may_call(self, method: str) -> bool:
        roles = METHOD_ROLES.get(method)
        if roles is None:
            return False
        return self.role is ADMIN or self.role in roles

    def may_use(self, job_type: str) -> bool:
        return not self.types or any(fnmatchcase(job_type, p) for p in self.types)

    def check_types(self, types: Iterable[str], what: str) -> None:
        """PERMISSION_DENIED naming the first type outside this token's scope."""
        for job_type in types:
            if not self.may_use(job_type):
                raise PermissionDenied(
                    f"{what}: job type {job_type!r} is outside the scope of token {self.name!r} "
                    f"({','.join(self.types)})"
                )


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class TokenTable:
    """The known tokens, by digest."""

    def __init__(self, entries: list[tuple[bytes, Principal]]) -> None:
        self.entries = entries

    def __len__(self) -> int:
        return len(self.entries)

    def authenticate(self, token: str) -> Principal | None:
        wanted = digest(token)
        found = None
        for known, principal in self.entries:  # every entry, match or not: constant time per table
            if hmac.compare_digest(known, wanted) and found is None:
                found = principal
        return found

    def roles(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for _, p in self.entries:
            counts[str(p.role)] = counts.get(str(p.role), 0) + 1
        return counts

    @classmethod
    def parse(cls, text: str, source: str, *, semicolons: bool = False) -> TokenTable:
        """Parse a tokens file (see the module docstring). Errors name the source and line, never a token."""
        entries: list[tuple[bytes, Principal]] = []
        lines = text.splitlines()
        if semicolons:
            lines = [part for line in lines for part in line.split(";")]
        for number, raw in enumerate(lines, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            where = f"{source} line {number}" if not semicolons else f"{source} entry {number}"
            first, *options = line.split()
            known = _token_digest(first, where)
            attrs: dict[str, str] = {}
            for option in options:
                key, eq, value = option.partition("=")
                if not eq or key not in ("role", "types", "name") or not value:
                    raise ConfigError(f"{where}: expected role=..., types=... or name=..., not {option!r}")
                if key in attrs:
                    raise ConfigError(f"{where}: {key}= given twice")
                attrs[key] = value
            if "role" not in attrs:
                raise ConfigError(f"{where}: role= is required (one of {', '.join(_FILE_ROLES)})")
            if attrs["role"] not in _FILE_ROLES:
                raise ConfigError(
                    f"{where}: unknown role {attrs['role']!r} (one of {', '.join(_FILE_ROLES)})"
                )
            role = Role(attrs["role"])
            types = tuple(p for p in attrs.get("types", "").split(",") if p)
            if role is ADMIN and types:
                raise ConfigError(f"{where}: an admin token has no type scope; remove types=")
            for pattern in types:
                if not _TYPE_PATTERN.fullmatch(pattern):
                    raise ConfigError(f"{where}: bad job-type pattern {pattern!r}")
            if "*" in types:
                types = ()
            if any(hmac.compare_digest(known, d) for d, _ in entries):
                raise ConfigError(f"{where}: the same token is listed twice")
            name = attrs.get("name") or f"{role}@{'entry' if semicolons else 'line'}{number}"
            entries.append((known, Principal(name, role, types)))
        return cls(entries)

    @classmethod
    def load(cls, path: str | None, inline: str | None, peer_token: str | None = None) -> TokenTable | None:
        """The table from a file or the inline text, plus the peer token; None when auth is off."""
        if path and inline:
            raise ConfigError("set SHARDQ_AUTH_TOKENS_FILE or SHARDQ_AUTH_TOKENS, not both")
        if path:
            try:
                text = Path(path).read_text()
            except OSError as exc:
                raise ConfigError(f"cannot read the tokens file {path}: {exc.strerror}") from None
            table = cls.parse(text, path)
        elif inline:
            table = cls.parse(inline, "SHARDQ_AUTH_TOKENS", semicolons=True)
        else:
            return None
        if not table.entries:
            raise ConfigError(f"{path or 'SHARDQ_AUTH_TOKENS'}: no tokens (auth would refuse every call)")
        if peer_token:
            known = _token_digest(peer_token, "SHARDQ_PEER_TOKEN")
            if any(hmac.compare_digest(known, d) for d, _ in table.entries):
                raise ConfigError("SHARDQ_PEER_TOKEN is also listed in the tokens: give peers their own")
            table.entries.append((known, Principal("peer", PEER)))
        return table


def _token_digest(first: str, where: str) -> bytes:
    if first.startswith("sha256:"):
        hexdigest = first.removeprefix("sha256:").lower()
        if not _HEX_DIGEST.fullmatch(hexdigest):
            raise ConfigError(f"{where}: sha256: must be followed by 64 hex digits")
        return bytes.fromhex(hexdigest)
    if len(first) < MIN_TOKEN_CHARS:
        raise ConfigError(f"{where}: a token must be at least {MIN_TOKEN_CHARS} characters")
    SECRETS.add(first)  # masked wherever it might show up in a log line
    return digest(first)


# -- the caller of the RPC being served ----------------------------------------------------------

_CURRENT: contextvars.ContextVar[Principal | None] = contextvars.ContextVar("shardq_principal", default=None)


def current() -> Principal | None:
    """The authenticated caller of the RPC this task serves; None when auth is off."""
    return _CURRENT.get()


def bind(principal: Principal) -> None:
    """Set the caller for the rest of this RPC (each RPC runs in a task, hence a context, of its own)."""
    _CURRENT.set(principal)


def check_types(types: Iterable[str], what: str) -> None:
    """PERMISSION_DENIED unless the caller (if auth is on) may use every one of ``types``."""
    principal = current()
    if principal is not None:
        principal.check_types(types, what)


def may_use(job_type: str) -> bool:
    principal = current()
    return principal is None or principal.may_use(job_type)


def scoped() -> bool:
    """Whether the caller's token limits the job types it may use."""
    principal = current()
    return principal is not None and bool(principal.types)

"""What the dashboard reads and does, once for both its pages and its JSON API.

Each operation takes the caller's session and returns plain data (dicts and lists that serialize to
JSON as they are). Input is checked here, before any call: a bad value raises ``BadInput`` naming the
field (HTTP 400); the dispatcher's refusals arrive as the SDK's ``ShardqError`` (mapped to HTTP
statuses in ``errors.py``).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import OrderedDict
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from shardq_common.clock import wall_ms
from worker_sdk import DEAD_REASONS, AsyncClient, JobFilter, JobInfo, QueueStats, StatsSnapshot

from .errors import BadInput, HTTPProblem
from .gateway import Gateway
from .rates import RATE_FIELDS, Window, sample_of
from .sessions import Session

#: The payload and result shown on a job's page are cut here.
MAX_SHOWN_BYTES = 64 * 1024
#: Dead jobs a page lists.
DEAD_PAGE = 50
MAX_DEAD_PAGE = 500
MAX_SCHEDULES_WITH_OCCURRENCES = 100
NEXT_OCCURRENCES = 3
MAX_REMEMBERED_LOOKS = 256
#: The members' counters are read every this many samples (the shard map itself is cached).
MEMBERS_EVERY_S = 10.0
PRIORITIES = ("high", "default", "low")
STATES = ("delayed", "ready", "leased", "dead")
_JOB_ID = re.compile(r"[A-Za-z0-9_\-]{1,64}")
_JOB_TYPE = re.compile(r"[A-Za-z0-9_.:/\-]{1,200}")
_SCHEDULE = re.compile(r"[A-Za-z0-9_.:/\-]{1,200}")


def job_id(value: str, field: str = "job_id") -> str:
    if not _JOB_ID.fullmatch(value or ""):
        raise BadInput(f"{field}: not a job id ({value[:80]!r})")
    return value


def job_type(value: str | None, field: str = "type", *, required: bool = False) -> str | None:
    if not value:
        if required:
            raise BadInput(f"{field}: required")
        return None
    if not _JOB_TYPE.fullmatch(value):
        raise BadInput(f"{field}: not a job type (letters, digits and _.:/- up to 200 characters)")
    return value


def dead_reason(value: str | None) -> str | None:
    if not value:
        return None
    if value not in DEAD_REASONS:
        raise BadInput(f"reason: one of {', '.join(DEAD_REASONS)}")
    return value


def priority(value: str | None, *, required: bool = False) -> str | None:
    if not value:
        if required:
            raise BadInput("priority: required")
        return None
    if value not in PRIORITIES:
        raise BadInput(f"priority: one of {', '.join(PRIORITIES)}")
    return value


def schedule_name(value: str) -> str:
    if not _SCHEDULE.fullmatch(value or ""):
        raise BadInput("name: not a schedule name")
    return value


def bounded_int(value: str | None, field: str, default: int, low: int, high: int) -> int:
    if value in (None, ""):
        return default
    try:
        number = int(value)
    except ValueError:
        raise BadInput(f"{field}: a whole number") from None
    if not low <= number <= high:
        raise BadInput(f"{field}: {low}..{high}")
    return number


#: What the Jobs search form offers (the JobFilter fields, by their URL names).
SEARCH_FIELDS = (
    "type", "status", "priority", "created_after", "created_before", "finished_after",
    "finished_before", "idempotency_key", "schedule", "error", "payload", "reason",
)  # fmt: skip
STATUSES = ("delayed", "ready", "leased", "succeeded", "dead", "cancelled", "waiting")
BULK_ACTIONS = ("cancel", "requeue", "run_now", "delete")
JOBS_PAGE = 50
MAX_JOBS_PAGE = 500
MAX_PAYLOAD_MATCHES = 4
MAX_FIELD_CHARS = 1000
#: The last second of the year 9999: later moments (and inf) do not fit the dispatcher's milliseconds.
MAX_EPOCH_S = 253_402_300_799


def _listed(value: str, field: str, allowed: tuple[str, ...] | None = None) -> tuple[str, ...]:
    items = tuple(v.strip() for v in value.replace("\n", ",").split(",") if v.strip())
    for item in items:
        if allowed is not None and item not in allowed:
            raise BadInput(f"{field}: {item!r} is not one of {', '.join(allowed)}")
    return items


def _moment(value: str, field: str) -> float | None:
    """An ISO 8601 date-time (a browser's datetime-local field is read as UTC), or epoch seconds."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise BadInput(
                f"{field}: an ISO 8601 date-time (2026-12-05T16:00, UTC unless an offset is given)"
            ) from None
        seconds = (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
    if not 0 <= seconds <= MAX_EPOCH_S:  # inf and nan too
        raise BadInput(f"{field}: a moment between 1970 and 9999")
    return seconds


def _payload_matches(value: str) -> dict[str, Any]:
    """``customer_id = 42; region = "eu"``: dotted JSON paths and values (JSON, else a string)."""
    matches: dict[str, Any] = {}
    for part in (p.strip() for p in value.replace("\n", ";").split(";")):
        if not part:
            continue
        path, eq, raw = part.partition("=")
        path, raw = path.strip().removeprefix("payload."), raw.strip()
        if not eq or not path or not raw:
            raise BadInput(f"payload: expected path = value, not {part[:80]!r}")
        try:
            matches[path] = json.loads(raw)
        except ValueError:
            matches[path] = raw
    if len(matches) > MAX_PAYLOAD_MATCHES:
        raise BadInput(f"payload: at most {MAX_PAYLOAD_MATCHES} fields")
    return matches


def job_filter(inputs: dict[str, str]) -> JobFilter:
    """The search form's fields as a JobFilter (the dispatcher checks the rest and names the field)."""
    for name in SEARCH_FIELDS:
        if len(inputs.get(name, "")) > MAX_FIELD_CHARS:
            raise BadInput(f"{name}: at most {MAX_FIELD_CHARS} characters")
    return JobFilter(
        types=_listed(inputs.get("type", ""), "type"),
        statuses=_listed(inputs.get("status", ""), "status", STATUSES),
        priorities=_listed(inputs.get("priority", ""), "priority", PRIORITIES),
        created_after=_moment(inputs.get("created_after", ""), "created_after"),
        created_before=_moment(inputs.get("created_before", ""), "created_before"),
        finished_after=_moment(inputs.get("finished_after", ""), "finished_after"),
        finished_before=_moment(inputs.get("finished_before", ""), "finished_before"),
        idempotency_key=inputs.get("idempotency_key", ""),
        schedule=inputs.get("schedule", ""),
        error_contains=inputs.get("error", ""),
        payload=_payload_matches(inputs.get("payload", "")),
        dead_reason=dead_reason(inputs.get("reason")) or "",
    )


def shown_bytes(data: bytes) -> dict[str, Any]:
    """Bytes for display: pretty JSON when they are JSON, else text or hex; cut at MAX_SHOWN_BYTES."""
    cut = len(data) > MAX_SHOWN_BYTES
    head = data[:MAX_SHOWN_BYTES]
    out: dict[str, Any] = {"size": len(data), "truncated": cut, "json": None, "text": ""}
    if not data:
        return out
    if not cut:
        try:
            out["json"] = json.loads(data)
            out["text"] = json.dumps(out["json"], indent=2, ensure_ascii=False, sort_keys=True)
            return out
        except ValueError:
            pass
    try:
        out["text"] = head.decode()
    except UnicodeDecodeError:
        out["text"] = head.hex(" ")
    return out


def job_dict(job: JobInfo, *, full: bool = False) -> dict[str, Any]:
    data = asdict(job)
    data.pop("payload")
    data.pop("result")
    if full:
        data["payload"] = shown_bytes(job.payload)
        data["result"] = shown_bytes(job.result)
    return data


def _iso(ms: int, zone: ZoneInfo | None = None) -> str:
    if not ms:
        return ""
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    return (moment.astimezone(zone) if zone else moment).isoformat(timespec="seconds")


class Operations:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self._member_addresses: tuple[float, list[str]] = (0.0, [])
        #: The per-type counters each user's queue table saw last (at, process starts, counts).
        self._last_looks: OrderedDict[str, tuple[int, dict[str, int], dict[str, dict[str, int]]]] = (
            OrderedDict()
        )

    def client(self, session: Session, address: str | None = None) -> AsyncClient:
        return self.gateway.client(session.token, address)

    # -- who ----------------------------------------------------------------------------------

    async def identity(self, token: str) -> dict[str, Any]:
        """Who ``token`` stands for; a token is checked before a client is kept for it."""
        who = await (self.gateway.client("").whoami() if not token else self.gateway.verify(token))
        return asdict(who)

    # -- overview -----------------------------------------------------------------------------

    async def _members(self, session: Session) -> list[str]:
        """The other alive members' addresses (re-read every MEMBERS_EVERY_S)."""
        read_at, addresses = self._member_addresses
        now = asyncio.get_running_loop().time()
        if now - read_at >= MEMBERS_EVERY_S:
            view = await self.client(session).shard_map()
            addresses = sorted({m.address for m in view.members if m.alive and m.address})
            self._member_addresses = (now, addresses)
        return addresses

    async def snapshots(self, session: Session) -> tuple[StatsSnapshot, list[StatsSnapshot]]:
        """The target's full stats, and every process's counters (the target's among them)."""
        main = await self.client(session).stats_snapshot()
        snapshots = {main.dispatcher_id: main}
        try:
            addresses = await self._members(session)
        except Exception:  # the map is a refinement: the target's own counters still make a chart
            addresses = []
        others = [self.client(session, address).stats_snapshot(counters_only=True) for address in addresses]
        for result in await asyncio.gather(*others, return_exceptions=True):
            if isinstance(result, StatsSnapshot):
                snapshots.setdefault(result.dispatcher_id, result)
        return main, list(snapshots.values())

    async def overview_point(self, session: Session, window: Window) -> dict[str, Any]:
        """One point of the overview's live charts: rates, latency percentiles, depth by state."""
        main, snapshots = await self.snapshots(session)
        point = window.add(sample_of(snapshots, main.sampled_at_ms or wall_ms()))
        point["depth"] = depth_by_state(main.queues)
        point["oldest_ready_age_ms"] = max((q.oldest_ready_age_ms for q in main.queues), default=0)
        point["processes"] = len(snapshots)
        return point

    # -- queues -------------------------------------------------------------------------------

    async def queues(self, session: Session) -> list[dict[str, Any]]:
        """Every type x priority class: depth by state, oldest ready age, paused, and the type's rates
        since this user's previous look."""
        main, snapshots = await self.snapshots(session)
        try:
            infos = {q.job_type: q for q in await self.client(session).list_queues()}
        except Exception:  # flow settings are extra: the depth table stands without them
            infos = {}
        memory = self._rates_memory(session, snapshots)
        per_type = _type_rates(memory) or {name: dict.fromkeys(RATE_FIELDS, 0.0) for name in memory[2]}
        rows: dict[tuple[str, str], dict[str, Any]] = {}
        for q in main.queues:
            rows[(q.type, q.priority)] = {**asdict(q)}
        for name, info in infos.items():
            for prio in PRIORITIES:
                if (name, prio) not in rows and prio in info.settings.paused:
                    rows[(name, prio)] = asdict(QueueStats(name, prio, 0, 0, 0, 0, 0))
        # A type with nothing queued now but with work counted (or settings) still gets a row, for
        # its rates and its pause button; its priority "" stands for every class.
        for name in sorted((set(per_type) | set(infos)) - {t for t, _ in rows}):
            rows[(name, "")] = asdict(QueueStats(name, "", 0, 0, 0, 0, 0))
        out = []
        order = {p: i for i, p in enumerate(("", *PRIORITIES))}
        for (name, prio), row in sorted(rows.items(), key=lambda kv: (kv[0][0], order.get(kv[0][1], 9))):
            info = infos.get(name)
            paused = set(info.settings.paused) if info else set()
            row["paused"] = paused >= set(PRIORITIES) if not prio else prio in paused
            row["rates"] = per_type.get(name, dict.fromkeys(RATE_FIELDS, 0.0))
            out.append(row)
        return out

    def _rates_memory(
        self, session: Session, snapshots: list[StatsSnapshot]
    ) -> tuple[float, dict[str, dict[str, int]], dict[str, dict[str, int]]]:
        """(seconds since this user's previous look, the per-type counts then, now's). After a
        process restarted (another start time), the counts begin anew: no rates this once."""
        now_ms = max((s.sampled_at_ms for s in snapshots), default=wall_ms())
        starts = {s.dispatcher_id: s.started_at_ms for s in snapshots}
        counts: dict[str, dict[str, int]] = {}
        for snap in snapshots:
            for name, c in snap.counters.items():
                row = counts.setdefault(name, dict.fromkeys(RATE_FIELDS, 0))
                for field in RATE_FIELDS:
                    row[field] += getattr(c, field)
        key = session.token + "\0" + session.name
        previous = self._last_looks.get(key)
        self._last_looks[key] = (now_ms, starts, counts)
        self._last_looks.move_to_end(key)
        while len(self._last_looks) > MAX_REMEMBERED_LOOKS:
            self._last_looks.popitem(last=False)
        if previous is None or previous[1] != starts:
            return 0.0, counts, counts
        return (now_ms - previous[0]) / 1000, previous[2], counts

    async def pause_queue(
        self, session: Session, name: str, prio: str | None, *, pause: bool
    ) -> dict[str, Any]:
        client = self.client(session)
        call = client.pause_queue if pause else client.resume_queue
        info = await call(name, prio)
        return {"type": info.job_type, "paused": list(info.settings.paused)}

    # -- jobs ---------------------------------------------------------------------------------

    async def job(self, session: Session, ident: str) -> dict[str, Any]:
        return job_dict(await self.client(session).get_job(job_id(ident)), full=True)

    async def cancel(self, session: Session, ident: str) -> dict[str, Any]:
        status = await self.client(session).cancel(job_id(ident))
        return {"id": ident, "status": status}

    async def run_now(self, session: Session, ident: str) -> dict[str, Any]:
        """A delayed job (waiting for its time, or for its retry) runs now: the bulk run-now action
        over a filter that selects this job alone (its type, delayed, created in its id's
        millisecond), refused when the dry run finds another job it cannot tell apart."""
        client = self.client(session)
        job = await client.get_job(job_id(ident))
        if job.status != "delayed":
            raise HTTPProblem(409, f"run now: the job is {job.status}; only a delayed job can run now")
        created_s = _id_millis(ident) / 1000
        only = JobFilter(
            types=(job.type,),
            statuses=("delayed",),
            created_after=created_s,
            created_before=created_s + 0.001,
        )
        found = await client.bulk_jobs("run_now", only, dry_run=True)
        if found.matched != 1:
            raise HTTPProblem(
                409,
                f"run now: {found.matched} delayed jobs share its type and millisecond; use the search",
            )
        done = await client.bulk_jobs("run_now", only)
        return {"id": ident, "ran_now": done.touched}

    async def requeue(self, session: Session, ident: str) -> dict[str, Any]:
        n = await self.client(session).requeue_dead([job_id(ident)])
        return {"id": ident, "requeued": n}

    async def search(
        self, session: Session, inputs: dict[str, str], *, limit: int, cursor: str, oldest_first: bool
    ) -> dict[str, Any]:
        page = await self.client(session).list_jobs(
            job_filter(inputs), limit=limit, cursor=cursor, oldest_first=oldest_first,
            max_payload_bytes=256, with_total=True,
        )  # fmt: skip
        return {
            "jobs": [job_dict(j) for j in page.jobs],
            "next_cursor": page.next_cursor,
            "total": page.total,
            "total_exact": page.total_exact,
        }

    async def bulk(
        self, session: Session, action: str, inputs: dict[str, str], *, dry_run: bool
    ) -> dict[str, Any]:
        if action not in BULK_ACTIONS:
            raise BadInput(f"action: one of {', '.join(BULK_ACTIONS)}")
        chosen = job_filter(inputs)
        if chosen == JobFilter() and not dry_run and inputs.get("all") not in ("1", "true"):
            raise BadInput(f"an empty filter selects every job: send all=true to {action} them all")
        found = await self.client(session).bulk_jobs(action, chosen, dry_run=dry_run)
        return {"action": action, "dry_run": dry_run, **asdict(found)}

    # -- dead letters -------------------------------------------------------------------------

    async def dead(
        self, session: Session, name: str | None, reason: str | None, after: str, limit: int
    ) -> dict[str, Any]:
        jobs = await self.client(session).dead_letters(
            job_type=name, reason=reason, limit=limit, after_id=after
        )
        return {
            "jobs": [job_dict(j) for j in jobs],
            "next_after": jobs[-1].id if len(jobs) == limit else "",
        }

    async def dead_count(self, session: Session, name: str | None, reason: str | None) -> dict[str, Any]:
        """How many dead jobs match (the dry run of a bulk action): the search's count, exact, or
        (``at_least``) not exact: over what the database counts quickly, a bound or an estimate."""
        found = await self.client(session).list_jobs(
            JobFilter(types=(name,) if name else (), statuses=("dead",), dead_reason=reason or ""),
            limit=1, with_total=True,
        )  # fmt: skip
        total = found.total or 0
        return {"count": total, "at_least": not found.total_exact}

    async def requeue_dead(self, session: Session, name: str | None, reason: str | None) -> dict[str, Any]:
        n = await self.client(session).requeue_dead(all=True, job_type=name, reason=reason)
        return {"requeued": n}

    async def purge_dead(self, session: Session, name: str | None, reason: str | None) -> dict[str, Any]:
        n = await self.client(session).purge_dead(job_type=name, reason=reason)
        return {"purged": n}

    # -- schedules ----------------------------------------------------------------------------

    async def schedules(self, session: Session) -> list[dict[str, Any]]:
        client = self.client(session)
        found = await client.schedules()
        wanted = found[:MAX_SCHEDULES_WITH_OCCURRENCES]
        nexts = await asyncio.gather(
            *(client.next_occurrences(s.name, NEXT_OCCURRENCES) for s in wanted if s.enabled),
            return_exceptions=True,
        )
        by_name = dict(zip([s.name for s in wanted if s.enabled], nexts, strict=True))
        out = []
        for s in found:
            row = asdict(s)
            row.pop("payload")
            zone = _zone(s.timezone)
            found_next = by_name.get(s.name)
            times = found_next[0] if isinstance(found_next, tuple) else []
            row["next"] = [{"utc": _iso(ms), "local": _iso(ms, zone)} for ms in times]
            row["last_run_utc"] = _iso(s.last_occurrence_ms)
            out.append(row)
        return out

    async def pause_schedule(self, session: Session, name: str, *, pause: bool) -> dict[str, Any]:
        client = self.client(session)
        call = client.pause_schedule if pause else client.resume_schedule
        s = await call(schedule_name(name))
        return {"name": s.name, "enabled": s.enabled}

    async def run_schedule_now(self, session: Session, name: str) -> dict[str, Any]:
        """Enqueues one job as the schedule's next occurrence would be (its type, payload, priority,
        attempts and lease), now; the schedule's own timing is left as it is."""
        client = self.client(session)
        s = await client.get_schedule(schedule_name(name))
        options: dict[str, Any] = {"priority": s.priority}
        if s.max_attempts:
            options["max_attempts"] = s.max_attempts
        if s.lease_ttl_ms:
            options["lease_ttl"] = s.lease_ttl_ms / 1000
        ident = await client.enqueue(s.job_type, s.payload, **options)
        return {"name": s.name, "job_id": ident}

    # -- workers and shards -------------------------------------------------------------------

    async def workers(self, session: Session) -> list[dict[str, Any]]:
        addresses = await self._members(session)
        calls = [self.client(session, a).workers() for a in addresses] or [self.client(session).workers()]
        out = []
        for result in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(result, BaseException):
                continue  # a member that does not answer now: its workers show once it does
            out.extend(asdict(w) for w in result)
        return sorted(out, key=lambda w: (w["worker_id"], w["dispatcher_id"]))

    async def shards(self, session: Session) -> dict[str, Any]:
        view = await self.client(session).shard_map()
        return {
            "shard_count": view.shard_count,
            "members": [asdict(m) for m in view.members],
            "shards": [asdict(s) for s in view.shards],
        }

    async def rebalance(self, session: Session, *, dry_run: bool) -> dict[str, Any]:
        plan = await self.client(session).rebalance(dry_run=dry_run)
        return {"applied": plan.applied, "moves": [asdict(m) for m in plan.moves]}


def depth_by_state(queues: tuple[QueueStats, ...] | list[QueueStats]) -> dict[str, int]:
    depth = dict.fromkeys(STATES, 0)
    for q in queues:
        for state in STATES:
            depth[state] += getattr(q, state)
    return depth


def _type_rates(
    memory: tuple[float, dict[str, dict[str, int]], dict[str, dict[str, int]]],
) -> dict[str, dict[str, float]]:
    seconds, before, now = memory
    if seconds <= 0:
        return {}
    return {
        name: {f: round(max(0, counts[f] - before.get(name, {}).get(f, 0)) / seconds, 2) for f in RATE_FIELDS}
        for name, counts in now.items()
    }


_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def _id_millis(ident: str) -> int:
    """The milliseconds in a job id (its first 10 Crockford base32 characters, as in a ULID): when
    it was made, or a schedule's occurrence for its jobs. What the search's created filter reads."""
    value = 0
    for ch in ident[:10].upper():
        value = value * 32 + _CROCKFORD.index(ch)
    return value


def _zone(name: str) -> ZoneInfo | None:
    try:
        return ZoneInfo(name) if name else None
    except (ZoneInfoNotFoundError, ValueError):
        return None

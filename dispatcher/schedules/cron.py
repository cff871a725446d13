"""Cron expressions in a time zone, turned into occurrence instants (UTC milliseconds). No I/O.

Syntax: standard 5 fields (minute hour day-of-month month day-of-week), or 6 with a leading
seconds field (as Quartz, Spring and BullMQ write it), or an alias (@yearly, @annually, @monthly,
@weekly, @daily, @midnight, @hourly). Matching uses croniter on local wall-clock time.

Days, the rule of Vixie cron and cronie: when the day-of-month and the day-of-week fields are both
restricted, a day matching either field runs; when either begins with ``*`` (``*``, ``*/2``) or is
``?``, a day must match both. ``L``, ``nL`` (the last weekday n of the month) and ``n#k`` (its k-th)
are day values like any other under this rule, and an equal range (``5-5``) is that one value.
croniter decides neither the same way, so the expression is cut into arms, each with at most one
restricted day field or with days that must match both, and the arms' times are merged.

Daylight-saving time, the rule of Vixie cron (the cron of most Unix systems):
- A *fixed-time* schedule (its hour field names hours, e.g. ``30 2 * * *``) runs once per
  matching local time. When that time does not exist (spring forward) it runs at the instant the
  clocks jump, once; when it happens twice (fall back) it runs at the first of them only.
- An *interval* schedule (its hour field starts with ``*``, e.g. ``*/15 * * * *``) follows elapsed
  time: local times that do not exist are not run, and the repeated hour runs in both passes.
So no schedule ever runs twice for one wall-clock time, and none is silently skipped.
"""

from __future__ import annotations

import functools
import heapq
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from croniter.croniter import CroniterBadDateError, CroniterError

from shardq_common.clock import wall_ms

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
MAX_EXPRESSION_LENGTH = 200
NEVER_FIRES_YEARS = 5  # an expression with no occurrence this far ahead is refused
_UTC = UTC
_HASH_OR_RANDOM = re.compile(r"(?<![A-Z])[HR](?![A-Z])")
_EPOCH = datetime(1970, 1, 1)  # noqa: DTZ001 - naive on purpose: local and UTC wall times
_WEEKDAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
_LAST_WEEKDAY = re.compile(r"([0-7]|SUN|MON|TUE|WED|THU|FRI|SAT)L", re.IGNORECASE)
_EQUAL_RANGE = re.compile(r"(\w+)-\1(/\d+)?", re.IGNORECASE)
_UNRESTRICTED_DAYS = ("*", "?")


class CronError(ValueError):
    """A bad expression or zone; the message says what is wrong."""


def parse_zone(name: str) -> ZoneInfo:
    name = name or "UTC"
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise CronError(f"unknown time zone {name[:60]!r} (use an IANA name such as Europe/Berlin)") from None


def normalize(expression: str) -> str:
    """The expression in its 5- or 6-field form; raises CronError naming what is wrong."""
    text = " ".join(expression.split())
    if not text:
        raise CronError("empty cron expression")
    if len(text) > MAX_EXPRESSION_LENGTH:
        raise CronError(f"cron expression longer than {MAX_EXPRESSION_LENGTH} characters")
    if text.startswith("@"):
        if text.lower() not in ALIASES:
            raise CronError(f"unknown cron alias {text[:40]!r} (known: {', '.join(sorted(ALIASES))})")
        return ALIASES[text.lower()]
    fields = text.split(" ")
    if len(fields) not in (5, 6):
        raise CronError(
            f"cron expression {text[:60]!r} has {len(fields)} fields; expected 5 "
            "(minute hour day-of-month month day-of-week) or 6 (with a leading seconds field)"
        )
    if _HASH_OR_RANDOM.search(text.upper()):
        # croniter's H (hash) and R (random) would give each process its own occurrences.
        raise CronError(f"cron expression {text[:60]!r}: the H and R extensions are not supported")
    for arm in croniter_arms(text):
        try:
            croniter(arm, _EPOCH, second_at_beginning=len(fields) == 6, day_or=False)
        except (CroniterError, ValueError, KeyError) as exc:
            # croniter quotes the arm it was given; the user wrote the whole expression
            problem = re.sub(re.escape(f"[{arm}]"), f"[{text}]", str(exc), flags=re.IGNORECASE)
            raise CronError(f"bad cron expression {text[:60]!r}: {problem}") from None
    return text


def croniter_arms(expression: str) -> list[str]:
    """croniter expressions whose times together are the 5- or 6-field `expression`'s, under Vixie
    cron's day rule (see the module docstring); croniter matches each with day_or=False."""
    fields = [",".join(_vixie_term(term) for term in field.split(",")) for field in expression.split(" ")]
    dom_at = 3 if len(fields) == 6 else 2
    dow_at = dom_at + 2
    dom, dow = fields[dom_at], fields[dow_at]
    # croniter refuses plain weekdays and nth weekdays in one field: a day matching either runs, so
    # each kind gets an arm of its own.
    dow_terms = dow.split(",")
    nth = [t for t in dow_terms if "#" in t or t.upper().startswith("L")]
    dow_parts = [",".join(part) for part in ([t for t in dow_terms if t not in nth], nth) if part]
    if dom.startswith(_UNRESTRICTED_DAYS) or dow.startswith(_UNRESTRICTED_DAYS):
        days = [(dom, part) for part in dow_parts]  # a day must match both fields
    else:
        days = [(dom, "*")] + [("*", part) for part in dow_parts]  # a day matching either runs
    arms = []
    for dom_field, dow_field in days:
        fields[dom_at], fields[dow_at] = dom_field, dow_field
        arms.append(" ".join(fields))
    return arms


def _vixie_term(term: str) -> str:
    """One list term of a field in croniter's spelling of its Vixie meaning."""
    if _EQUAL_RANGE.fullmatch(term):  # croniter reads "5-5" as the whole cycle
        return term.split("-", 1)[0]
    if last := _LAST_WEEKDAY.fullmatch(term):  # the last weekday n of the month: croniter writes "Ln"
        day = last.group(1).upper()
        return f"L{_WEEKDAYS.index(day) if day in _WEEKDAYS else int(day) % 7}"
    return term


@dataclass(frozen=True)
class Cron:
    """One cron expression in one zone."""

    expression: str
    zone_name: str = "UTC"

    @classmethod
    def parse(cls, expression: str, zone_name: str = "UTC") -> Cron:
        cron = cls(normalize(expression), parse_zone(zone_name).key)
        if cron.first_after(wall_ms(), horizon_ms=NEVER_FIRES_YEARS * 366 * 86_400_000) is None:
            raise CronError(f"cron expression {expression[:60]!r} never fires")
        return cron

    @cached_property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.zone_name)

    @cached_property
    def has_seconds(self) -> bool:
        return len(self.expression.split(" ")) == 6

    @cached_property
    def arms(self) -> list[str]:
        return croniter_arms(self.expression)

    @cached_property
    def is_interval(self) -> bool:
        """Its hour field starts with '*': it follows elapsed time across DST changes."""
        hour = self.expression.split(" ")[2 if self.has_seconds else 1]
        return hour.startswith("*")

    def occurrences(self, after_ms: int, until_ms: int, limit: int) -> list[int]:
        """Up to `limit` occurrence instants in (after_ms, until_ms], ascending."""
        out: list[int] = []
        for instant in self._instants(after_ms):
            if instant > until_ms or len(out) >= limit:
                break
            out.append(instant)
        return out

    def first_after(self, after_ms: int, horizon_ms: int = 400 * 86_400_000) -> int | None:
        found = self.occurrences(after_ms, after_ms + horizon_ms, 1)
        return found[0] if found else None

    def _instants(self, after_ms: int) -> Iterator[int]:
        """Every occurrence instant after `after_ms`, ascending, each once.

        Local times map to instants monotonically except around a fall-back, where a later local
        time can be an earlier instant. So candidates go through a heap, and one is released once no
        later local time can map to an instant before it (local time minus the zone's largest
        nearby UTC offset bounds every later instant from below)."""
        # A local time l runs at l - offset(l), so only local times after `after` plus the zone's
        # smallest nearby offset can run after `after`: start there.
        low, _ = self._offset_bounds(after_ms)
        start_local = _EPOCH + timedelta(milliseconds=after_ms) + low
        heap: list[int] = []
        last = after_ms
        for local in self._local_times(start_local):
            for instant in self._resolve(local):
                if instant > after_ms:
                    heapq.heappush(heap, instant)
            floor = _ms(local - self._offset_bounds(_ms(local))[1]) - 1000
            while heap and heap[0] <= floor:
                instant = heapq.heappop(heap)
                if instant > last:  # a gap's times can all resolve to the same instant
                    last = instant
                    yield instant
        yield from sorted(i for i in set(heap) if i > last)

    def _local_times(self, start_local: datetime) -> Iterator[datetime]:
        """Every matching local wall-clock time after `start_local`, ascending, each once."""
        previous = None
        for local in heapq.merge(*(self._arm_times(arm, start_local) for arm in self.arms)):
            if local != previous:  # a day can match several arms
                previous = local
                yield local

    def _arm_times(self, arm: str, start_local: datetime) -> Iterator[datetime]:
        it = croniter(arm, start_local, second_at_beginning=self.has_seconds, day_or=False)
        while True:
            try:
                yield it.get_next(datetime)
            except CroniterBadDateError:  # no further match (e.g. 30 February)
                return

    def _resolve(self, local: datetime) -> list[int]:
        """The instants at which the local wall-clock time `local` runs (see the module's rule)."""
        first = local.replace(tzinfo=self.zone, fold=0)
        second = local.replace(tzinfo=self.zone, fold=1)
        a, b = (
            _ms(first.astimezone(_UTC).replace(tzinfo=None)),
            _ms(second.astimezone(_UTC).replace(tzinfo=None)),
        )
        if a == b:
            return [a]
        if a < b:  # happens twice (fall back): fold 0 is the first pass
            return [a, b] if self.is_interval else [a]
        # Does not exist (spring forward): fold 0 resolves past the gap, fold 1 before it.
        return [] if self.is_interval else [self._transition(b, a)]

    def _transition(self, before_ms: int, after_ms: int) -> int:
        """The instant in (before_ms, after_ms] at which the zone's offset changes (the clocks jump)."""
        offset = self._offset_at(before_ms)
        lo, hi = before_ms, after_ms
        while hi - lo > 1000:
            mid = (lo + hi) // 2 // 1000 * 1000
            if mid <= lo:
                break
            if self._offset_at(mid) == offset:
                lo = mid
            else:
                hi = mid
        return hi

    def _offset_at(self, instant_ms: int) -> timedelta:
        return datetime.fromtimestamp(instant_ms / 1000, self.zone).utcoffset() or timedelta(0)

    def _offset_bounds(self, instant_ms: int) -> tuple[timedelta, timedelta]:
        """The smallest and largest UTC offset of the zone within a day of the instant."""
        return _offset_bounds(self.zone_name, instant_ms // 86_400_000)


@functools.lru_cache(maxsize=4096)
def _offset_bounds(zone_name: str, day: int) -> tuple[timedelta, timedelta]:
    zone = ZoneInfo(zone_name)
    offsets = [
        datetime.fromtimestamp((day + d) * 86_400 + h * 3600, zone).utcoffset() or timedelta(0)
        for d in (-1, 0, 1, 2)
        for h in (0, 6, 12, 18)
    ]
    return min(offsets), max(offsets)


def _ms(naive_utc: datetime) -> int:
    delta = naive_utc - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000

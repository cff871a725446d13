"""Cron expressions to occurrence instants: syntax, refusals, and the daylight-saving rule."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim, CronSimError
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.queue.ids import occurrence_job_id, time_of
from dispatcher.schedules.cron import Cron, CronError, normalize


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def local(instant_ms: int, zone: str) -> str:
    return datetime.fromtimestamp(instant_ms / 1000, ZoneInfo(zone)).isoformat()


def day_of(cron: Cron, start: str, hours: int = 30) -> list[str]:
    a = ms(start)
    return [local(i, cron.zone_name) for i in cron.occurrences(a, a + hours * 3_600_000, 1000)]


def test_five_fields_six_with_leading_seconds_and_aliases() -> None:
    start = ms("2026-06-01T10:00:00+00:00")
    assert Cron.parse("*/20 * * * *").occurrences(start, start + 3_600_000, 3) == [
        start + 20 * 60_000,
        start + 40 * 60_000,
        start + 60 * 60_000,
    ]
    assert Cron.parse("*/15 * * * * *").occurrences(start, start + 60_000, 3) == [
        start + 15_000,
        start + 30_000,
        start + 45_000,
    ]
    assert Cron.parse("@hourly").occurrences(start, start + 7_200_000, 5) == [
        start + 3_600_000,
        start + 7_200_000,
    ]
    assert Cron.parse("@daily", "Europe/Berlin").first_after(start) == ms("2026-06-02T00:00:00+02:00")
    assert Cron.parse("0 9 * MAR THU-FRI").expression == "0 9 * MAR THU-FRI"


@pytest.mark.parametrize(
    ("expression", "zone", "message"),
    [
        ("", "UTC", "empty cron expression"),
        ("61 * * * *", "UTC", "bad cron expression '61 * * * *'"),
        ("* * *", "UTC", "has 3 fields; expected 5"),
        ("* * * * * * *", "UTC", "has 7 fields"),
        ("@sometimes", "UTC", "unknown cron alias '@sometimes'"),
        ("0 0 30 2 *", "UTC", "never fires"),
        ("0 8 15 * 5#6", "UTC", "bad cron expression '0 8 15 * 5#6'"),
        ("0 8 15 * 8L", "UTC", "bad cron expression '0 8 15 * 8L'"),
        ("H * * * *", "UTC", "H and R extensions are not supported"),
        ("* * * * *", "Mars/Olympus", "unknown time zone 'Mars/Olympus'"),
        ("* * * * *", "../../etc/passwd", "unknown time zone"),
        ("x" * 300, "UTC", "longer than 200 characters"),
    ],
)
def test_bad_expressions_and_zones_are_refused_with_what_is_wrong(
    expression: str, zone: str, message: str
) -> None:
    with pytest.raises(CronError, match=message.replace("*", r"\*")):
        Cron.parse(expression, zone)


# The DST rule (docs/cron.md): a fixed-time schedule runs once per local time, at the jump when the
# time does not exist and at the first pass when it happens twice; an interval schedule follows
# elapsed time.


@pytest.mark.parametrize(
    ("zone", "spring", "offsets"),
    [
        ("Europe/Berlin", "2026-03-29", ("+01:00", "+02:00")),  # 02:00 -> 03:00
        ("America/New_York", "2026-03-08", ("-05:00", "-04:00")),  # 02:00 -> 03:00
    ],
)
def test_fixed_time_in_the_skipped_hour_runs_once_at_the_jump(
    zone: str, spring: str, offsets: tuple[str, str]
) -> None:
    winter, summer = offsets
    runs = day_of(Cron.parse("30 2 * * *", zone), f"{spring}T00:00:00{winter}", hours=48)
    # 02:30 does not exist on the spring-forward day: it runs once, at 03:00 (the jump).
    assert runs == [f"{spring}T03:00:00{summer}", runs[1]]
    assert runs[1].endswith(f"T02:30:00{summer}")


@pytest.mark.parametrize(
    ("zone", "expression", "fall", "first_pass"),
    [
        ("Europe/Berlin", "30 2 * * *", "2026-10-25", "2026-10-25T02:30:00+02:00"),  # 03:00 -> 02:00
        ("America/New_York", "30 1 * * *", "2026-11-01", "2026-11-01T01:30:00-04:00"),  # 02:00 -> 01:00
    ],
)
def test_fixed_time_in_the_repeated_hour_runs_once_at_the_first_pass(
    zone: str, expression: str, fall: str, first_pass: str
) -> None:
    a = ms(f"{fall}T00:00:00+00:00") - 12 * 3_600_000
    runs = [local(i, zone) for i in Cron.parse(expression, zone).occurrences(a, a + 36 * 3_600_000, 10)]
    on_the_day = [r for r in runs if r.startswith(fall)]
    assert on_the_day == [first_pass]


def test_interval_schedules_follow_elapsed_time_across_both_changes() -> None:
    cron = Cron.parse("*/30 * * * *", "Europe/Berlin")
    spring = day_of(cron, "2026-03-29T01:00:00+01:00", hours=2)
    assert spring == [
        "2026-03-29T01:30:00+01:00",
        "2026-03-29T03:00:00+02:00",  # 02:00 and 02:30 do not exist, and are not made up
        "2026-03-29T03:30:00+02:00",
        "2026-03-29T04:00:00+02:00",
    ]
    fall = day_of(cron, "2026-10-25T01:45:00+02:00", hours=3)[:5]
    assert fall == [
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:30:00+02:00",
        "2026-10-25T02:00:00+01:00",  # the repeated hour runs again: it is real elapsed time
        "2026-10-25T02:30:00+01:00",
        "2026-10-25T03:00:00+01:00",
    ]


@settings(max_examples=60, deadline=None)
@given(
    expression=st.sampled_from(
        ["*/7 * * * *", "30 2 * * *", "0 */3 * * *", "15 1-3 * * 0", "*/20 * * * * *"]
    ),
    zone=st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"]),
    start=st.integers(ms("2026-01-01T00:00:00+00:00"), ms("2027-12-31T00:00:00+00:00")),
)
def test_occurrences_are_ascending_unique_and_resumable(expression: str, zone: str, start: int) -> None:
    """Whatever the zone and the moment, instants are strictly ascending, and computing the rest
    from any occurrence onward gives the same instants as one long computation (the scheduler's
    cursor relies on it)."""
    cron = Cron.parse(expression, zone)
    whole = cron.occurrences(start, start + 2 * 86_400_000, 300)
    assert whole == sorted(set(whole))
    if len(whole) > 3:
        cut = whole[len(whole) // 2]
        assert cron.occurrences(cut, whole[-1], 300) == [i for i in whole if i > cut]


def test_an_occurrence_has_one_job_id_and_another_version_another() -> None:
    at = ms("2026-06-01T10:00:00+00:00")
    first = occurrence_job_id("nightly", 1, at)
    assert first == occurrence_job_id("nightly", 1, at)
    assert len(first) == 26
    assert time_of(first) == at  # the occurrence is readable from the id
    assert occurrence_job_id("nightly", 2, at) != first
    assert occurrence_job_id("nightly", 1, at + 1000) != first
    assert occurrence_job_id("nightly", 1, at) < occurrence_job_id("nightly", 1, at + 1000)  # time-ordered


def test_utc_is_unaffected() -> None:
    start = int(datetime(2026, 3, 29, tzinfo=UTC).timestamp() * 1000)
    assert len(Cron.parse("30 * * * *").occurrences(start, start + 86_400_000, 100)) == 24


# Day matching is Vixie cron's (docs/cron.md): when the day-of-month and the day-of-week fields
# are both restricted, a day matching either runs; when either begins with '*' (or is '?'), a day
# must match both.


def dates_of(expression: str, start: str = "2026-01-01", count: int = 8) -> list[str]:
    cron = Cron.parse(expression)
    found = cron.occurrences(ms(f"{start}T00:00:00+00:00"), ms("2030-01-01T00:00:00+00:00"), count)
    return [datetime.fromtimestamp(i / 1000, UTC).strftime("%a %m-%d") for i in found]


@pytest.mark.parametrize(
    ("expression", "dates"),
    [
        # the 15th, or the fourth Friday
        ("0 8 15 * 5#4", ["Thu 01-15", "Fri 01-23", "Sun 02-15", "Fri 02-27", "Sun 03-15", "Fri 03-27"]),
        ("0 8 15 * FRI#4", ["Thu 01-15", "Fri 01-23", "Sun 02-15", "Fri 02-27", "Sun 03-15", "Fri 03-27"]),
        # the last day of the month, or its last Friday (Quartz's spelling '5L', cron's day numbers)
        ("0 8 L * 5L", ["Fri 01-30", "Sat 01-31", "Fri 02-27", "Sat 02-28", "Fri 03-27", "Tue 03-31"]),
        ("0 8 * * 5L", ["Fri 01-30", "Fri 02-27", "Fri 03-27", "Fri 04-24", "Fri 05-29", "Fri 06-26"]),
        # the 1st or 15th, or a Monday, or the fourth Friday: a list may mix plain and nth weekdays
        (
            "0 8 1,15 * MON,5#4",
            ["Thu 01-01", "Mon 01-05", "Mon 01-12", "Thu 01-15", "Mon 01-19", "Fri 01-23"],
        ),
        # '*/10' begins with '*': a day must match both, so a Monday that is the 1st, 11th, 21st or 31st
        ("0 8 */10 * 1", ["Mon 05-11", "Mon 06-01", "Mon 08-31", "Mon 09-21", "Mon 12-21", "Mon 01-11"]),
        ("0 8 1 * */7", ["Sun 02-01", "Sun 03-01", "Sun 11-01", "Sun 08-01"]),
        # '1-31' does not begin with '*': every day matches it, so every day runs
        ("0 8 1-31 * 1", ["Thu 01-01", "Fri 01-02", "Sat 01-03", "Sun 01-04", "Mon 01-05", "Tue 01-06"]),
        # an equal range is that one value
        ("0 8 5-5 * *", ["Mon 01-05", "Thu 02-05", "Thu 03-05", "Sun 04-05", "Tue 05-05", "Fri 06-05"]),
        ("0 8 * * 2-2", ["Tue 01-06", "Tue 01-13", "Tue 01-20", "Tue 01-27", "Tue 02-03", "Tue 02-10"]),
        # '?' (Quartz's "no specific value") is unrestricted, as '*' is
        ("0 8 ? * 1", ["Mon 01-05", "Mon 01-12", "Mon 01-19", "Mon 01-26", "Mon 02-02", "Mon 02-09"]),
    ],
)
def test_day_of_month_and_day_of_week_match_as_in_vixie_cron(expression: str, dates: list[str]) -> None:
    assert dates_of(expression, count=len(dates)) == dates


# The same rule checked against cronsim, an independent implementation written to match Debian's cron
# (Vixie cron with its day rule; it accepts L, nL and n#k as shardq does). cronsim walks local wall-clock
# time; the DST rule of docs/cron.md then says at which instants each local time runs, and the
# instants shardq computes for a year must be exactly those. So day matching is compared in every
# zone, and DST only where the documented rule decides it.

ORACLE_ZONES = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",  # a 30-minute shift
    "America/Santiago",  # changes at midnight
    "America/Havana",  # changes at midnight
    "Africa/Casablanca",  # two changes around Ramadan
    "Pacific/Chatham",  # +12:45 / +13:45
    "Asia/Kolkata",
]
WEEKDAY_NAMES = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]
MONTH_NAMES = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]


def _listed(term: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(term, st.lists(term, min_size=2, max_size=3).map(",".join))


@st.composite
def _range(draw: st.DrawFn, low: int, high: int, names: list[str] | None = None, offset: int = 0) -> str:
    a = draw(st.integers(low, high))
    b = draw(st.integers(a, min(high, a + draw(st.sampled_from([0, 1, 3, 10, 31])))))
    if names and b < len(names) + offset and draw(st.booleans()):
        text = f"{names[a - offset]}-{names[b - offset]}"
    else:
        text = f"{a}-{b}"
    if draw(st.booleans()):
        text += f"/{draw(st.integers(1, 8))}"
    return text


def _value(low: int, high: int, names: list[str] | None = None) -> st.SearchStrategy[str]:
    numbers = st.integers(low, high).map(str)
    if names is None:
        return numbers
    return st.one_of(numbers, st.sampled_from(names))


DAY_OF_MONTH = st.one_of(
    st.just("*"),
    st.integers(2, 16).map(lambda k: f"*/{k}"),
    _listed(st.one_of(_value(1, 31), _value(26, 31), _range(1, 31), st.just("L"))),
    st.builds(lambda a, k: f"{a}/{k}", st.integers(1, 31), st.integers(2, 15)),
)
MONTH = st.one_of(
    st.just("*"),
    st.just("*"),
    st.integers(2, 6).map(lambda k: f"*/{k}"),
    _listed(st.one_of(_value(1, 12, MONTH_NAMES), _range(1, 12, MONTH_NAMES, offset=1))),
)
DAY_OF_WEEK = st.one_of(
    st.just("*"),
    st.integers(2, 6).map(lambda k: f"*/{k}"),
    _listed(
        st.one_of(
            _value(0, 7, WEEKDAY_NAMES),
            _range(0, 7, WEEKDAY_NAMES),
            st.builds(lambda d, n: f"{d}#{n}", _value(0, 7, WEEKDAY_NAMES), st.integers(1, 5)),
            st.integers(0, 7).map(lambda d: f"{d}L"),
        )
    ),
)
# Few times a day keep a year of occurrences quick to compute; hours 0-3 meet most DST changes.
SECOND = st.sampled_from(["0", "30", "0,30", "15"])
MINUTE = st.one_of(_value(0, 59), st.sampled_from(["0", "30", "0,30", "*/30", "15,45"]))
HOUR = st.one_of(
    _value(0, 3),
    _value(0, 23),
    st.sampled_from(["1,2", "2-3", "0-2", "*/6", "*/8", "*/12", "2/12"]),
)


@st.composite
def vixie_expressions(draw: st.DrawFn) -> str:
    fields = [draw(MINUTE), draw(HOUR), draw(DAY_OF_MONTH), draw(MONTH), draw(DAY_OF_WEEK)]
    if draw(st.integers(0, 4)) == 0:
        fields.insert(0, draw(SECOND))
    return " ".join(fields)


def _ms_of(wall: datetime, zone: ZoneInfo, fold: int) -> int:
    return int(wall.replace(tzinfo=zone, fold=fold).timestamp()) * 1000


def _jump(before_ms: int, after_ms: int, zone: ZoneInfo) -> int:
    """The instant in (before_ms, after_ms] at which the zone's offset changes."""

    def offset(instant_ms: int) -> timedelta | None:
        return datetime.fromtimestamp(instant_ms / 1000, zone).utcoffset()

    old = offset(before_ms)
    while after_ms - before_ms > 1000:
        middle = (before_ms + after_ms) // 2000 * 1000
        before_ms, after_ms = (middle, after_ms) if offset(middle) == old else (before_ms, middle)
    return after_ms


def _documented_instants(wall: datetime, zone: ZoneInfo, interval: bool) -> set[int]:
    """Where docs/cron.md says the local time `wall` runs."""
    first, second = _ms_of(wall, zone, 0), _ms_of(wall, zone, 1)
    if first == second:
        return {first}
    if first < second:  # happens twice: a fixed-time schedule runs at the first pass only
        return {first, second} if interval else {first}
    # does not exist (fold 1 maps it before the change, fold 0 after): a fixed-time schedule runs at
    # the jump, an interval schedule not at all
    return set() if interval else {_jump(second, first, zone)}


def cronsim_instants(expression: str, zone_name: str, after_ms: int, until_ms: int) -> list[int]:
    zone = ZoneInfo(zone_name)
    fields = expression.split()
    interval = fields[2 if len(fields) == 6 else 1].startswith("*")
    first = datetime.fromtimestamp(after_ms / 1000, zone).replace(tzinfo=None) - timedelta(days=2)
    last = datetime.fromtimestamp(until_ms / 1000, zone).replace(tzinfo=None) + timedelta(days=2)
    found: set[int] = set()
    for wall in CronSim(expression, first):
        if wall > last:
            break
        found |= _documented_instants(wall, zone, interval)
    return sorted(i for i in found if after_ms < i <= until_ms)


def check_against_cronsim(expression: str, zone: str, start: int) -> None:
    try:
        CronSim(expression, datetime(2026, 1, 1))  # noqa: DTZ001 - cronsim walks naive wall-clock time
    except CronSimError:  # cronsim refuses a day that never exists, e.g. "30 2 *": so does shardq
        with pytest.raises(CronError, match="never fires"):
            Cron.parse(expression, zone)
        return
    cron = Cron(normalize(expression), zone)  # not Cron.parse: an expression may fire only after years
    year_later = start + 365 * 86_400_000
    ours = cron.occurrences(start, year_later, 1_000_000)
    theirs = cronsim_instants(expression, zone, start, year_later)
    if ours != theirs:
        only_ours = sorted(set(ours) - set(theirs))[:4]
        only_theirs = sorted(set(theirs) - set(ours))[:4]
        raise AssertionError(
            f"{expression!r} in {zone}: shardq alone runs at {[local(i, zone) for i in only_ours]}, "
            f"cronsim alone at {[local(i, zone) for i in only_theirs]}"
        )


ORACLE_START = st.integers(ms("2026-01-01T00:00:00+00:00") // 1000, ms("2028-12-31T00:00:00+00:00") // 1000)


@settings(max_examples=200, deadline=None)
@given(expression=vixie_expressions(), zone=st.sampled_from(ORACLE_ZONES), start_s=ORACLE_START)
def test_a_year_of_occurrences_matches_cronsim(expression: str, zone: str, start_s: int) -> None:
    check_against_cronsim(expression, zone, start_s * 1000)


@pytest.mark.slow
@settings(max_examples=3000, deadline=None)
@given(expression=vixie_expressions(), zone=st.sampled_from(ORACLE_ZONES), start_s=ORACLE_START)
def test_a_year_of_occurrences_matches_cronsim_at_length(expression: str, zone: str, start_s: int) -> None:
    check_against_cronsim(expression, zone, start_s * 1000)

"""Cron expressions to occurrence instants: syntax, refusals, and the daylight-saving rule."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.cron import Cron, CronError
from dispatcher.ids import occurrence_job_id, time_of


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

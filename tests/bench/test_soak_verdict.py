"""The soak's verdict on synthetic series: a flat resource under bursts passes wherever the bursts
fall in the thirds (the means of thirds do not: the reason the verdict judges the levels between
bursts), a level between bursts that grows fails, one that shrinks passes, and bursts that drain
slower in the last third fail. Also: a run's samples.csv reads back as written, and the re-judging
command prints the verdict."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.cli import main
from bench.soak.samples import Sample, read_csv, write_csv
from bench.soak.verdict import bursts, judge

STEADY, BURST_RATE, DRAIN_RATE = 116.0, 10_000.0, 8_000.0
MB = 1e6


def series(
    phase: float,
    *,
    every: float = 130.0,
    burst_s: float = 40.0,
    drain_s: float = 40.0,
    minutes: float = 30.0,
    trough_growth: float = 0.0,
    slower_drain_after: float | None = None,
) -> list[Sample]:
    """Samples every 10 s of a run with a burst every ``every`` s from ``phase``: each resource sits
    at its level between bursts and climbs during a burst and its drain; the levels grow by
    ``trough_growth`` (a fraction) over the run; bursts starting after ``slower_drain_after`` take
    twice as long from their start to the end of their drain."""
    out = []
    end = minutes * 60
    for i in range(1, int(end / 10) + 1):
        t = i * 10.0
        since = (t - phase) % every if t >= phase else math.inf
        start = t - since
        drain = drain_s + (
            burst_s + drain_s if slower_drain_after is not None and start >= slower_drain_after else 0
        )
        in_burst = since < burst_s
        draining = burst_s <= since < burst_s + drain
        # a triangle: up during the burst, down during the drain
        excess = since / burst_s if in_burst else 1 - (since - burst_s) / drain if draining else 0.0
        level = 1 + trough_growth * t / end
        wobble = 1 + 0.01 * math.sin(t / 7)
        out.append(
            Sample(
                t=t,
                db_bytes=int(480 * MB * level * wobble * (1 + 0.05 * excess)),
                rows=int(250_000 * level * wobble * (1 + 0.7 * excess)),
                dead_rows=0,
                redis_bytes=int(2 * MB * level * wobble * (1 + 20 * excess)),
                dispatcher_rss=int(240 * MB * level * wobble * (1 + 0.02 * excess)),
                worker_rss=int(67 * MB * level * wobble * (1 + 0.04 * excess)),
                p50_ms=10.0 + 5000 * excess,
                p99_ms=20.0 + 9000 * excess,
                ingest_per_s=BURST_RATE if in_burst else STEADY,
                drain_per_s=DRAIN_RATE if in_burst or draining else STEADY,
                prune_per_s=STEADY,
            )
        )
    return out


def failed(samples: list[Sample], tolerance: float = 0.10) -> list[str]:
    return [c.name for c in judge(samples, tolerance, 0.50) if not c.ok]


def test_a_flat_bursty_series_passes_whatever_the_bursts_phase() -> None:
    ratios = []
    for phase in range(0, 130, 10):
        samples = series(float(phase))
        assert failed(samples) == [], phase
        redis = next(c for c in judge(samples, 0.10, 0.50) if c.name == "redis_bytes")
        ratios.append(redis.mean_last / redis.mean_second)
    # The rule alone would have failed some of these phases: the thirds hold a different
    # number of bursts (or parts of bursts) depending on where they fall.
    assert max(ratios) > 1.10 or min(ratios) < 0.90, ratios


@pytest.mark.parametrize("phase", [0.0, 50.0, 100.0])
def test_a_level_between_bursts_that_grows_slowly_fails(phase: float) -> None:
    # half again over the run: 13% from the second third's middle to the last's
    samples = series(phase, trough_growth=0.50)
    assert set(failed(samples)) == {"db_bytes", "rows", "redis_bytes", "dispatcher_rss", "worker_rss"}


def test_a_level_that_shrinks_passes() -> None:
    assert failed(series(30.0, trough_growth=-0.50)) == []


def test_bursts_that_drain_slower_in_the_last_third_fail() -> None:
    samples = series(20.0, every=200.0, slower_drain_after=1200.0)
    assert "burst_drain_s" in failed(samples)
    drains = [b.drain_s for b in bursts(samples)]
    assert min(drains) == pytest.approx(80.0, abs=10) and max(drains) == pytest.approx(160.0, abs=10), drains


def test_a_backlog_that_never_drains_in_the_last_third_fails() -> None:
    samples = series(0.0)
    for s in samples:
        if s.t >= 1200:
            s.drain_per_s = DRAIN_RATE
    assert "redis_bytes" in failed(samples)


def test_samples_read_back_and_the_judging_command_prints_the_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    samples = series(0.0)
    samples[0].p50_ms = samples[0].p99_ms = None
    write_csv(tmp_path / "samples.csv", samples)
    assert read_csv(tmp_path / "samples.csv") == samples
    main(["soak-judge", str(tmp_path)])
    printed = capsys.readouterr().out
    assert "SOAK OK" in printed and "whether every job ran is not judged" in printed
    write_csv(tmp_path / "samples.csv", series(0.0, trough_growth=0.50))
    with pytest.raises(SystemExit) as exited:
        main(["soak-judge", str(tmp_path / "samples.csv")])
    assert exited.value.code == 1
    assert "redis_bytes NOT flat" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no such file"):
        main(["soak-judge", str(tmp_path / "missing.csv")])

"""The soak's verdict: is every resource flat, did latency drift, do bursts drain as fast as before.

The issue's rule compares the mean of the run's last third with the second third's. Under a bursty
load that mean depends on where the bursts fall in each third (a burst takes Redis from 2 MB to
30-45 MB for a minute), so a flat resource can fail it and, with bursts falling the other way, a
growing one can pass it. What "flat" means for a resource under bursts is that its level between
the bursts does not grow. So the verdict:

- splits the samples into *quiet* ones (ingest and drain both near the run's steady rate) and the
  ones in a burst or its backlog's drain;
- judges each resource by the median of the quiet samples of the second and of the last third,
  one-sided: only growth beyond the tolerance fails (a resource that shrinks is not leaking);
- judges that bursts drain as fast at the end as in the middle: the median time from a burst's
  first sample to the next quiet one, last third against second (a degradation that makes bursts
  drain slower shows here, not in the levels between them);
- keeps the latency drift check (the median p50 and p99), on the quiet samples too: inside a burst
  latency is the backlog's age, which the drain check judges;
- still shows the issue's rule (the ratio of the thirds' means) beside each resource's verdict.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from .samples import LATENCIES, RESOURCES, Sample

#: a sample is quiet when its ingest and drain rates are both within this factor of the steady rate
QUIET_FACTOR = 2.0
#: ... plus this many jobs/s, so that a low steady rate's noise is not taken for a burst
QUIET_SLACK_PER_S = 50.0
#: latency within this many ms of the second third's is no drift, whatever the ratio (a 2 ms p50
#: that becomes 4 ms is noise on a shared machine, not a trend)
LATENCY_SLACK_MS = 5.0
DRAIN = "burst_drain_s"


@dataclass
class Check:
    name: str
    kind: str  # "resource", "latency" or "drain"
    second: float  # resources: the median of the third's quiet samples; latency: the median; drain: s
    last: float
    ok: bool
    mean_second: float | None = None  # resources: the issue's rule, the thirds' means
    mean_last: float | None = None
    why: str = ""

    @property
    def ratio(self) -> float:
        return self.last / self.second if self.second else float("inf") if self.last else 1.0

    def describe(self) -> str:
        if self.kind == "resource":
            means = ""
            if self.mean_second:
                means = f"; means {self.mean_last / self.mean_second:.2f}x"
            return (
                f"{self.name} {'flat' if self.ok else 'NOT flat'} ({self.ratio:.2f}x between bursts{means})"
            )
        if self.kind == "drain":
            verdict = "" if self.ok else " SLOWER"
            return f"bursts drain in {self.second:.0f}->{self.last:.0f} s{verdict}"
        return f"{self.name} {self.second:.1f}->{self.last:.1f} ms{'' if self.ok else ' DRIFTED'}"


def steady_rate(samples: list[Sample]) -> float:
    """The lower quartile of the ingest rate: the steady rate, while bursts take under 3/4 of the run."""
    rates = sorted(s.ingest_per_s for s in samples)
    return rates[len(rates) // 4] if rates else 0.0


def quiet_flags(samples: list[Sample]) -> list[bool]:
    """Whether each sample is outside the bursts and their drains."""
    limit = steady_rate(samples) * QUIET_FACTOR + QUIET_SLACK_PER_S
    return [s.ingest_per_s <= limit and s.drain_per_s <= limit for s in samples]


def third_bounds(samples: list[Sample]) -> tuple[float, float]:
    end = samples[-1].t
    return end / 3, 2 * end / 3


@dataclass
class Burst:
    start: float  # the t of its first sample that is not quiet
    drain_s: float  # from there to the first quiet sample (to the run's end if none came)
    drained: bool
    peaks: dict[str, float]  # each resource's highest sample during it


def bursts(samples: list[Sample]) -> list[Burst]:
    """The runs of samples that are not quiet: the bursts and the drains of their backlogs."""
    found: list[Burst] = []
    flags = quiet_flags(samples)
    start: int | None = None
    for i, quiet in enumerate([*flags, True]):
        if not quiet and start is None:
            start = i
        elif quiet and start is not None:
            inside = samples[start:i]
            drained = i < len(samples)
            end_t = samples[i].t if drained else samples[-1].t + _period(samples)
            peaks = {name: max(getattr(s, name) for s in inside) for name, _ in RESOURCES}
            found.append(Burst(samples[start].t, end_t - samples[start].t, drained, peaks))
            start = None
    return found


def _period(samples: list[Sample]) -> float:
    if len(samples) < 2:
        return 0.0
    return statistics.median(b.t - a.t for a, b in zip(samples, samples[1:], strict=False))


def judge(samples: list[Sample], tolerance: float, latency_tolerance: float) -> list[Check]:
    a_t, b_t = third_bounds(samples)
    flags = quiet_flags(samples)
    in_second = [a_t <= s.t < b_t for s in samples]
    in_last = [s.t >= b_t for s in samples]
    checks = []
    for name, _ in RESOURCES:
        second_quiet = [
            getattr(s, name) for s, q, w in zip(samples, flags, in_second, strict=True) if q and w
        ]
        last_quiet = [getattr(s, name) for s, q, w in zip(samples, flags, in_last, strict=True) if q and w]
        means = [
            statistics.fmean(getattr(s, name) for s, w in zip(samples, where, strict=True) if w)
            if any(where)
            else 0.0
            for where in (in_second, in_last)
        ]
        if not second_quiet or not last_quiet:
            checks.append(
                Check(name, "resource", 0.0, 0.0, False, *means, why="a third had no sample between bursts")
            )
            continue
        a, b = statistics.median(second_quiet), statistics.median(last_quiet)
        checks.append(Check(name, "resource", a, b, b <= a * (1 + tolerance), *means))
    for name, _ in LATENCIES:
        values = [getattr(s, name) for s in samples]
        a_values, b_values = (
            [v for v, q, w in zip(values, flags, where, strict=True) if q and w and v is not None]
            for where in (in_second, in_last)
        )
        if not a_values or not b_values:
            checks.append(
                Check(name, "latency", 0.0, 0.0, False, why="no latency sampled between bursts in a third")
            )
            continue
        a, b = statistics.median(a_values), statistics.median(b_values)
        checks.append(Check(name, "latency", a, b, b <= a * (1 + latency_tolerance) + LATENCY_SLACK_MS))
    checks.append(_drain_check(samples, a_t, b_t, latency_tolerance))
    return checks


def _drain_check(samples: list[Sample], a_t: float, b_t: float, latency_tolerance: float) -> Check:
    found = bursts(samples)
    second = [b.drain_s for b in found if a_t <= b.start < b_t]
    last = [b.drain_s for b in found if b.start >= b_t]
    a = statistics.median(second) if second else 0.0
    b = statistics.median(last) if last else 0.0
    # One sample of slack: a drain is measured in whole samples.
    return Check(DRAIN, "drain", a, b, b <= a * (1 + latency_tolerance) + _period(samples))


def verdict_line(
    checks: list[Check], all_ran: bool, enqueued: int, left: int | None, enough_samples: bool
) -> str:
    """The verdict line; ``left`` None: not known (a run's figures from before it was counted)."""
    ok = all(c.ok for c in checks) and all_ran and enough_samples
    by_kind = {kind: [c for c in checks if c.kind == kind] for kind in ("resource", "latency", "drain")}
    return (
        ("SOAK OK: " if ok else "SOAK FAILED: ")
        + ", ".join(c.describe() for c in by_kind["resource"])
        + "; latency "
        + ", ".join(c.describe() for c in by_kind["latency"])
        + "; "
        + ", ".join(c.describe() for c in by_kind["drain"])
        + f"; {enqueued:,} jobs enqueued"
        + ("" if left is None else f", {left:,} left unrun")
        + ("" if all_ran else ", NOT every job ran")
    )


def thirds_table(checks: list[Check]) -> list[str]:
    labels = dict([*RESOURCES, *LATENCIES, (DRAIN, "a burst's drain (median)")])
    lines = [
        "| series | second third | last third | last / second | verdict "
        "| the issue's rule: means, last / second |",
        "| --- | ---: | ---: | ---: | --- | ---: |",
    ]
    for c in checks:
        unit = (lambda v: f"{v:,.1f} ms") if c.kind == "latency" else (
            (lambda v: f"{v:,.0f} s") if c.kind == "drain" else
            (lambda v: f"{v:,.0f}") if c.name == "rows" else (lambda v: f"{v / 1e6:,.1f} MB")
        )  # fmt: skip
        ratio = f"{c.ratio:.2f}" if c.second else "-"
        verdict = ("ok" if c.ok else "FAILED") + (f" ({c.why})" if c.why else "")
        means = "-"
        if c.mean_second:
            mean_last = c.mean_last or 0.0
            means = f"{unit(c.mean_second)} → {unit(mean_last)}, {mean_last / c.mean_second:.2f}"
        lines.append(
            f"| {labels[c.name]} | {unit(c.second)} | {unit(c.last)} | {ratio} | {verdict} | {means} |"
        )
    return lines


def bursts_table(samples: list[Sample]) -> list[str]:
    """Each burst: when, how long its drain took, Redis' peak, and Redis' level before the next one."""
    flags = quiet_flags(samples)
    lines = [
        "| burst at (s) | drained in (s) | Redis peak MB | p99 peak ms "
        "| Redis between it and the next, median MB |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    found = bursts(samples)
    for i, b in enumerate(found):
        until = found[i + 1].start if i + 1 < len(found) else float("inf")
        after = [s.redis_bytes for s, q in zip(samples, flags, strict=True) if q and b.start < s.t < until]
        level = f"{statistics.median(after) / 1e6:.2f}" if after else "-"
        drained = f"{b.drain_s:.0f}" if b.drained else f"{b.drain_s:.0f}+ (run ended)"
        p99 = max((s.p99_ms or 0.0 for s in samples if b.start <= s.t <= b.start + b.drain_s), default=0.0)
        lines.append(
            f"| {b.start:.0f} | {drained} | {b.peaks['redis_bytes'] / 1e6:.1f} | {p99:,.0f} | {level} |"
        )
    return lines

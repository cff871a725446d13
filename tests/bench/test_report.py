"""The results table shows the no-op rows and the realistic-handler rows, each with its ratio, and
says which worker concurrency each system ran; the sweep command refuses bad values clearly."""

from __future__ import annotations

import pytest

from bench.cli import main
from bench.report.markdown import render, write_markdown
from bench.sizes import FULL


def _results() -> dict:
    def system(noop_rate: float, redis_rate: float, concurrency: int, p99: float) -> dict:
        return {
            "settings": {"worker_concurrency_means": "jobs each worker process runs at once"},
            "scenarios": {
                "drain": {"jobs_per_s": noop_rate, "work": "noop", "worker_concurrency": concurrency},
                "drain-redis": {"jobs_per_s": redis_rate, "work": "redis", "capped": False,
                                "worker_concurrency": concurrency // 2},
                "instant-redis": {"p50_ms": p99 / 2, "p99_ms": p99, "work": "redis",
                                  "worker_concurrency": concurrency // 2},
            },
            "errors": {},
        }  # fmt: skip

    return {
        "scenarios": ["drain", "drain-redis", "instant-redis"],
        "sizes": FULL.as_dict(),
        "systems": {"shardq": system(25_000, 8_000, 1024, 40.0), "bullmq": system(20_000, 16_000, 200, 20.0)},
        "machine": {"cpu_model": "cpu", "cores": 2, "memory_gib": 1, "os": "os", "python": "3", "node": "20"},
        "command": "python -m bench run",
        "started_at": "then",
        "quick": False,
    }


def test_the_table_has_no_op_and_realistic_rows_with_ratios(tmp_path) -> None:
    table = render(_results())
    lines = {line.split(" ↑")[0].split(" ↓")[0].strip("| "): line for line in table.splitlines()}
    assert "| 25,000 | 20,000 | 1.25x |" in lines["drain 50,000 no-op jobs, 2 worker processes (jobs/s)"]
    redis_drain = "drain 20,000 jobs or 15 s, one Redis round trip (INCR+SET) per job (jobs/s)"
    assert "| 8,000 | 16,000 | 0.50x |" in lines[redis_drain]
    lag = "1,000 due at one instant, one Redis round trip (INCR+SET) per job: start lag p50 (ms)"
    assert "| 20.0 | 10.0 | 2.00x |" in lines[lag]
    assert not any("1 ms of I/O" in line for line in lines)  # not measured: not shown

    write_markdown(tmp_path / "results.md", _results())
    notes = (tmp_path / "results.md").read_text()
    assert "Rows with no-op jobs measure the queue's own cost per job" in notes
    assert "shardq workers (jobs each worker process runs at once): no-op jobs 1,024, redis 512." in notes
    assert "bullmq workers (jobs each worker process runs at once): no-op jobs 200, redis 100." in notes


def test_a_capped_drain_says_so() -> None:
    results = _results()
    results["systems"]["bullmq"]["scenarios"]["drain-redis"].update(
        capped=True, max_seconds=15.0, started=4_321, jobs=20_000
    )
    path_notes = _notes_text(results)
    assert "bullmq drain-redis: stopped 15 s after its first start, 4,321 of 20,000 started." in path_notes


def _notes_text(results: dict) -> str:
    from bench.report.markdown import _notes

    return "\n".join(_notes(results))


@pytest.mark.parametrize("values", ["ten", "0,10", ""])
def test_sweep_refuses_a_bad_concurrency_list(values: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["sweep", "--system", "bullmq", "--concurrency", values])
    assert f"--concurrency {values!r}" in str(stopped.value)

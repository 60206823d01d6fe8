"""Micro-benchmark (an inner loop, not the service: tests/benchmarks/test_fleet_benchmark.py times
`llmslo serve` end to end): parse + normalize + delta + minute rollup of one 8-model vLLM scrape,
against prometheus_client's parser on the same payload, the two interleaved run by run so that a
slow moment of the machine weighs on both alike.

Run: .venv/bin/python -m pytest tests/benchmarks -s
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from collector.example_target import scaled_exposition
from collector.rollup import Cell, DeltaTracker, SeriesIdent
from collector.sources.vllm import new_cache, read_scrape
from collector.store.repository import OpenMinute, ScrapeCommit, Store
from tests.conftest import public_sample_section

pytestmark = pytest.mark.benchmark


def eight_model_payload(models: int = 8) -> str:
    """Section 1 of the public samples (a real vLLM scrape) with its series repeated per model."""
    out: list[str] = []
    for line in public_sample_section(1).split("\n"):
        if not line or line.startswith("#"):
            if line.startswith(("# HELP", "# TYPE")):
                out.append(line)
            continue
        out.extend(line.replace("Qwen/Qwen3-0.6B", f"org/model-{i}") for i in range(models))
    return "\n".join(out) + "\n"


def test_scrape_hot_path_against_prometheus_client_parser(tmp_path: Path) -> None:
    payload = eight_model_payload()
    samples = sum(1 for line in payload.split("\n") if line and not line.startswith("#"))
    bodies = [scaled_exposition(payload, k).encode() for k in range(1, 9)]

    def ours_cold() -> None:
        snap = read_scrape(bodies[1], "text/plain; version=0.0.4")
        deltas = DeltaTracker().observe(snap, 1000.0)
        minute: dict[SeriesIdent, Cell] = {}
        for ident, cell in deltas.cells.items():
            minute[ident] = cell

    cache, tracker = new_cache(), DeltaTracker()
    minute_cells: dict[SeriesIdent, Cell] = {}
    clock = {"t": 1000.0, "i": 0}

    def ours_warm() -> None:
        clock["t"] += 15.0
        clock["i"] += 1
        snap = read_scrape(bodies[clock["i"] % len(bodies)], "text/plain; version=0.0.4", cache)
        deltas = tracker.observe(snap, clock["t"])
        for ident, cell in deltas.cells.items():
            have = minute_cells.get(ident)
            if have is None:
                minute_cells[ident] = cell
            else:
                have.merge(cell)
        tracker.commit(deltas, clock["t"])

    store = Store(f"sqlite:///{tmp_path / 'bench.db'}")
    target_id = store.ensure_target("bench", "http://127.0.0.1:1/metrics")
    db_tracker, ids = DeltaTracker(), {}  # type: ignore[var-annotated]
    db_cache = new_cache()
    db_clock = {"t": 1000.0, "i": 0}
    open_minute = OpenMinute()

    def commit() -> None:
        """The production commit: in-memory minute merge, one transaction (a group of one)."""
        db_clock["t"] += 15.0
        db_clock["i"] += 1
        snap = read_scrape(bodies[db_clock["i"] % len(bodies)], None, db_cache)
        deltas = db_tracker.observe(snap, db_clock["t"])
        item = ScrapeCommit(target_id, deltas, snap.units, ids, db_clock["t"], open_minute, db_tracker.baseline_unix)
        store.commit_scrapes([item])
        db_tracker.commit(deltas, db_clock["t"])

    timings: dict[str, list[float]] = {"baseline": [], "cold": [], "warm": [], "commit": []}
    jobs = {
        "baseline": lambda: list(text_string_to_metric_families(payload)),
        "cold": ours_cold,
        "warm": ours_warm,
        "commit": commit,
    }
    for fn in jobs.values():
        fn()  # warm-up
    for _ in range(40):  # interleaved: every round runs each job once (warm 5 times)
        for name, fn in jobs.items():
            for _ in range(5 if name == "warm" else 1):
                t0 = time.perf_counter()
                fn()
                timings[name].append(time.perf_counter() - t0)
    store.close()
    baseline, cold, warm, with_sqlite = (statistics.median(timings[k]) * 1000 for k in jobs)

    rows = [
        ("baseline: prometheus_client text_string_to_metric_families", baseline),
        ("llmslo cold (first scrape: parse+normalize+delta+rollup)", cold),
        ("llmslo steady state (parse+normalize+delta+rollup)", warm),
        ("llmslo steady state + SQLite commit of the scrape", with_sqlite),
    ]
    print("\nMICRO-BENCHMARK (inner loop; the service end to end is the fleet benchmark)")
    print(f"payload: {len(payload) / 1024:.0f} KiB, {samples} samples, 8 models")
    print(f"{'what':58} {'median ms':>10} {'vs baseline':>12}")
    for label, ms in rows:
        print(f"{label:58} {ms:10.2f} {baseline / ms:11.1f}x")
    print(f"targets per core at a 15 s interval (steady state, before storage): {15000 / warm:,.0f}")
    assert baseline / warm >= 10.0, "goal: the steady-state hot path is at least 10x the baseline parser"

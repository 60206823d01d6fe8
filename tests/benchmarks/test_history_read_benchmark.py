"""A micro-benchmark (not the service end to end): reading one closed minute of a 1,000-target
fleet from a SQLite store that already holds hours of minute rows, as the running windows do
once a minute (`Store.read_window`), and the statement before session 12 (a start range without
the period, which the window index (period, start) cannot serve: SQLite scanned every stored row)
timed in the same run as the baseline (the same `read_window`, given the old conditions).

Run: LLMSLO_HISTORY_TARGETS=1000 LLMSLO_HISTORY_HOURS=6 .venv/bin/python -m pytest \
       tests/benchmarks/test_history_read_benchmark.py -s
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from collector.rollup import DeltaTracker
from collector.sources.vllm import read_scrape
from collector.store import repository
from collector.store.repository import OpenMinute, ScrapeCommit, Store
from collector.store.tables import rollups
from tests.benchmarks.fleet_server import Bodies

pytestmark = pytest.mark.benchmark


def test_a_closed_minute_read_with_hours_of_history(tmp_path: Path) -> None:
    n = int(os.environ.get("LLMSLO_HISTORY_TARGETS", "1000"))
    hours = float(os.environ.get("LLMSLO_HISTORY_HOURS", "6"))
    store = Store(f"sqlite:///{tmp_path / 'history.db'}")
    now = 10_000_000 // 60 * 60
    snap = read_scrape(Bodies().plain)  # the fleet benchmark's vLLM body: 24 series a target
    for i in range(n):
        target_id = store.ensure_target(f"t{i}", f"http://127.0.0.1:1/t/{i}")
        deltas = DeltaTracker().observe(snap, now + 1)
        store.commit_scrapes([ScrapeCommit(target_id, deltas, snap.units, {}, now + 1, OpenMinute(), None)])
    raw = store.engine.raw_connection()
    cursor = raw.cursor()
    ids = [row[0] for row in cursor.execute("SELECT id FROM llmslo_series")]
    started = time.perf_counter()
    for m in range(int(hours * 60)):  # minute rows before `now`, oldest last, as serve leaves them
        start = now - (m + 1) * 60
        cursor.executemany(
            "INSERT INTO llmslo_rollups VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            [(sid, 60, start, 1.0, 1.0, None, None, None, None, 0, 60.0, start + 59.0) for sid in ids],
        )
    raw.commit()
    raw.close()
    stored = len(ids) * int(hours * 60)
    fill = time.perf_counter() - started

    lo, hi = now - 120, now - 60

    def start_range_alone(start: int, end: int, period: int | None = None) -> list[Any]:
        """The conditions before session 12: the period only when one was asked for."""
        cond = [rollups.c.start_unix >= start, rollups.c.start_unix < end]
        return cond if period is None else [*cond, rollups.c.period_seconds == period]

    def baseline() -> int:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(repository, "_in_time_range", start_range_alone)
            return len(store.read_window(lo, hi))

    def production() -> int:
        return len(store.read_window(lo, hi))

    base_ms, ours_ms = [], []
    for _ in range(3):  # interleaved, so that both see the same cache and machine
        t = time.perf_counter()
        base_rows = baseline()
        base_ms.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        cells = production()
        ours_ms.append((time.perf_counter() - t) * 1000)
    store.close()
    assert base_rows == cells == len(ids)
    b, o = statistics.median(base_ms), statistics.median(ours_ms)
    print(
        f"\nHISTORY READ (micro-benchmark) {n} targets, {len(ids)} series, {hours:g} h of minute rows"
        f" ({stored:,} rows, filled in {fill:.0f} s)\n"
        f"  one closed minute, Store.read_window (the window index): median {o:.0f} ms\n"
        f"  the same read with the start range alone (before session 12): median {b:.0f} ms\n"
        f"  ratio baseline/read_window: {b / o:.1f}x"
    )

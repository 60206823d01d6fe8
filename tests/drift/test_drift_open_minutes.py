"""The drift pass takes the current window's unsettled minutes (the one being written and the one
before) from the scrapers' memory instead of reading them from the store on every pass: what it
takes must be what the store holds, row for row and signal for signal."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from collector.config import Settings
from collector.drift.engine import DRIFT_METRICS
from collector.drift.monitor import OPEN_METRICS
from collector.rollup import MINUTE_SECONDS, Row, period_start
from collector.runtime import Runtime
from tests.integration.test_fleet_correctness import body

ROOT = Path(__file__).resolve().parents[2]


def rows_key(rows: list[Row]) -> list[tuple[object, ...]]:
    return sorted(
        (r.start_unix, r.period_seconds, r.cell.target, repr(r.cell.ident), r.cell.cell.value, r.cell.cell.sum,
         tuple(r.cell.cell.buckets or ()))
        for r in rows
    )  # fmt: skip


def test_the_minutes_in_memory_are_the_stored_ones(tmp_path: Path) -> None:
    if time.time() % MINUTE_SECONDS > 45:  # the two minutes below must still be the open ones
        time.sleep(MINUTE_SECONDS - time.time() % MINUTE_SECONDS + 1)
    targets = [
        {"name": "chat-0", "url": "http://127.0.0.1:9/metrics", "business_type": "chat"},
        {"name": "chat-1", "url": "http://127.0.0.1:9/metrics", "business_type": "chat"},
        {"name": "code-0", "url": "http://127.0.0.1:9/metrics", "business_type": "code_completion"},
        {"name": "stray-0", "url": "http://127.0.0.1:9/metrics"},  # placed nowhere: no drift group
    ]
    settings = Settings.model_validate(
        {"data_dir": str(tmp_path), "rules": str(ROOT / "rules"), "targets": targets, "drift": {"enabled": True}}
    )
    rt = Runtime(settings)
    assert rt.drift is not None
    assert rt.open_rows(0, 2**40, OPEN_METRICS) is None  # not serving: memory cannot answer
    asyncio.run(rt.start())
    current = period_start(time.time())
    started = current - 3600  # long-running servers
    # two scrapes in the minute before, two in this one, with growing counts (a restart of
    # chat-1 in between: its counts start again)
    for k, t in enumerate((current - 50, current - 20, current + 5, current + 10)):
        for i, name in enumerate(rt.scrapers):
            restart = name == "chat-1" and k >= 2
            assert rt.scrapers[name].ingest(body(1 + k * (i + 1), started + (1000 if restart else 0)), None, t)
    start, end = current - MINUTE_SECONDS, current + MINUTE_SECONDS
    memory = rt.open_rows(start, end, OPEN_METRICS)
    assert memory is not None
    stored = rt.store.read_rows(start, end, metrics=DRIFT_METRICS)
    assert {r.start_unix for r in memory} == {start, current}
    assert {r.cell.target for r in memory} == set(rt.scrapers)
    assert rows_key(list(memory)) == rows_key(list(stored))
    # the drift pass's signals of those minutes, from memory and from the store
    assert rt.drift._minutes(start, end, open_rows=True) == rt.drift._minutes(start, end)
    assert rt.drift._minutes(start, end)  # (chat and code completion have signals)
    # one minute further back is not in memory: the store answers
    assert rt.open_rows(start - MINUTE_SECONDS, end, OPEN_METRICS) is None
    asyncio.run(rt.close())

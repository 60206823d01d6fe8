"""SLO evaluation at fleet history: 100 objectives x 8 windows (the Workbook's four burn-rate pairs
and the 28-day budget period) over 1, 7 and 28 days of stored rollups for 20 and 200 targets, as
`llmslo serve` stores them (minutes for the last 48 h, hours before that).

Side by side in the same run: the incremental ledger (collector/slo/ledger.py; its one-time
backfill at start-up and its steady pass, the production path through `Runtime.evaluate_slos`)
and the full re-read of the period that every pass did before (`Runtime._evaluate_from_store`).
Then a restart on the same store: the first pass of a new collector, which reads back the counts
the first one saved (collector/slo/saved.py) instead of backfilling from every stored rollup.

Run: LLMSLO_SLO_TARGETS=20,200 LLMSLO_SLO_DAYS=1,7,28 .venv/bin/python -m pytest \
       tests/benchmarks/test_slo_benchmark.py -s
"""

from __future__ import annotations

import os
import random
import resource
import statistics
import time
from collections.abc import Collection
from pathlib import Path

import pytest

from collector.config import Settings
from collector.rollup import HOUR_SECONDS, MINUTE_SECONDS, period_start
from collector.runtime import Runtime
from collector.sim.exposition import EngineMetrics, render
from collector.slo.evaluate import SloStatus
from collector.store.repository import _rollup_params, upsert_rollups

pytestmark = pytest.mark.benchmark

TYPES = 25  # x 4 objectives = 100 SLOs
FULL_RE_READ_MAX_ROWS = 3_000_000


def rules_yaml() -> str:
    lines = ["version: v1", "business_types:"]
    for i in range(TYPES):
        lines += [
            f"  type_{i}:",
            "    objectives:",
            "      - {name: ttft, sli: latency, metric: ttft, threshold: 1s, objective: 0.95}",
            "      - {name: tpot, sli: latency, metric: tpot, threshold: 100ms, objective: 0.95}",
            "      - {name: errors, sli: error_ratio, objective: 0.99}",
            "      - {name: throughput, sli: throughput, min_tokens_per_second: 5, slice: 5m, objective: 0.9}",
        ]
    return "\n".join(lines) + "\n"


SLO_SERIES = frozenset({"ttft", "tpot", "request_success", "generation_tokens"})


def fill(rt: Runtime, days: int, now: float, wanted: Collection[str] | None = SLO_SERIES) -> int:
    """History as serve leaves it: a first real scrape per target creates its series, then every
    series of `wanted` (the SLO-relevant ones; None: every series) gets a cell per minute for the
    last 48 h and per hour before that."""
    rng = random.Random(1)
    body = render("current", "m", EngineMetrics(max_model_len=4096, created_unix=now - days * 86400 - 60))
    for scraper in rt.scrapers.values():
        scraper.ingest(body, "text/plain", now - days * 86400 - 30)
    end = period_start(now)
    minutes_from = end - 48 * 3600
    periods = [(t, HOUR_SECONDS) for t in range(end - days * 86400, minutes_from, HOUR_SECONDS)]
    periods += [(t, MINUTE_SECONDS) for t in range(max(minutes_from, end - days * 86400), end, MINUTE_SECONDS)]
    written = 0
    with rt.store.engine.begin() as conn:
        for scraper in rt.scrapers.values():
            series = [
                (ident, sid)
                for ident, sid in scraper.series_ids.items()
                if wanted is None or ident.key.metric in wanted
            ]
            cells = {ident: scraper.recent[-1].cells[ident] for ident, _ in series}
            rows = []
            for t, period in periods:
                scale = period / MINUTE_SECONDS * rng.uniform(0.5, 1.5)
                for ident, sid in series:
                    cell = cells[ident].copy()
                    cell.value = 30 * scale
                    if cell.buckets is not None:
                        cell.buckets = [30 * scale * (i + 1) / len(cell.buckets) for i in range(len(cell.buckets))]
                    cell.observed_seconds = float(period)
                    rows.append(_rollup_params(sid, period, t, cell))
                if len(rows) > 50_000:
                    upsert_rollups(conn, rows)
                    written += len(rows)
                    rows = []
            upsert_rollups(conn, rows)
            written += len(rows)
    return written


def cases() -> list[tuple[int, int]]:
    targets = [int(x) for x in os.environ.get("LLMSLO_SLO_TARGETS", "20,200").split(",")]
    days = [int(x) for x in os.environ.get("LLMSLO_SLO_DAYS", "1,7,28").split(",")]
    return [(n, d) for n in targets for d in days]


def max_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def restarted(settings: Settings, now: float, before: list[SloStatus]) -> tuple[float, int | None, int]:
    """A collector restarted on the same store (its ledger live from the same minute): the
    seconds of its first pass, which reads the saved counts back, where they ended, and the
    rollup rows it counted after them. Its statuses must be the first collector's."""
    rt = Runtime(settings)
    assert rt.ledger is not None
    rt.ledger.live_since = now - 1
    t0 = time.perf_counter()
    after = rt.evaluate_slos(now + 5)
    seconds = time.perf_counter() - t0
    assert [(s.objective.slo, round(s.period.events.total, 6), round(s.period.events.good, 6)) for s in after] == [
        (s.objective.slo, round(s.period.events.total, 6), round(s.period.events.good, 6)) for s in before
    ]
    resumed, read = rt.slo_counts_resumed_from, rt.slo_backfill_rows
    rt.store.close()
    return seconds, resumed, read


@pytest.mark.parametrize(("n", "days"), cases())
def test_slo_evaluation_incremental_against_full_re_read(n: int, days: int, tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(rules_yaml())
    settings = Settings.model_validate(
        {
            "data_dir": str(tmp_path),
            "rules": str(tmp_path / "rules.yaml"),
            "targets": [
                {"name": f"t{i}", "url": f"http://127.0.0.1:1/{i}", "business_type": f"type_{i % TYPES}"}
                for i in range(n)
            ],
        }
    )
    rt = Runtime(settings)
    now = time.time()
    rows = fill(rt, days, now)
    assert rt.ledger is not None and rt.rules is not None
    rt.ledger.live_since = now - 1  # serving started just now: the history is backfilled

    rss0 = max_rss_mib()
    t0 = time.perf_counter()
    first = rt.evaluate_slos(now)  # the first pass fills the ledger from the store
    backfill = time.perf_counter() - t0
    passes = []
    for k in range(5):
        t0 = time.perf_counter()
        statuses = rt.evaluate_slos(now + 1 + k)
        passes.append(time.perf_counter() - t0)
    ledger_ms = statistics.median(passes) * 1000
    ledger_bytes = sum(
        (c.minutes.good.buffer_info()[1] + c.minutes.total.buffer_info()[1]) * 8
        + (c.hours.good.buffer_info()[1] + c.hours.total.buffer_info()[1]) * 8
        for c in [*rt.ledger.counts.values(), *rt.ledger.cache.values()]
    )
    rss1 = max_rss_mib()
    restart, resumed_from, restart_rows = restarted(settings, now, statuses)

    if rows > FULL_RE_READ_MAX_ROWS:
        # the old path holds every row of the period in memory at once (~1 KB each): skip it
        print(f"\nSLO {n} targets, {days} d: ledger backfill {backfill:.1f} s, pass {ledger_ms:.1f} ms, rings "
              f"{ledger_bytes / 2**20:.1f} MiB, peak RSS {rss0:.0f} -> {rss1:.0f} MiB; full re-read of {rows} rows "
              "not run (it would hold them all in memory)\n"
              f"  restart: {restart:.2f} s from the saved counts (up to {resumed_from}) and {restart_rows} rollup "
              f"rows; ratio backfill/restart {backfill / restart:.0f}x")  # fmt: skip
        rt.store.close()
        return
    t0 = time.perf_counter()
    want, _ = rt._evaluate_from_store(rt.rules, now + 5)
    full_ms = (time.perf_counter() - t0) * 1000
    rss2 = max_rss_mib()
    agree = sum(
        1
        for a, b in zip(statuses, want, strict=True)
        if abs(a.period.events.total - b.period.events.total) <= 1e-6 * max(1.0, b.period.events.total)
    )
    print(
        f"\nSLO {len(first)} objectives x {len(statuses[0].windows) + 1} windows, {n} targets, {days} d "
        f"({rows} stored rollup rows)\n"
        f"  ledger: backfill once {backfill:.2f} s, pass {ledger_ms:.1f} ms (median of 5), "
        f"rings {ledger_bytes / 2**20:.1f} MiB, peak RSS {rss0:.0f} -> {rss1:.0f} MiB\n"
        f"  full re-read (every pass before): {full_ms:.0f} ms, peak RSS -> {rss2:.0f} MiB\n"
        f"  ratio full/ledger per pass: {full_ms / ledger_ms:.0f}x; period totals agree on {agree}/{len(want)}\n"
        f"  restart: first pass {restart:.2f} s from the saved counts (up to {resumed_from}) and {restart_rows} "
        f"rollup rows; ratio first pass without/with saved counts {backfill / restart:.0f}x"
    )
    assert agree == len(want)
    rt.store.close()

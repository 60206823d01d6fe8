"""Drift evaluation cost: ~100 signals (13 business types x 8 signals) over a fleet's stored
history (LLMSLO_DRIFT_TARGETS targets, default 100, a day of minute rollups of every drift
series), at 8 window lengths, through `DriftMonitor.evaluate` as the running collector calls it.

Side by side in the same run: the first reference build (a whole day read, and the peak memory
it takes above what the process held before it), the first build of a restarted process, which
loads the minutes the first one saved (collector/drift/saved.py; a day read again until session
29), the next rebuild one `drift.refresh` (10 minutes) later with the reference's minutes kept,
the rebuild an hour later (a whole re-read of the day until session 26), the steady pass per
window, and the plain read of the same window's rows that a pass builds on. LLMSLO_DRIFT_WINDOWS
(e.g. "5m") runs only those windows, LLMSLO_DRIFT_HOURS sets the history (26 h).

Run: .venv/bin/python -m pytest tests/benchmarks/test_drift_benchmark.py -s
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from collector.config import Settings
from collector.drift.engine import DRIFT_METRICS, current_bounds
from collector.drift.monitor import reference_ranges
from collector.rollup import MINUTE_SECONDS, period_start
from collector.runtime import Runtime
from collector.sim.exposition import EngineMetrics, render
from collector.store.repository import _rollup_params, upsert_rollups
from collector.store.tables import drift_minutes, request_rollups
from collector.traces.normalize import RequestRecord
from collector.traces.rollup import RequestCell
from collector.traces.store import read_requests

pytestmark = pytest.mark.benchmark
TYPES = 13
WINDOWS = ("1m", "2m", "5m", "10m", "15m", "30m", "1h", "2h")


def fill(rt: Runtime, hours: int, now: float) -> int:
    rng = random.Random(2)
    m = EngineMetrics(max_model_len=8192, created_unix=now - hours * 3600 - 120)
    for _ in range(50):
        m.hist["request_prompt_tokens"].observe(rng.lognormvariate(5.3, 0.5))
        m.hist["request_generation_tokens"].observe(rng.lognormvariate(4.8, 0.5))
    body = render("current", "m", m)
    for scraper in rt.scrapers.values():
        scraper.ingest(body, "text/plain", now - hours * 3600 - 60)
    end = period_start(now) + MINUTE_SECONDS
    written = 0
    with rt.store.engine.begin() as conn:
        for scraper in rt.scrapers.values():
            series = [(i, sid) for i, sid in scraper.series_ids.items() if i.key.metric in DRIFT_METRICS]
            template = {i: scraper.recent[-1].cells[i] for i, _ in series}
            rows = []
            for t in range(end - hours * 3600, end, MINUTE_SECONDS):
                for ident, sid in series:
                    cell = template[ident].copy()
                    n = rng.uniform(20, 40)
                    cell.value = n
                    if cell.buckets is not None:
                        k = len(cell.buckets)
                        cell.buckets = [n * min(1.0, (i + 1) / (k * 0.6)) for i in range(k)]
                        cell.sum = n * 200
                    cell.observed_seconds = 60.0
                    rows.append(_rollup_params(sid, MINUTE_SECONDS, t, cell))
                if len(rows) > 50_000:
                    upsert_rollups(conn, rows)
                    written += len(rows)
                    rows = []
            upsert_rollups(conn, rows)
            written += len(rows)
    return written


def peak_rss_reset() -> None:
    """Reset this process's peak resident size (VmHWM), so that the next reading is the peak since."""
    Path("/proc/self/clear_refs").write_text("5")


def rss_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def test_drift_evaluation_cost(tmp_path: Path) -> None:
    n = int(os.environ.get("LLMSLO_DRIFT_TARGETS", "100"))
    # the 24 h trailing reference and the windows after it (LLMSLO_DRIFT_HOURS: less history, for
    # a fleet of a thousand targets, whose day is ~16 million rows)
    hours = int(os.environ.get("LLMSLO_DRIFT_HOURS", "26"))
    now = time.time()
    base = {
        "data_dir": str(tmp_path),
        "targets": [
            {"name": f"t{i}", "url": f"http://127.0.0.1:1/{i}", "business_type": f"type_{i % TYPES}"} for i in range(n)
        ],
        "business_types": [f"type_{i}" for i in range(TYPES)],
    }
    rt = Runtime(Settings.model_validate(base))
    started = time.perf_counter()
    rows = fill(rt, hours, now)
    print(f"\n{n} targets, {rows:,} minute rollups written in {time.perf_counter() - started:.0f} s")
    print(f"{'window':>7}{'read (baseline)':>17}{'pass':>9}{'ratio':>7}{'rebuild':>10}{'its peak':>10}"
          f"{'restarted (saved)':>19}{'ratio':>7}{'signals':>9}{'next rebuild (kept)':>21}"
          f"{'an hour later':>15}")  # fmt: skip
    total_pass = total_read = 0.0
    for window in os.environ.get("LLMSLO_DRIFT_WINDOWS", ",".join(WINDOWS)).split(","):
        settings = Settings.model_validate({**base, "drift": {"tenants": False, "window": window, "min_events": 20}})
        with rt.store.engine.begin() as conn:  # a first start: nothing saved (another window's saves are not its own)
            conn.execute(drift_minutes.delete())
        monitor = Runtime(settings, rt.store).drift
        assert monitor is not None
        before = rss_mib("VmRSS")
        peak_rss_reset()
        t0 = time.perf_counter()
        found = monitor.evaluate(now)  # builds the reference (and saves its minutes)
        rebuild = time.perf_counter() - t0
        peak = rss_mib("VmHWM") - before
        # a restarted process's first build at the same moment: the minutes saved loaded
        restarted = Runtime(settings, rt.store).drift
        assert restarted is not None
        t0 = time.perf_counter()
        again = restarted.evaluate(now)
        restart = time.perf_counter() - t0
        # all but the reference's last minutes, not settled (SETTLE_SECONDS) when the first build saved
        assert restarted.minutes_read["saved"] >= 24 * 60 - 5 and restarted.minutes_read["rollups"] <= 6
        assert [f.summary for f in again] == [f.summary for f in found]  # the same findings
        passes, reads = [], []
        for k in range(3):
            t0 = time.perf_counter()
            found = monitor.evaluate(now + 1 + k)
            passes.append(time.perf_counter() - t0)
            start = period_start(now) + MINUTE_SECONDS - int(settings.drift.window)
            t0 = time.perf_counter()
            rt.store.read_rows(start, start + int(settings.drift.window), metrics=DRIFT_METRICS)
            reads.append(time.perf_counter() - t0)
        # the next rebuild, one refresh later: the reference's minutes are kept, the 10 that
        # entered it are read (the shifted window itself is empty: the history ends at `now`)
        t0 = time.perf_counter()
        monitor.evaluate(now + settings.drift.refresh)
        kept = time.perf_counter() - t0
        # an hour after the first build: the 60 minutes that entered the reference are read (empty
        # here); until session 26 the whole day was read again, to choose the busiest tenants
        t0 = time.perf_counter()
        monitor.evaluate(now + 3600)
        hour = time.perf_counter() - t0
        p, r = statistics.median(passes), statistics.median(reads)
        total_pass += p
        total_read += r
        assert len(found) >= TYPES * 6  # every business type's signals were judged
        print(f"{window:>7}{r * 1000:>15.0f}ms{p * 1000:>7.0f}ms{p / r:>7.1f}{rebuild:>9.1f}s{peak:>6.0f} MiB"
              f"{restart:>18.2f}s{rebuild / restart:>6.0f}x{len(found):>9}{kept:>20.2f}s{hour:>14.2f}s")  # fmt: skip
    print(f"{'8 windows':>7}{total_read * 1000:>15.0f}ms{total_pass * 1000:>7.0f}ms{total_pass / total_read:>7.1f}")
    rt.store.close()


def fill_spans(rt: Runtime, tenants: int, hours: int, now: float) -> int:
    """`hours` of gateway request cells for `tenants` tenants a minute in one business type (a
    large gateway: `traces.max_tenants_per_minute` is 1,000), as the trace ingestion stores them."""
    rng = random.Random(3)
    templates = []
    for k in range(20):  # tenants of 20 sizes: each tenant's cells are one of these
        cell = RequestCell()
        records = [
            RequestRecord(
                trace_id=b"t" * 16,
                span_id=b"s" * 8,
                start_unix=now - 2,
                end_unix=now,
                measured_at="gateway",
                model="m",
                business_type="type_0",
                tenant="x",
                input_tokens=int(rng.lognormvariate(5.3, 0.5)),
                cached_input_tokens=None,
                output_tokens=int(rng.lognormvariate(4.8, 0.5)),
                ttft_seconds=0.3,
                tpot_seconds=0.02,
                e2e_seconds=2.0,
                queue_seconds=None,
                finish_reason="stop",
                error_type="",
            )
            for _ in range(1 + k * 3)
        ]
        cell.add_all(records, [])
        templates.append(json.dumps(cell.to_json(), separators=(",", ":")))
    end = period_start(now) + MINUTE_SECONDS
    written = 0
    with rt.store.engine.begin() as conn:
        rows = []
        for t in range(end - hours * 3600, end, MINUTE_SECONDS):
            for i in range(tenants):
                rows.append({"start_unix": t, "period_seconds": MINUTE_SECONDS, "business_type": "type_0",
                             "model": "m", "tenant": f"tenant-{i}", "measured_at": "gateway", "track": "",
                             "data": templates[i % len(templates)]})  # fmt: skip
            if len(rows) > 50_000:
                conn.execute(request_rollups.insert(), rows)
                written += len(rows)
                rows = []
        conn.execute(request_rollups.insert(), rows)
        written += len(rows)
    return written


def test_drift_tenant_reference_of_a_large_gateway(tmp_path: Path) -> None:
    """Drift per tenant over a day of a large gateway's request cells (LLMSLO_DRIFT_TENANTS a
    minute, default 300): the first reference build and the full rebuild an hour later (the
    busiest tenants chosen again), with the peak memory each takes, side by side with reading the
    same day's cells at once and counting the tenants in Python, which is what a build did until
    session 27 (the baseline)."""
    tenants = int(os.environ.get("LLMSLO_DRIFT_TENANTS", "300"))
    hours = int(os.environ.get("LLMSLO_DRIFT_HOURS", "26"))
    now = time.time()
    settings = Settings.model_validate(
        {
            "data_dir": str(tmp_path),
            "targets": [{"name": "t0", "url": "http://127.0.0.1:1/0", "business_type": "type_0"}],
            "business_types": ["type_0"],
            "drift": {"tenants": True, "window": "5m", "min_events": 20},
        }
    )
    rt = Runtime(settings)
    started = time.perf_counter()
    rows = fill_spans(rt, tenants, hours, now)
    print(f"\n{tenants} tenants a minute, {rows:,} request cells written in {time.perf_counter() - started:.0f} s")
    monitor = rt.drift
    assert monitor is not None
    start, _ = current_bounds(now, settings.drift.window)
    lo, hi = reference_ranges(settings.drift, start, start + int(settings.drift.window))[0]

    def measured(work: Callable[[], object]) -> tuple[float, float, float, object]:
        """(seconds, peak RSS above the RSS before, peak RSS) of `work`."""
        before = rss_mib("VmRSS")
        peak_rss_reset()
        t0 = time.perf_counter()
        out = work()
        return time.perf_counter() - t0, rss_mib("VmHWM") - before, rss_mib("VmHWM"), out

    def whole_read() -> dict[str, float]:
        volume: dict[str, float] = {}
        for key, cell in read_requests(rt.store, lo, hi):
            volume[key.tenant] = volume.get(key.tenant, 0.0) + cell.total
        return volume

    # the monitor first: the baseline's gigabyte would stay in the process and hide its peaks
    build_s, build_mib, build_peak, _ = measured(lambda: monitor.evaluate(now))
    hour_s, hour_mib, hour_peak, _ = measured(lambda: monitor.evaluate(now + 3600))
    base_s, base_mib, base_peak, volume = measured(whole_read)
    busiest = set(sorted(volume, key=lambda t: (-volume[t], t))[: settings.traces.top_tenants])
    assert monitor.tenants == busiest  # the database's sums chose the same tenants
    assert any(tenant for (_bt, tenant), _signal in monitor.reference.totals)  # type: ignore[union-attr]
    print(f"{'':>40}{'seconds':>10}{'peak above before':>20}{'peak RSS':>12}{'time ratio':>12}")
    for name, secs, above, peak in (
        ("the day read at once (baseline)", base_s, base_mib, base_peak),
        ("first build", build_s, build_mib, build_peak),
        ("full rebuild an hour later", hour_s, hour_mib, hour_peak),
    ):
        print(f"{name:>40}{secs:>9.1f}s{above:>16.0f} MiB{peak:>8.0f} MiB{secs / base_s:>11.2f}x")
    rt.store.close()

"""Restart benchmark: `llmslo serve` started twice on a store that already holds days of a fleet's
SLO and drift history (LLMSLO_RESTART_DAYS, 1; minutes for the last 48 h, hours before), scraping
the same N loopback vLLM targets at 15 s (LLMSLO_RESTART_TARGETS, 1,000) with the shipped rules.

The first start has no saved SLO counts: its ledger counts every stored rollup of the SLO period,
as every start did before session 28 (the baseline). It is stopped (SIGTERM: it saves what closed
since its last pass) and started again: the second start reads back the counts it saved and
counts only the rollups stored since (collector/slo/saved.py). Stopped again, it starts a third
time with chat's TTFT threshold changed (1 s to 1.5 s): the other objectives resume from their
saved counts, and that one is counted again from the whole period's rollups in the background
(`llmslo_slo_ledger_recount_seconds`, polled too); before session 32 such a change recounted
every objective, as the first start does. For each start, over its first
LLMSLO_RESTART_SECONDS (240): when the SLO status was back (`llmslo_slo_ledger_fill_seconds`
appears on /metrics, polled every second from the process' start, however long after those
seconds it comes), the fill's time and the rollup rows it counted, the scrapes done, failed and
skipped, and the collector's CPU; and its first drift reference build (the day of engine minutes
read from the rollups by the first start, which saves them; loaded by the restart:
collector/drift/saved.py), from its log.

Run: LLMSLO_RESTART_TARGETS=1000 LLMSLO_RESTART_DAYS=1 .venv/bin/python -m pytest \
       tests/benchmarks/test_restart_benchmark.py -s
"""

from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from collector.config import load_settings
from collector.drift.engine import DRIFT_METRICS
from collector.runtime import Runtime
from tests.benchmarks.test_fleet_benchmark import (
    ROOT,
    TYPES,
    cpu_seconds,
    free_port,
    http,
    llmslo_scrapes,
    loopback_fleet,
    process,
    skipped_slots,
    wait_http,
)
from tests.benchmarks.test_slo_benchmark import SLO_SERIES, fill

pytestmark = pytest.mark.benchmark
MAX_WAIT_SECONDS = 1800.0  # a start whose ledger is not filled by then fails the run


@dataclass
class Start:
    status_back: float  # seconds from the process' start until the SLO status was back
    fill_seconds: float
    fill_rows: float
    scrapes: float
    failed: float
    skipped: float
    cpu: float
    drift: str  # the first drift reference build, as its log line tells it
    recount: float = float("nan")  # seconds from the start until the changed objective was counted again


def fill_metrics(base: str) -> dict[str, float] | None:
    """The ledger fill's figures on /metrics, or None before the fill ends. A poll that fails on
    the connection (a kept-alive one the server closed as it was reused, under a start-up's load)
    counts as not yet: the next poll, a second later, asks again."""
    found = {}
    try:
        text = http().get(f"{base}/metrics", timeout=30).text
    except httpx.TransportError:
        return None
    for line in text.splitlines():
        if line.startswith(
            (
                "llmslo_slo_ledger_fill_seconds ",
                "llmslo_slo_ledger_fill_rollup_rows ",
                "llmslo_slo_ledger_recount_seconds ",
            )
        ):
            name, value = line.split()
            found[name] = float(value)
    return found if "llmslo_slo_ledger_fill_rollup_rows" in found else None


def start_once(config: Path, tmp_path: Path, port: int, seconds: float, label: str, recount: bool = False) -> Start:
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "collector.cli", "serve", "--config", str(config)]
    started = time.monotonic()
    with process(cmd, ROOT, log=tmp_path / f"{label}.log") as proc:
        wait_http(f"{base}/readyz", 120)
        fill_found: dict[str, float] | None = None
        status_back = float("nan")
        measured: tuple[float, float, float, float] | None = None
        recounted = float("nan") if recount else 0.0

        def waiting() -> bool:
            return fill_found is None or recounted != recounted  # NaN: the recount still running

        # the scrapes and CPU of the first `seconds`; then on until the ledger is filled (and the
        # changed objective counted again)
        while measured is None or (waiting() and time.monotonic() - started < MAX_WAIT_SECONDS):
            if waiting():
                found = fill_metrics(base)
                if found is not None and fill_found is None:
                    fill_found, status_back = found, time.monotonic() - started
                if found is not None and "llmslo_slo_ledger_recount_seconds" in found and recount:
                    recounted = time.monotonic() - started
            if measured is None and time.monotonic() - started >= seconds:
                done, failed = llmslo_scrapes(base)
                measured = (done, failed, skipped_slots(base), cpu_seconds(proc.pid))
            time.sleep(1.0)
    assert fill_found is not None, f"the SLO ledger was not filled within {MAX_WAIT_SECONDS:.0f} s"
    assert recounted == recounted, f"the changed objective was not counted again within {MAX_WAIT_SECONDS:.0f} s"
    done, failed, skipped, cpu = measured
    built = re.search(r"drift reference rebuilt over .* in ([\d.]+ s \(.*\))", (tmp_path / f"{label}.log").read_text())
    return Start(
        status_back,
        fill_found["llmslo_slo_ledger_fill_seconds"],
        fill_found["llmslo_slo_ledger_fill_rollup_rows"],
        done,
        failed,
        skipped,
        cpu,
        built.group(1) if built else "not within the run",
        recounted,
    )


def test_a_restart_on_days_of_fleet_history(tmp_path: Path) -> None:
    n = int(os.environ.get("LLMSLO_RESTART_TARGETS", "1000"))
    days = int(os.environ.get("LLMSLO_RESTART_DAYS", "1"))
    seconds = float(os.environ.get("LLMSLO_RESTART_SECONDS", "240"))
    port, api_port = free_port(), free_port()
    with loopback_fleet(port):
        config = tmp_path / "llmslo.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "data_dir": str(tmp_path),
                    "server": {"host": "127.0.0.1", "port": api_port},
                    "rules": str(tmp_path / "rules.yaml"),
                    # not the weekly report's catch-up: a start past its time (Monday 08:00) with
                    # last week's report missing builds it, reading a day of the fleet's minutes
                    # per query beside the two starts' work (in session 29, at 1,000 targets, the
                    # process reached 12.5 GB with it, the ledger fill and drift's first build)
                    "report": {"enabled": False},
                    "targets": [
                        {
                            "name": f"t{i}",
                            "url": f"http://127.0.0.1:{port}/t/{i}/metrics",
                            "business_type": TYPES[i % len(TYPES)],
                        }
                        for i in range(n)
                    ],
                }
            )
        )
        shipped = (ROOT / "rules" / "default.yaml").read_text()
        (tmp_path / "rules.yaml").write_text(shipped)
        t0 = time.perf_counter()
        rt = Runtime(load_settings(config))
        stored = fill(rt, days, time.time() - 60, {*SLO_SERIES, *DRIFT_METRICS})  # the history, as serve leaves it
        rt.store.close()
        print(f"\nRESTART {n} targets, {days} d of SLO history: {stored} rollup rows written in "
              f"{time.perf_counter() - t0:.0f} s")  # fmt: skip
        first = start_once(config, tmp_path, api_port, seconds, "first")
        again = start_once(config, tmp_path, api_port, seconds, "again")
        changed = shipped.replace("metric: ttft, threshold: 1s,", "metric: ttft, threshold: 1.5s,", 1)
        assert changed != shipped
        (tmp_path / "rules.yaml").write_text(changed)
        third = start_once(config, tmp_path, api_port, seconds, "changed", recount=True)
    slots = n * seconds / 15
    print(f"  over each start's first {seconds:.0f} s (~{slots:.0f} scrape slots):")
    starts = (
        ("first start (every stored rollup counted)", first),
        ("restart (saved counts)", again),
        ("restart, chat TTFT threshold changed", third),
    )
    for label, s in starts:
        print(
            f"  {label}: SLO status back after {s.status_back:.1f} s (fill {s.fill_seconds:.1f} s, "
            f"{s.fill_rows:.0f} rollup rows); scrapes {s.scrapes:.0f} done, {s.failed:.0f} failed, "
            f"{s.skipped:.0f} slots skipped; CPU {s.cpu:.1f} s; first drift reference built in {s.drift}"
            + (f"; the changed objective counted again {s.recount:.1f} s after the start" if s.recount else "")
        )
    print(
        f"  ratio first start / restart: SLO status back {first.status_back / again.status_back:.1f}x, "
        f"CPU {first.cpu / again.cpu:.2f}x; first start / changed restart: the unchanged objectives' "
        f"status back {first.status_back / third.status_back:.1f}x"
    )
    assert again.fill_rows < first.fill_rows / 10
    assert again.status_back < first.status_back
    assert third.fill_rows < first.fill_rows / 10 and third.status_back < first.status_back

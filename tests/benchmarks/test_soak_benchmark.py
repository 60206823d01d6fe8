"""Soak: `llmslo serve` for 30 minutes (LLMSLO_SOAK_SECONDS) with 200 scraped loopback vLLM targets
at 15 s, the shipped SLO rules evaluated, and OTLP/HTTP span batches at a steady rate (100-span
protobuf batches, LLMSLO_SOAK_SPANS_PER_SECOND, default 500/s, fresh span ids, times moving on),
RSS sampled every minute. After the warm-up (the running 1h window filling, LLMSLO_SOAK_WARMUP,
default 10 minutes) the RSS trend must be flat: the least-squares slope over the rest of the run at
most 0.5 MiB/min, the series printed.

Run: LLMSLO_SOAK_SECONDS=1800 .venv/bin/python -m pytest tests/benchmarks/test_soak_benchmark.py -s
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.benchmarks.test_fleet_benchmark import (
    ROOT,
    cpu_seconds,
    free_port,
    loopback_fleet,
    process,
    rss_mib,
    wait_http,
)
from tests.benchmarks.test_trace_benchmark import make_batch, template_batch

pytestmark = pytest.mark.benchmark
TYPES = ("chat", "customer_service", "code_completion", "batch")


def slope_per_minute(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB) in MiB per minute."""
    xs, ys = [t for t, _ in samples], [m for _, m in samples]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return 60 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


def test_soak_memory_stays_flat(tmp_path: Path) -> None:
    seconds = float(os.environ.get("LLMSLO_SOAK_SECONDS", "1800"))
    warmup = float(os.environ.get("LLMSLO_SOAK_WARMUP", "600"))
    spans_per_second = float(os.environ.get("LLMSLO_SOAK_SPANS_PER_SECOND", "500"))
    n = int(os.environ.get("LLMSLO_SOAK_TARGETS", "200"))
    fleet_port, api_port = free_port(), free_port()
    with loopback_fleet(fleet_port):
        config = {
            "data_dir": str(tmp_path),
            "server": {"host": "127.0.0.1", "port": api_port},
            "rules": str(ROOT / "rules"),
            "targets": [
                {"name": f"t{i}", "url": f"http://127.0.0.1:{fleet_port}/t/{i}/metrics", "business_type": TYPES[i % 4]}
                for i in range(n)
            ],
        }
        (tmp_path / "llmslo.yaml").write_text(yaml.safe_dump(config))
        cmd = [str(Path(sys.executable).parent / "llmslo"), "serve", "--config", str(tmp_path / "llmslo.yaml")]
        base = f"http://127.0.0.1:{api_port}"
        template = template_batch(100)
        stop = threading.Event()
        sent = {"ok": 0, "failed": 0}

        def sender() -> None:
            t0_ns, b, started = time.time_ns(), 0, time.monotonic()
            with httpx.Client(timeout=30) as client:
                while not stop.is_set():
                    due = started + b * 100 / spans_per_second
                    if (delay := due - time.monotonic()) > 0:
                        time.sleep(delay)
                    body = make_batch(template, b, t0_ns)
                    r = client.post(
                        f"{base}/v1/traces", content=body, headers={"Content-Type": "application/x-protobuf"}
                    )
                    sent["ok" if r.status_code == 200 else "failed"] += 1
                    b += 1

        with process(cmd, tmp_path, tmp_path / "llmslo.log") as ours:
            wait_http(f"{base}/readyz")
            thread = threading.Thread(target=sender, daemon=True)
            thread.start()
            started = time.monotonic()
            samples: list[tuple[float, float]] = []
            while (elapsed := time.monotonic() - started) < seconds:
                samples.append((elapsed, rss_mib(ours.pid)))
                time.sleep(min(60.0, seconds - elapsed))
            samples.append((time.monotonic() - started, rss_mib(ours.pid)))
            cpu = cpu_seconds(ours.pid)
            stop.set()
            thread.join(30)
            targets = httpx.get(f"{base}/api/v1/targets", timeout=60).json()["targets"]
            assert ours.poll() is None, "llmslo exited during the soak"
    after = [(t, m) for t, m in samples if t >= warmup]
    slope = slope_per_minute(after) if len(after) >= 3 else float("nan")
    failed_scrapes = sum(sum(t["errors_total"].values()) for t in targets)
    print(
        f"\nSOAK {seconds / 60:.0f} min: {n} targets at 15 s, {spans_per_second:.0f} spans/s "
        f"({sent['ok']} batches accepted, {sent['failed']} refused), {failed_scrapes} failed scrapes, "
        f"CPU {cpu:.0f} s\n  RSS MiB per minute: {' '.join(f'{m:.0f}' for _, m in samples)}\n"
        f"  slope after {warmup / 60:.0f} min warm-up: {slope:+.2f} MiB/min"
    )
    assert sent["failed"] == 0 and sent["ok"] > 0
    if len(after) >= 3:
        assert slope <= 0.5, f"RSS still growing {slope:.2f} MiB/min after warm-up"

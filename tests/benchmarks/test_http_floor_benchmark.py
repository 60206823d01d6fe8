"""Micro-benchmark (an inner loop, not the service): what the HTTP client alone costs per scrape,
side by side with a real Prometheus scraping the same loopback targets in the same run. It says
where the floor under llmslo's CPU per scrape lies (the fleet benchmark measures the service);
no capacity figure in the README rests on it.

Run: LLMSLO_FLOOR_TARGETS=1000 .venv/bin/python -m pytest tests/benchmarks/test_http_floor_benchmark.py -s
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.benchmarks.test_fleet_benchmark import (
    ROOT,
    cpu_seconds,
    free_port,
    loopback_fleet,
    process,
    prometheus_scrapes,
    wait_http,
)

pytestmark = pytest.mark.benchmark


def test_http_client_floor_against_prometheus(tmp_path: Path) -> None:
    n = int(os.environ.get("LLMSLO_FLOOR_TARGETS", "1000"))
    seconds = float(os.environ.get("LLMSLO_FLOOR_SECONDS", "90"))
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        if os.environ.get("CI") == "true":
            pytest.fail("prometheus is not installed (apt-get install prometheus)")
        pytest.skip("Debian's prometheus is not installed: no baseline")
    port = free_port()
    with loopback_fleet(port):
        prom_cfg = {
            "global": {"scrape_interval": "15s", "scrape_timeout": "10s"},
            "scrape_configs": [
                {
                    "job_name": "vllm",
                    "static_configs": [
                        {"targets": [f"127.0.0.1:{port}"], "labels": {"__metrics_path__": f"/t/{i}/metrics"}}
                        for i in range(n)
                    ],
                }
            ],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(prom_cfg))
        prom_port = free_port()
        prom_base = f"http://127.0.0.1:{prom_port}"
        prom_cmd = [
            prometheus,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'prom'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ]
        with process(prom_cmd, tmp_path, tmp_path / "prometheus.log") as prom:
            wait_http(f"{prom_base}/-/ready")
            time.sleep(20)  # Prometheus' first scrapes spread over the interval
            rows = []
            for kind in os.environ.get("LLMSLO_FLOOR_CLIENTS", "httpx,llmslo").split(","):
                client = subprocess.Popen(
                    [sys.executable, "-m", "tests.benchmarks.http_floor_client",
                     f"http://127.0.0.1:{port}/t/{{i}}/metrics", str(n), str(seconds), kind],
                    cwd=ROOT, stdout=subprocess.PIPE, text=True,
                )  # fmt: skip
                time.sleep(15)  # the client's first interval (connections opened) is not measured
                p0, ps0 = cpu_seconds(prom.pid), prometheus_scrapes(prom_base)
                out, _ = client.communicate(timeout=seconds + 120)
                p1, ps1 = cpu_seconds(prom.pid), prometheus_scrapes(prom_base)
                words = out.split()
                done, errors, client_cpu = int(words[1]), int(words[2]), float(words[3])  # after its first interval
                rows.append(
                    (kind, done, errors, client_cpu / max(done, 1) * 1000, (p1 - p0) / max(ps1 - ps0, 1) * 1000)
                )
    print(f"\nHTTP FLOOR (micro-benchmark) {n} targets, {seconds:.0f} s per client, GET + gzip, Prometheus beside it:")
    for kind, done, errors, ours, theirs in rows:
        print(
            f"  {kind:6s} {ours:.2f} ms of CPU per request ({done} requests, {errors} errors); "
            f"Prometheus' whole scrape {theirs:.2f} ms in the same minutes; ratio {ours / theirs:.2f}x"
        )
    for kind, done, errors, _, _ in rows:
        assert done > 0 and errors == 0, kind

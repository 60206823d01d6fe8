"""Two `llmslo serve` processes on one PostgreSQL database, each scraping its shard of the
targets (collector/cluster.py), with a real Alertmanager: both answer the SLOs of the whole
fleet, exactly one is elected and sends the fleet's alerts, each sends its own targets' alerts,
and when the elected one stops the other takes over."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.test_serve import free_port, wait_for
from tests.slo.test_alerts import start_alertmanager
from tests.targets import Behaviour, TargetServer, target_server, vllm_body

# md5(name) mod 2 puts chat-0 and batch-2 in shard 0, chat-3 and batch-1 in shard 1
RULES = """\
version: v1
min_events: 5
evaluation_interval: 1s
window_scale: 0.0166666
business_types:
  chat:
    objectives:
      # every request is slower than 1 ms to its first token: the budget burns at once
      - {name: ttft, sli: latency, metric: ttft, threshold: 1ms, objective: 0.99}
  batch:
    objectives:
      - {name: errors, sli: error_ratio, objective: 0.99}
thresholds: {target_down_for: 1s}
alertmanager: {url: "http://127.0.0.1:%d", resend_interval: 2s}
"""


@pytest.fixture
def targets() -> Iterator[TargetServer]:
    started = time.monotonic()
    scale = lambda: 1 + int((time.monotonic() - started) * 4)  # noqa: E731
    routes = {
        "/chat": Behaviour(vllm_body(scale, model="chat-model")),
        "/batch": Behaviour(vllm_body(scale, model="batch-model")),
        "/down": Behaviour(lambda: b"internal error", status=500),
    }
    with target_server(routes) as srv:
        yield srv


def start(config: Path, port: int, shard: int, out: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "LLMSLO_SERVER__PORT": str(port),
        "LLMSLO_CLUSTER__NAME": f"collector-{shard}",
        "LLMSLO_CLUSTER__SHARD": str(shard),
    }
    with out.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "collector.cli", "serve", "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )


def metrics(base: str) -> dict[str, list[Any]]:
    text = httpx.get(f"{base}/metrics", timeout=5).text
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def value(fams: dict[str, list[Any]], name: str, **labels: str) -> float:
    return sum(s.value for s in fams.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items()))


def test_two_collectors_share_the_fleet_and_hand_over_its_alerts(
    tmp_path: Path, pg_url: str, targets: TargetServer
) -> None:
    am_port = free_port()
    receiver = {"route": {"receiver": "null"}, "receivers": [{"name": "null"}]}
    am = start_alertmanager(tmp_path, receiver, am_port)
    (tmp_path / "rules.yaml").write_text(RULES % am_port)
    config = tmp_path / "llmslo.yaml"
    config.write_text(f"""\
data_dir: {tmp_path / "data"}
database_url: {pg_url}
rules: {tmp_path / "rules.yaml"}
derive_interval: 1s
scrape: {{interval: 1s, timeout: 800ms}}
cluster: {{shards: 2, settle: 5s}}
targets:
  - {{name: chat-0, url: "{targets.url("/chat")}", business_type: chat}}
  - {{name: chat-3, url: "{targets.url("/chat")}", business_type: chat}}
  - {{name: batch-1, url: "{targets.url("/down")}", business_type: batch}}
  - {{name: batch-2, url: "{targets.url("/batch")}", business_type: batch}}
""")
    ports = [free_port(), free_port()]
    bases = [f"http://127.0.0.1:{p}" for p in ports]
    logs = [tmp_path / f"collector-{i}.log" for i in range(2)]
    procs = [start(config, ports[i], i, logs[i]) for i in range(2)]
    try:
        for base in bases:
            wait_for(lambda base=base: httpx.get(f"{base}/readyz").status_code == 200, timeout=60)

        # both see the whole fleet's chat events: more than the one chat target each scrapes itself
        def fleet_wide() -> list[dict[str, Any]] | None:
            seen = []
            for base in bases:
                own = value(metrics(base), "llmslo_slo_events", slo="chat-ttft")  # its own commits (a counter)
                slos = [s for s in httpx.get(f"{base}/api/v1/slos").json()["slos"] if s["slo"] == "chat-ttft"]
                if not slos:
                    return None  # not evaluated yet
                seen.append({"own": own, "fleet": slos[0]})
            ok = all(s["own"] > 0 and s["fleet"]["period"]["total"] > 1.5 * s["own"] for s in seen)
            return seen if ok else None

        wait_for(fleet_wide, timeout=60)
        fams = [metrics(b) for b in bases]
        assert [value(f, "llmslo_cluster_leader") for f in fams].count(1.0) == 1
        leader = [value(f, "llmslo_cluster_leader") for f in fams].index(1.0)
        follower = 1 - leader
        assert value(fams[follower], "llmslo_cluster_peers") == 1.0
        # the serving views are each collector's own shard (the SLOs are the fleet's)
        for i, base in enumerate(bases):
            shown = {g["target"] for g in httpx.get(f"{base}/api/v1/serving", params={"window": "5m"}).json()["groups"]}
            assert shown == ({"chat-0", "batch-2"} if i == 0 else {"chat-3"}), shown  # batch-1 never answers

        # the page for chat-ttft reaches Alertmanager from the elected collector alone; batch-1's
        # down ticket from collector-1, which scrapes it, labelled so
        def alerts() -> list[dict[str, Any]] | None:
            got = httpx.get(f"http://127.0.0.1:{am_port}/api/v2/alerts").json()
            names = {a["labels"]["alertname"] for a in got}
            return got if {"LLMSLOChatTtftBudgetBurn", "LLMSLOTargetDown"} <= names else None

        got = wait_for(alerts, timeout=60)
        down = [a for a in got if a["labels"]["alertname"] == "LLMSLOTargetDown"]
        assert [(a["labels"]["target"], a["labels"]["collector"]) for a in down] == [("batch-1", "collector-1")]
        assert all("collector" not in a["labels"] for a in got if a["labels"].get("slo") == "chat-ttft")
        fams = [metrics(b) for b in bases]
        assert value(fams[leader], "llmslo_slo_alert_firing", slo="chat-ttft") >= 1
        assert not fams[follower].get("llmslo_slo_alert_firing")
        assert not fams[follower].get("llmslo_slo_burn_rate")  # the status series: the elected one's
        assert fams[leader].get("llmslo_slo_burn_rate")

        # the elected collector stops: the other takes the lock and the fleet's alerts
        procs[leader].send_signal(signal.SIGINT)
        assert procs[leader].wait(timeout=30) == 0
        took = wait_for(lambda: value(metrics(bases[follower]), "llmslo_cluster_leader") == 1.0, timeout=30)
        assert took
        wait_for(lambda: value(metrics(bases[follower]), "llmslo_slo_alert_firing", slo="chat-ttft") >= 1, timeout=30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=20))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(p.wait())
        am.kill()
        am.wait()
    for log in logs:
        assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
    assert codes == [0, 0]

"""`llmslo serve` as a subprocess against local targets: the API and /metrics a user sees."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from collector.config import load_settings
from collector.runtime import Runtime
from collector.slo.saved import load as load_saved
from collector.store.repository import Store
from tests.benchmarks.test_slo_benchmark import fill as fill_history
from tests.targets import Behaviour, TargetServer, target_server, vllm_body

FILL_TARGETS = 10  # with two days stored: a fill of seconds, long enough to stop in its middle


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def targets() -> Iterator[TargetServer]:
    started = time.monotonic()
    scale = lambda: 1 + int((time.monotonic() - started) * 2)  # noqa: E731 - 20 requests every 0.5 s
    routes = {
        "/healthy": Behaviour(vllm_body(scale, model="chat-model")),
        "/error": Behaviour(lambda: b"internal error", status=500),
        "/timeout": Behaviour(vllm_body(scale), delay_seconds=3.0),
        "/garbage": Behaviour(lambda: b"\x00\x01 not metrics at all\n"),
    }
    with target_server(routes) as srv:
        yield srv


@contextmanager
def llmslo_serve(config: Path, port: int) -> Iterator[str]:
    """`llmslo serve --config` as a subprocess on `port`; yields its base URL. On leaving, it must
    stop on SIGINT with exit code 0 and no traceback in its output."""
    env = {**os.environ, "LLMSLO_SERVER__PORT": str(port)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "collector.cli", "serve", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    assert proc.returncode == 0, out
    assert "Traceback" not in out, out


def wait_for(fn, timeout: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = fn()
            if last:
                return last
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.2)
    raise AssertionError(f"condition not met in {timeout}s; last: {last!r}")


def test_serve_end_to_end(tmp_path: Path, targets: TargetServer) -> None:
    port = free_port()
    config = tmp_path / "llmslo.yaml"
    config.write_text(f"""\
data_dir: {tmp_path / "data"}
derive_interval: 1s
scrape: {{interval: 1s, timeout: 800ms}}
targets:
  - {{name: healthy, url: "{targets.url("/healthy")}", business_type: chat, labels: {{cluster: local}}}}
  - {{name: error, url: "{targets.url("/error")}"}}
  - {{name: timeout, url: "{targets.url("/timeout")}"}}
  - {{name: garbage, url: "{targets.url("/garbage")}"}}
deployments:
  - {{name: chat-pool, targets: [healthy], gpu: L4, replicas: 1, gpu_hour_usd: 3.6}}
""")
    with llmslo_serve(config, port) as base:
        wait_for(lambda: httpx.get(f"{base}/readyz").status_code == 200)
        assert httpx.get(f"{base}/healthz").json() == {"status": "ok"}

        def all_scraped() -> dict[str, dict[str, object]] | None:
            body = httpx.get(f"{base}/api/v1/targets").json()
            by_name = {t["name"]: t for t in body["targets"]}
            ok = by_name["healthy"]["scrapes_total"] >= 3 and all(t["up"] is not None for t in by_name.values())
            return by_name if ok else None

        t = wait_for(all_scraped)
        assert t["healthy"]["up"] is True and t["healthy"]["models"] == ["chat-model"]
        assert t["error"]["up"] is False and t["error"]["last_error_reason"] == "http_status"
        assert t["timeout"]["last_error_reason"] == "timeout"
        assert t["garbage"]["last_error_reason"] in ("parse", "encoding")
        assert "line 1" in t["garbage"]["last_error"]

        serving = httpx.get(f"{base}/api/v1/serving", params={"window": "5m", "business_type": "chat"}).json()
        assert [g["target"] for g in serving["groups"]] == ["healthy"]
        stats = serving["groups"][0]["stats"]
        assert stats["requests"] > 0 and stats["requests_per_second"] > 0
        assert stats["error_ratio"] == pytest.approx(0.1)
        ttft = {q["quantile"]: q for q in stats["latencies"]["ttft"]["quantiles"]}
        assert ttft[0.95]["lower_bound_seconds"] == 1.0 and ttft[0.95]["upper_bound_seconds"] == 2.5
        assert serving["business_types"][0]["business_type"] == "chat"
        bad = httpx.get(f"{base}/api/v1/serving", params={"window": "90s"})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "window"]  # m, h, d or w only

        def derived_metrics() -> dict[str, list[object]] | None:
            text = httpx.get(f"{base}/metrics").text
            fams = {f.name: f.samples for f in text_string_to_metric_families(text)}
            return fams if "llmslo_serving_ttft_seconds" in fams else None

        fams = wait_for(derived_metrics)
        up = {s.labels["target"]: s.value for s in fams["llmslo_target_up"]}  # type: ignore[attr-defined]
        assert up == {"healthy": 1.0, "error": 0.0, "timeout": 0.0, "garbage": 0.0}
        errors = {
            (s.labels["target"], s.labels["reason"]): s.value  # type: ignore[attr-defined]
            for s in fams["llmslo_scrape_errors"]
        }
        assert errors[("error", "http_status")] >= 1 and errors[("timeout", "timeout")] >= 1
        p95 = [
            s
            for s in fams["llmslo_serving_ttft_seconds"]  # type: ignore[attr-defined]
            if s.labels["quantile"] == "0.95" and s.labels["window"] == "5m"
        ]
        assert len(p95) == 1 and 1.0 <= p95[0].value <= 2.5
        assert p95[0].labels["cluster"] == "local"  # the target's static labels
        assert "llmslo_business_requests_per_second" in fams
        # every scrape is bounded by its 0.8 s timeout, inside the 1 s interval: no slot skipped
        assert fams["llmslo_scrape_slots_skipped"][0].value == 0  # type: ignore[attr-defined]
        # each periodic job's timings: the derive pass ran, within its interval
        runs = {s.labels["periodic_job"]: s.value for s in fams["llmslo_job_runs"] if s.name.endswith("_total")}  # type: ignore[attr-defined]
        assert runs.get("derive", 0) >= 1 and set(runs) <= {"derive", "drift", "evaluate", "compact"}, runs
        last = {s.labels["periodic_job"]: s.value for s in fams["llmslo_job_last_duration_seconds"]}  # type: ignore[attr-defined]
        assert 0 < last["derive"] < 5.0, last
        # no series carries a label the Prometheus scraping llmslo sets itself (it would rename
        # llmslo's to exported_job / exported_instance): the job timings were labelled `job`
        clash = {(sample.name, name) for samples in fams.values() for sample in samples for name in sample.labels}  # type: ignore[attr-defined]
        assert not {c for c in clash if c[1] in ("job", "instance")}, clash
        # cost: a configured replica is billed for the whole window, whatever was scraped
        cost = httpx.get(f"{base}/api/v1/cost", params={"window": "5m", "group_by": "deployment"}).json()
        assert cost["allocated_usd"] == pytest.approx(3.6 * 5 / 60)
        assert [g["key"] for g in cost["groups"]] == ["chat-pool"] and cost["groups"][0]["requests"] > 0
        assert cost["attributed_usd"] + cost["deployments"][0]["unshared_idle_usd"] == pytest.approx(0.3)
        assert set(cost["unpriced_targets"]) <= {"error", "timeout", "garbage"}
        # start alone runs to now: the same configured replica, billed for [start, now)
        since = int(time.time()) - 600
        recent = httpx.get(f"{base}/api/v1/cost", params={"start": since}).json()
        assert recent["start_unix"] == since and 0.55 <= recent["allocated_usd"] <= 0.7
        assert fams["llmslo_cost_gpu_hour_usd"][0].value == 3.6  # type: ignore[attr-defined]
        assert httpx.get(f"{base}/docs").status_code == 200
        assert "/api/v1/serving" in httpx.get(f"{base}/openapi.json").json()["paths"]


def test_a_large_fleet_keeps_metrics_bounded_and_serves_published_windows_from_the_snapshot(
    tmp_path: Path, targets: TargetServer
) -> None:
    """Above `server.metrics_target_limit` (target, model) pairs, /metrics drops the per-target
    derived series and says so; /api/v1/serving answers published windows from the last derive
    pass, with the same groups a filtered (computed) request shows."""
    port = free_port()
    config = tmp_path / "llmslo.yaml"
    config.write_text(f"""\
data_dir: {tmp_path / "data"}
derive_interval: 1s
server: {{metrics_target_limit: 1}}
scrape: {{interval: 1s, timeout: 800ms}}
targets:
  - {{name: a, url: "{targets.url("/healthy")}", business_type: chat}}
  - {{name: b, url: "{targets.url("/healthy")}", business_type: batch}}
""")
    with llmslo_serve(config, port) as base:
        wait_for(lambda: httpx.get(f"{base}/readyz").status_code == 200)

        def derived() -> dict[str, list[object]] | None:
            text = httpx.get(f"{base}/metrics").text
            fams = {f.name: f.samples for f in text_string_to_metric_families(text)}
            omitted = fams.get("llmslo_serving_groups_omitted", [])
            rates = fams.get("llmslo_business_requests_per_second", [])
            types = {s.labels["business_type"] for s in rates}  # type: ignore[attr-defined]
            ready = omitted and omitted[0].value == 2.0 and types == {"chat", "batch"}  # type: ignore[attr-defined]
            return fams if ready else None

        fams = wait_for(derived)
        assert not [
            name for name in fams if name.startswith("llmslo_serving_") and name != "llmslo_serving_groups_omitted"
        ]
        types = {s.labels["business_type"] for s in fams["llmslo_business_requests_per_second"]}  # type: ignore[attr-defined]
        assert types == {"chat", "batch"}

        published = httpx.get(f"{base}/api/v1/serving", params={"window": "5m"})  # httpx asks for gzip
        assert published.headers["content-type"] == "application/json"
        assert published.headers["content-encoding"] == "gzip"
        plain = httpx.get(f"{base}/api/v1/serving", params={"window": "5m"}, headers={"Accept-Encoding": "identity"})
        assert "content-encoding" not in plain.headers and plain.json().keys() == published.json().keys()
        body = published.json()
        assert sorted(g["target"] for g in body["groups"]) == ["a", "b"]
        assert body["window"] == "5m" and body["end_unix"] > body["start_unix"]
        chat = httpx.get(f"{base}/api/v1/serving", params={"window": "5m", "business_type": "chat"}).json()
        assert [g["target"] for g in chat["groups"]] == ["a"]
        assert [b["business_type"] for b in chat["business_types"]] == ["chat"]
        computed = httpx.get(f"{base}/api/v1/serving", params={"window": "5m", "target": "a"}).json()
        assert set(computed) == set(chat) and [g["target"] for g in computed["groups"]] == ["a"]
        assert chat["groups"][0]["stats"]["requests"] > 0

        # later passes: a request gets the last encoded body at once (at most two passes old)
        # while the newer one is encoded; the data moves on with the passes
        def observed(report: dict[str, Any]) -> float:  # seconds of scrapes the window holds
            return float(sum(g["stats"]["observed_seconds"] for g in report["groups"]))

        seen = []
        for _ in range(4):
            time.sleep(1.2)
            seen.append(observed(httpx.get(f"{base}/api/v1/serving", params={"window": "5m"}).json()))
        assert seen == sorted(seen) and seen[-1] > observed(body), (observed(body), seen)
        # those later reads found bodies the passes encoded ahead of them; only each view's first
        # read (the whole fleet's and chat's) waited for its encode
        fams = {f.name: f.samples for f in text_string_to_metric_families(httpx.get(f"{base}/metrics").text)}
        encodes = {s.labels["when"]: s.value for s in fams["llmslo_fleet_view_encodes"]}  # type: ignore[attr-defined]
        assert encodes["ahead"] >= 2 and 2 <= encodes["on_request"] <= 3, encodes
        spent = {s.labels["when"]: s.value for s in fams["llmslo_fleet_view_encode_seconds"]}  # type: ignore[attr-defined]
        assert spent["ahead"] > 0 and spent["on_request"] > 0


def test_a_restarted_collector_resumes_its_slo_counts_from_the_store(tmp_path: Path, targets: TargetServer) -> None:
    """`llmslo serve` saves its SLO ledger's counts as minutes close and when it stops; started
    again on the same store, it reads them back and counts only the rollups stored since (a day
    of history: the first start counts all of it, the second a minute or two)."""
    port = free_port()
    config = tmp_path / "llmslo.yaml"
    (tmp_path / "rules.yaml").write_text(
        "version: v1\nevaluation_interval: 1s\nbusiness_types:\n  chat:\n    objectives:\n"
        "      - {name: errors, sli: error_ratio, objective: 0.99}\n"
        "      - {name: ttft, sli: latency, metric: ttft, threshold: 1s, objective: 0.95}\n"
    )
    config.write_text(f"""\
data_dir: {tmp_path / "data"}
rules: {tmp_path / "rules.yaml"}
derive_interval: 1s
scrape: {{interval: 1s, timeout: 800ms}}
targets:
  - {{name: healthy, url: "{targets.url("/healthy")}", business_type: chat}}
""")
    rt = Runtime(load_settings(config))
    stored = fill_history(rt, 1, time.time() - 120)  # a day of the target's SLO series, as serve stores it
    rt.store.close()

    def fill_metrics(base: str) -> dict[str, float] | None:
        text = httpx.get(f"{base}/metrics").text
        found = {f.name: f.samples[0].value for f in text_string_to_metric_families(text) if f.samples}
        wanted = ("llmslo_slo_ledger_fill_rollup_rows", "llmslo_slo_counts_saved_through_timestamp_seconds")
        return found if all(w in found for w in wanted) else None

    def ttft_total(base: str) -> float:
        return next(
            s["period"]["total"] for s in httpx.get(f"{base}/api/v1/slos").json()["slos"] if s["slo"] == "chat-ttft"
        )

    with llmslo_serve(config, port) as base:
        first = wait_for(lambda: fill_metrics(base), timeout=60)
        counted = wait_for(lambda: ttft_total(base) or None, timeout=30)
    assert first["llmslo_slo_ledger_fill_rollup_rows"] >= stored * 0.9  # the whole period, counted once
    with llmslo_serve(config, port) as base:
        second = wait_for(lambda: fill_metrics(base), timeout=60)
    assert second["llmslo_slo_ledger_fill_rollup_rows"] < stored / 20  # only what came after the save
    assert (
        second["llmslo_slo_counts_saved_through_timestamp_seconds"]
        >= first["llmslo_slo_counts_saved_through_timestamp_seconds"]
    )
    slos = Store(f"sqlite:///{tmp_path / 'data' / 'llmslo.db'}")
    try:
        saved = load_saved(slos)
        assert set(saved.fingerprint) == {"chat-errors", "chat-ttft", "cache:chat"}
        assert {k for k, *_ in saved.rows} >= {"chat-errors", "chat-ttft"}
    finally:
        slos.close()

    # the TTFT threshold changes: errors resume from the saved counts, ttft is counted again from
    # the stored rollups in the background, then both have their status and are saved
    rules = (tmp_path / "rules.yaml").read_text()
    (tmp_path / "rules.yaml").write_text(rules.replace("threshold: 1s", "threshold: 2s"))

    def recounted(base: str) -> tuple[dict[str, float], dict[str, object]] | None:
        found = fill_metrics(base)
        if found is None or "llmslo_slo_ledger_recount_seconds" not in found:
            return None
        total = ttft_total(base)
        return (found, total) if total > 0 else None  # a pass after it

    with llmslo_serve(config, port) as base:
        third, recounted_total = wait_for(lambda: recounted(base), timeout=60)
    assert third["llmslo_slo_ledger_fill_rollup_rows"] < stored / 20  # the errors objective resumed
    assert third["llmslo_slo_ledger_recounting_keys"] == 0.0
    # the TTFT histograms alone: fewer rows than the first start's fill of every SLO series
    assert 0 < third["llmslo_slo_ledger_recount_rollup_rows"] < first["llmslo_slo_ledger_fill_rollup_rows"] / 2
    # the day's requests (the threshold moves none of them), not the minutes since the start
    assert recounted_total >= counted > 0, (recounted_total, counted)
    slos = Store(f"sqlite:///{tmp_path / 'data' / 'llmslo.db'}")
    try:
        again = load_saved(slos)
        assert again.fingerprint["chat-errors"] == saved.fingerprint["chat-errors"]
        assert again.fingerprint["chat-ttft"] != saved.fingerprint["chat-ttft"]
    finally:
        slos.close()


def serve_until(cmd: list[str], env: dict[str, str], line_wanted: str) -> tuple[str, float]:
    """`serve` started, and stopped with SIGINT as soon as it logs `line_wanted`: its whole
    output, and how long the stop took. It must exit 0 without a traceback."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line_wanted in line:
            break
    proc.send_signal(signal.SIGINT)
    asked = time.monotonic()
    out = "".join(lines) + proc.communicate(timeout=60)[0]
    stopped_in = time.monotonic() - asked
    assert proc.returncode == 0 and "Traceback" not in out, out
    return out, stopped_in


def test_a_stop_during_the_first_fill_ends_at_once_and_the_next_start_fills_whole(
    tmp_path: Path, targets: TargetServer
) -> None:
    """SIGINT while a first start counts days of stored rollups (many minutes at fleet size): the
    fill stops at its next piece and `serve` exits within seconds, not when the fill would have
    ended, with nothing of it saved; the next start fills the ledger whole. Drift's first pass
    waits for the fill meanwhile (the log tells which ran when)."""
    port = free_port()
    config = tmp_path / "llmslo.yaml"
    (tmp_path / "rules.yaml").write_text(
        "version: v1\nevaluation_interval: 1s\nbusiness_types:\n  chat:\n    objectives:\n"
        "      - {name: ttft, sli: latency, metric: ttft, threshold: 1s, objective: 0.95}\n"
    )
    names = [f"healthy-{i}" for i in range(FILL_TARGETS)]
    config.write_text(
        f"data_dir: {tmp_path / 'data'}\nrules: {tmp_path / 'rules.yaml'}\nderive_interval: 1s\n"
        "scrape: {interval: 1s, timeout: 800ms}\ndrift: {interval: 1s}\ntargets:\n"
        + "".join(f'  - {{name: {n}, url: "{targets.url("/healthy")}", business_type: chat}}\n' for n in names)
    )
    rt = Runtime(load_settings(config))
    stored = fill_history(rt, 2, time.time() - 120)
    rt.store.close()
    env = {**os.environ, "LLMSLO_SERVER__PORT": str(port)}
    cmd = [sys.executable, "-m", "collector.cli", "serve", "--config", str(config)]
    out, stopped_in = serve_until(cmd, env, "SLO ledger: filling")
    assert "the SLO ledger's first fill stopped at shutdown" in out, out
    assert "SLO ledger filled" not in out and "drift reference rebuilt" not in out, out
    assert "drift: the first pass waits for the SLO ledger's first fill" in out, out
    slos = Store(f"sqlite:///{tmp_path / 'data' / 'llmslo.db'}")
    try:
        assert not load_saved(slos).rows  # nothing of the stopped fill
    finally:
        slos.close()

    # the same start, not stopped: how long the fill takes; the stop above came well before
    out, _ = serve_until(cmd, env, "drift reference rebuilt")
    filled = re.search(r"SLO ledger filled in ([\d.]+) s: nothing saved, then (\d+) stored rollup rows", out)
    assert filled is not None, out
    assert int(filled.group(2)) >= stored * 0.9
    # drift's first build came after the fill, not beside it
    assert out.index("SLO ledger filled") < out.index("drift reference rebuilt"), out
    assert stopped_in < float(filled.group(1)) / 2, (stopped_in, filled.group(1))

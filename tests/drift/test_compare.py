"""Canary comparison on the simulator: a slower candidate model on a share of chat traffic is
rolled back with the TTFT change and its interval; an identical one is promoted; a canary with
too little traffic is held; the command exits accordingly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from collector.config import Settings
from collector.drift.compare import Selector, SelectorError
from collector.runtime import Runtime
from collector.sim.fastclock import run_into_store, targets_for
from collector.sim.scenario import parse_scenario
from collector.store.repository import Store
from tests.reads import record_reads

SCENARIO = """\
version: v1
seed: 5
start: 2026-01-05T10:00:00Z
vllm_version: current
workload: {{requests_per_second: 4, daily_amplitude: 0.0}}
business_types:
  chat:
    share: 1.0
    prompt_tokens: {{median: 600, sigma: 0.4}}
    output_tokens: {{median: 80, sigma: 0.4}}
    max_tokens: 512
    system_prompt_tokens: 0
    system_prompts: 1
    tenants: [acme]
deployments:
  - name: stable
    model: {{name: chat-model, params_billion: 8, layers: 32, kv_heads: 8, head_dim: 128}}
    gpu_memory_gb: 80
    replicas: 1
    business_types: [chat]
    max_num_seqs: 256
    prefill_tokens_per_second: 4000
    decode_seconds_per_token: 0.01
  - name: canary
    model: {{name: chat-model-v2, params_billion: 8, layers: 32, kv_heads: 8, head_dim: 128}}
    gpu_memory_gb: 80
    replicas: 1
    business_types: [chat]
    max_num_seqs: 256
    prefill_tokens_per_second: {canary_prefill}
    decode_seconds_per_token: 0.01
    traffic_share: {share}
"""


def last(now: float, seconds: int = 900) -> tuple[int, int]:
    """The 15 minutes ending with the minute holding `now`."""
    end = int(now) // 60 * 60 + 60
    return end - seconds, end


def simulate(tmp_path: Path, canary_prefill: float, share: float) -> tuple[Runtime, float]:
    scenario = parse_scenario(SCENARIO.format(canary_prefill=canary_prefill, share=share), "canary")
    targets = targets_for(scenario)
    labelled = [t.model_copy(update={"labels": {"track": t.name.split("-")[0]}}) for t in targets]
    settings = Settings(data_dir=str(tmp_path), targets=labelled)
    store = Store(settings.resolved_database_url)
    run_into_store(scenario, store, 20 * 60, scrape_interval=5.0, settings=settings)
    return Runtime(settings, store), scenario.start_unix + 20 * 60 - 1


def test_a_slower_canary_is_rolled_back_with_its_interval(tmp_path: Path) -> None:
    rt, now = simulate(tmp_path, canary_prefill=1500, share=0.3)  # prefill 2.7x slower
    c = rt.compare(Selector.parse("model=chat-model"), Selector.parse("model=chat-model-v2"), *last(now))
    assert c.verdict == "rollback", c.reason
    ttft = {m.name: m for m in c.metrics}["ttft_p95"]
    assert ttft.verdict == "rollback" and ttft.ci is not None
    assert ttft.change is not None and ttft.ci[0] <= ttft.change <= ttft.ci[1] and ttft.ci[0] > 0.10
    assert c.reason.startswith("rollback: TTFT p95 +") and "(CI +" in c.reason
    assert ttft.p_value is not None and ttft.p_value < 0.001
    # labels select the same populations
    by_label = rt.compare(Selector.parse("label.track=stable"), Selector.parse("label.track=canary"), *last(now))
    assert by_label.verdict == "rollback" and by_label.candidate_requests == c.candidate_requests
    # as a deployment gate: exit 1 and the JSON report
    config = tmp_path / "llmslo.yaml"
    config.write_text(yaml.safe_dump(rt.settings.model_dump(include={"data_dir", "targets"}, mode="json")))
    from datetime import UTC, datetime

    at = datetime.fromtimestamp(now, UTC).isoformat()
    gate = subprocess.run(
        [sys.executable, "-m", "collector.cli", "compare", "--config", str(config), "--baseline", "model=chat-model",
         "--candidate", "model=chat-model-v2", "--window", "15m", "--at", at, "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert gate.returncode == 1, gate.stderr
    report = json.loads(gate.stdout)
    assert report["verdict"] == "rollback" and report["candidate_requests"] == c.candidate_requests


def test_an_identical_canary_is_promoted_and_a_quiet_one_held(tmp_path: Path) -> None:
    rt, now = simulate(tmp_path / "same", canary_prefill=4000, share=0.5)
    c = rt.compare(Selector.parse("deployment=stable"), Selector.parse("target=canary-0"), *last(now))
    # (no inventory: `deployment=` selects nothing, so the baseline is empty) -> hold
    assert c.verdict == "hold" and "not enough data" in c.reason
    c = rt.compare(Selector.parse("target=stable-0"), Selector.parse("target=canary-0"), *last(now))
    assert c.verdict == "promote", c.reason
    rt2, now2 = simulate(tmp_path / "quiet", canary_prefill=1500, share=0.02)
    quiet = rt2.compare(Selector.parse("target=stable-0"), Selector.parse("target=canary-0"), *last(now2))
    assert quiet.verdict == "hold" and quiet.reason.startswith("hold: not enough data")
    # the gate's tolerances: from the configuration's `compare:`, and per run on the command line
    n = quiet.candidate_requests
    assert 20 < n < 100, n
    config = tmp_path / "quiet.yaml"
    dumped = rt2.settings.model_dump(include={"data_dir", "targets"}, mode="json")
    config.write_text(yaml.safe_dump({**dumped, "compare": {"min_requests": 20}}))
    from datetime import UTC, datetime

    at = datetime.fromtimestamp(now2, UTC).isoformat()
    cmd = [sys.executable, "-m", "collector.cli", "compare", "--config", str(config), "--baseline", "target=stable-0",
           "--candidate", "target=canary-0", "--window", "15m", "--at", at, "--json"]  # fmt: skip
    judged = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert judged.returncode == 1, (judged.stdout, judged.stderr)  # 20 requests suffice: the slow canary fails
    assert json.loads(judged.stdout)["verdict"] == "rollback"
    lenient = subprocess.run([*cmd, "--tolerance-p95", "900%", "--tolerance-p50", "9"], capture_output=True, text=True)
    assert lenient.returncode == 0, lenient.stdout  # within a 9x tolerance: promote
    assert {m["tolerance"] for m in json.loads(lenient.stdout)["metrics"] if m["name"] == "ttft_p95"} == {9.0}
    strict = subprocess.run([*cmd, "--min-requests", str(int(n) + 1)], capture_output=True, text=True)
    assert strict.returncode == 3 and json.loads(strict.stdout)["verdict"] == "hold"
    bad = subprocess.run([*cmd, "--tolerance-p95", "ten"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--tolerance-p95 'ten'" in bad.stderr


def test_a_long_comparison_reads_a_piece_at_a_time_and_judges_as_one_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A day of a large fleet's minutes is tens of millions of rows: `compare` reads the engines'
    rows a piece at a time (`Runtime.read_pieces`) and adds each piece into both sides. Cut into
    one-minute reads, it judges exactly as one read of the whole range does."""
    import collector.runtime as runtime_module
    from collector.drift.compare import COMPARE_METRICS, Tolerances, collect, compare_sides

    rt, now = simulate(tmp_path, canary_prefill=1500, share=0.3)
    # every stored minute counts as recent (the scenario is in the past), read a minute at a time
    retention = rt.settings.retention.model_copy(update={"minute_rollups": 10 * 365 * 86400.0})
    rt.settings = rt.settings.model_copy(update={"retention": retention})
    monkeypatch.setattr(runtime_module, "read_step", lambda series: 60)
    read = rt.store.read_rows
    spans = record_reads(monkeypatch, rt.store)
    base, cand = Selector.parse("model=chat-model"), Selector.parse("model=chat-model-v2")
    lo, hi = last(now)
    pieces = rt.compare(base, cand, lo, hi, source="engines")
    assert spans and max(spans) == 60 and len(spans) == (hi - lo) // 60

    rows = read(lo, hi, metrics=COMPARE_METRICS)
    tol = Tolerances(**rt.settings.compare.model_dump())

    def whole_side(model: str) -> Any:
        return collect(rows, lambda target, m: m == model)

    whole = compare_sides(
        whole_side("chat-model"), whole_side("chat-model-v2"), (base.text, cand.text), hi - lo, tol, "engines"
    )
    assert pieces.verdict == whole.verdict == "rollback"
    assert (pieces.baseline_requests, pieces.candidate_requests) == pytest.approx(
        (whole.baseline_requests, whole.candidate_requests), rel=1e-12
    )
    assert [m.name for m in pieces.metrics] == [m.name for m in whole.metrics]
    for a, b in zip(pieces.metrics, whole.metrics, strict=True):
        assert a.verdict == b.verdict, a.name
        for got, want in ((a.baseline, b.baseline), (a.candidate, b.candidate)):
            assert got == want if want is None else got == pytest.approx(want, rel=1e-9, nan_ok=True), a.name


def test_selectors_say_what_is_wrong() -> None:
    for bad in ("model", "colour=red", "label.=x", "target="):
        with pytest.raises(SelectorError, match="selector"):
            Selector.parse(bad)

"""Drift on simulated traffic fed through the collector's own ingestion, scraped every second:
a prompt-length shift and a prefix-cache collapse are reported, with their explanation and
start, within two minutes of starting; a long unchanged run raises nothing (the false-alert
rate is measured and printed); a quiet business type is never judged."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from collector.config import DriftConfig, Settings
from collector.drift import monitor as monitor_module
from collector.drift.engine import Finding
from collector.drift.monitor import DriftMonitor
from collector.rollup import Row
from collector.runtime import Runtime
from collector.sim.fastclock import SpanWriter, run_into_store, targets_for
from collector.sim.scenario import parse_scenario
from collector.store.repository import Store
from collector.traces.rollup import RequestCell, RequestKey
from collector.traces.store import read_requests, request_volumes

SCENARIO = """\
version: v1
seed: 11
start: 2026-01-05T10:00:00Z
vllm_version: current
workload: {{requests_per_second: 4, daily_amplitude: 0.0, prefix_cache_ttl: 10m}}
business_types:
  chat:
    share: 0.97
    prompt_tokens: {{median: 190, sigma: 0.4}}
    output_tokens: {{median: 120, sigma: 0.4}}
    max_tokens: 1024
    system_prompt_tokens: {system}
    system_prompts: 3
    tenants: [acme]
  batch:
    share: 0.03
    prompt_tokens: {{median: 2000, sigma: 0.3}}
    output_tokens: {{median: 300, sigma: 0.3}}
    max_tokens: 2048
    system_prompt_tokens: 0
    system_prompts: 1
    tenants: [analytics]
deployments:
  - name: chat
    model: {{name: chat-model, params_billion: 8, layers: 32, kv_heads: 8, head_dim: 128}}
    gpu_memory_gb: 80
    replicas: 1
    business_types: [chat]
    max_num_seqs: 256
    max_model_len: 16384
    prefill_tokens_per_second: 40000
    decode_seconds_per_token: 0.005
  - name: batch
    model: {{name: batch-model, params_billion: 8, layers: 32, kv_heads: 8, head_dim: 128}}
    gpu_memory_gb: 80
    replicas: 1
    business_types: [batch]
    max_num_seqs: 64
    max_model_len: 16384
incidents: [{incidents}]
"""
SHIFT_AT = 30 * 60


def run(
    tmp_path: Path,
    incidents: str,
    minutes: int,
    every: float = 15.0,
    from_minute: int = 29,
    system: int = 0,
    scrape_interval: float = 1.0,
    spans: bool = False,
) -> tuple[Runtime, float, list[tuple[float, list[Finding]]]]:
    """Simulate, judging drift every `every` seconds of virtual time from `from_minute` on,
    on what has been stored so far (as a live collector would): [(now, findings), ...]."""
    scenario = parse_scenario(SCENARIO.format(incidents=incidents, system=system), "test")
    settings = Settings.model_validate(
        {
            "data_dir": str(tmp_path),
            "targets": [t.model_dump() for t in targets_for(scenario)],
            "drift": {"window": "5m", "reference_length": "25m", "min_events": 100, "tenants": False},
        }
    )
    store = Store(settings.resolved_database_url)
    rt = Runtime(settings, store)
    t0 = scenario.start_unix
    passes: list[tuple[float, list[Finding]]] = []

    def judge(t: float, replica: str, _body: str | None) -> None:
        if replica == "chat-0" and t >= from_minute * 60 and t % every == 0:
            assert rt.drift is not None
            passes.append((t0 + t, rt.drift.evaluate(t0 + t - 0.5)))  # before this second's scrape

    writer = SpanWriter(store, t0) if spans else None  # a gateway span per request, with its tenant
    run_into_store(
        scenario, store, minutes * 60, scrape_interval=scrape_interval, settings=settings, on_scrape=judge,
        on_finish=writer,
    )  # fmt: skip
    if writer is not None:
        writer.flush()
    return rt, t0, passes


def test_a_prompt_length_shift_is_reported_within_two_minutes_with_its_explanation(tmp_path: Path) -> None:
    shift = f"{{kind: prompt_drift, start: {SHIFT_AT}s, duration: 10m, target: chat, factor: 3.6}}"
    rt, t0, passes = run(tmp_path, shift, 36)
    assert rt.drift is not None
    seen = None
    for now, out in passes:
        found = {(f.business_type, f.signal): f for f in out if f.drifted}
        if now < t0 + SHIFT_AT:
            assert ("chat", "prompt_length") not in found, "reported before the shift"
        elif ("chat", "prompt_length") in found:
            seen = now, found[("chat", "prompt_length")]
            break
    assert seen is not None, "the shift was never reported"
    when, finding = seen
    delay = when - (t0 + SHIFT_AT)
    print(f"\nprompt-length shift reported {delay:.0f} s after it started: {finding.summary}")
    assert 0 < delay <= 120
    assert finding.summary.startswith("chat prompt length p50 ")
    assert "of requests now above" in finding.summary and "KV-cache need at p95 context ×" in finding.summary
    # the shifted part is described: p50 up by about the shift's factor (x3.6 on the user prompt)
    p50 = finding.summary.split("(×")[1].split(")")[0]
    assert 2.5 <= float(p50) <= 4.5
    assert finding.started_unix is not None and abs(finding.started_unix - (t0 + SHIFT_AT)) <= 120
    # the same from the command line, on the database the collector wrote
    config = tmp_path / "llmslo.yaml"
    config.write_text(yaml.safe_dump(rt.settings.model_dump(include={"data_dir", "targets", "drift"}, mode="json")))
    at = datetime.fromtimestamp(when - 0.5, UTC).isoformat()
    cli = subprocess.run(
        [sys.executable, "-m", "collector.cli", "drift", "--config", str(config), "--at", at, "--fail-on-drift"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert cli.returncode == 1, cli.stderr
    # (the stored minute holding --at is read whole: the figures include its later seconds)
    assert "DRIFT" in cli.stdout and "\nchat prompt length p50 189 tokens → " in cli.stdout
    # batch traffic (3 %) stays under min_events in 5 minutes: never judged
    assert not any(f.business_type == "batch" for _, out in passes for f in out)
    # the alert, through llmslo's evaluator
    rules = Path(__file__).resolve().parents[2] / "rules"
    rt2 = Runtime(rt.settings.model_copy(update={"rules": str(rules)}), rt.store)
    assert rt2.drift is not None
    rt2.drift.evaluate(float(when) + 300)
    rt2.evaluate_slos(float(when) + 300)
    firing = [a for a in rt2.alerts.instances.values() if a.labels["alertname"] == "LLMSLOWorkloadDrift"]
    assert {(a.labels["signal"], a.labels["severity"]) for a in firing} >= {("prompt_length", "ticket")}


def test_with_15_second_scrapes_a_shift_is_reported_within_two_intervals_and_a_minute(tmp_path: Path) -> None:
    """The general bound: a shift is in the window once two scrapes carry it, and the drift pass
    runs every 15 s (derive_interval); the minute a scrape lands in is read whole."""
    shift = f"{{kind: prompt_drift, start: {SHIFT_AT}s, duration: 10m, target: chat, factor: 3.6}}"
    _rt, t0, passes = run(tmp_path, shift, 36, scrape_interval=15.0)
    first = next((now for now, out in passes if any(f.signal == "prompt_length" and f.drifted for f in out)), None)
    assert first is not None, "the shift was never reported"
    assert not any(f.signal == "prompt_length" and f.drifted for now, out in passes if now < t0 + SHIFT_AT for f in out)
    delay = first - (t0 + SHIFT_AT)
    print(f"\nwith 15 s scrapes: reported {delay:.0f} s after the shift started (bound {2 * 15 + 60} s)")
    assert 0 < delay <= 2 * 15 + 60


def test_a_prefix_cache_collapse_is_reported(tmp_path: Path) -> None:
    collapse = f"{{kind: prefix_cache_collapse, start: {SHIFT_AT}s, duration: 10m, target: chat}}"
    _rt, t0, passes = run(tmp_path, collapse, 33, system=400)  # shared system prompts: hits
    reported = [
        (now, f) for now, out in passes for f in out if f.business_type == "chat" and f.signal == "prefix_cache"
        and f.drifted
    ]  # fmt: skip
    assert reported, "the collapse was never reported"
    now, finding = reported[0]
    assert t0 + SHIFT_AT < now <= t0 + SHIFT_AT + 120
    found = {"prefix_cache": finding}
    assert "hit " in found["prefix_cache"].summary and "miss " in found["prefix_cache"].summary


def test_no_change_raises_nothing_over_a_long_run(tmp_path: Path) -> None:
    _rt, _t0, passes = run(tmp_path, "", 75, every=30.0, from_minute=30)
    judged = sum(len(out) for _, out in passes)
    drifted = sum(f.drifted for _, out in passes for f in out)
    print(f"\nno-change run: {drifted} of {judged} judgements drifted over {len(passes)} passes")
    assert judged >= len(passes) * 5  # every engine signal of chat was judged, not skipped
    assert drifted == 0


def test_a_pinned_baseline_is_stored_by_the_command_and_judges_later_windows(tmp_path: Path) -> None:
    shift = f"{{kind: prompt_drift, start: {SHIFT_AT}s, duration: 10m, target: chat, factor: 3.6}}"
    rt, t0, _passes = run(tmp_path, shift, 36, every=600.0, from_minute=35)
    config = tmp_path / "llmslo.yaml"
    drift = {"reference": "pinned", "baseline": "before-shift", "tenants": False, "window": "2m"}
    pinned = {**rt.settings.model_dump(include={"data_dir", "targets"}, mode="json"), "drift": drift}
    config.write_text(yaml.safe_dump(pinned))
    start, end = (datetime.fromtimestamp(t0 + m * 60, UTC).isoformat() for m in (2, 27))
    cli = subprocess.run(
        [sys.executable, "-m", "collector.cli", "drift", "pin", "--config", str(config), "--name", "before-shift",
         "--start", start, "--end", end],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    assert "pinned baseline 'before-shift'" in cli.stdout and "calibrated for the 2-minute window" in cli.stdout
    later = Runtime(Settings.model_validate({**pinned, "data_dir": str(tmp_path)}), rt.store)
    assert later.drift is not None
    found = {f.signal: f for f in later.drift.evaluate(t0 + SHIFT_AT + 240) if f.business_type == "chat"}
    assert found["prompt_length"].drifted and found["prompt_length"].threshold.calibrated
    assert later.drift.reference is not None and later.drift.reference.end == int(t0 + 27 * 60)
    quiet = {f.signal: f for f in later.drift.evaluate(t0 + 20 * 60) if f.business_type == "chat"}
    assert not quiet["prompt_length"].drifted
    # no such baseline: nothing judged, said once in the log, no failure
    missing = Runtime(
        Settings.model_validate(
            {**pinned, "data_dir": str(tmp_path), "drift": {"reference": "pinned", "baseline": "x"}}
        ),
        rt.store,
    )
    assert missing.drift is not None and missing.drift.evaluate(t0 + SHIFT_AT + 240) == []


def same_reference(kept: DriftMonitor, fresh: DriftMonitor) -> None:
    """Two monitors' references and findings are the same (totals, calibrated thresholds, tenants)."""
    a, b = kept.reference, fresh.reference
    assert a is not None and b is not None and (a.start, a.end) == (b.start, b.end)
    assert a.totals.keys() == b.totals.keys() and a.thresholds.keys() == b.thresholds.keys()
    assert any(tenant for (_bt, tenant), _signal in a.totals), "no tenant judged"
    for key, pop in b.totals.items():
        assert (a.totals[key].events, a.totals[key].cats, a.totals[key].hist) == (pop.events, pop.cats, pop.hist)
        assert a.thresholds[key].psi == pytest.approx(b.thresholds[key].psi, rel=1e-9), key
    assert [f.summary for f in kept.latest] == [f.summary for f in fresh.latest]


def counted(monitor: DriftMonitor) -> list[int]:
    """The engines' minutes each of `monitor`'s rebuilds reads (what its `_hold` returns)."""
    minutes_read: list[int] = []
    held = monitor._hold
    monitor._hold = lambda ranges, now: minutes_read.append(held(ranges, now)) or minutes_read[-1]  # type: ignore[method-assign]
    return minutes_read


def test_the_reference_kept_between_rebuilds_equals_a_whole_re_read(tmp_path: Path) -> None:
    """The running monitor keeps its reference's minutes and reads only those that entered it
    since the last rebuild; each rebuilt reference (totals and calibrated thresholds, tenants
    included) equals the one a fresh monitor builds by reading the whole reference."""
    shift = f"{{kind: prompt_drift, start: {SHIFT_AT}s, duration: 10m, target: chat, factor: 3.6}}"
    rt, t0, _ = run(tmp_path, shift, 45, every=1e9, spans=True)  # history only: judged below
    config = rt.settings.drift.model_copy(update={"refresh": 120.0, "tenants": True, "min_events": 50})

    def monitor() -> DriftMonitor:
        return DriftMonitor(
            config,
            lambda lo, hi, metrics: rt.store.read_rows(lo, hi, metrics=metrics),
            lambda lo, hi, tenants: read_requests(rt.store, lo, hi, tenants=tenants),
            lambda lo, hi: request_volumes(rt.store, lo, hi),
            rt.business_type_of,
        )

    kept = monitor()
    minutes_read = counted(kept)
    for now in range(int(t0) + 26 * 60 + 30, int(t0) + 45 * 60, 150):
        kept.evaluate(float(now))
        fresh = whole_reader(rt, config)
        fresh.evaluate(float(now))
        same_reference(kept, fresh)
    assert any(f.drifted for f in kept.latest), "the shift is judged from the kept reference too"
    # the first rebuild reads the whole 25-minute reference; each later one the 2.5 minutes that
    # entered it and the 3 that had not settled yet
    print(f"\nminutes read per rebuild: {minutes_read}")
    assert minutes_read[0] == 25 and max(minutes_read[1:]) <= 6, minutes_read


def test_full_rebuilds_read_the_spans_again_and_the_engines_in_pieces_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every FULL_REBUILD_SECONDS the spans' part of the reference is read whole again (the
    busiest tenants chosen again, late spans seen); the engines' settled minutes are read once,
    READ_CHUNK_SECONDS at a time (a day of a thousand targets' rows was ~16 million, read whole
    every hour), and every rebuilt reference still equals a fresh monitor's."""
    monkeypatch.setattr(monitor_module, "FULL_REBUILD_SECONDS", 300.0)
    monkeypatch.setattr(monitor_module, "READ_CHUNK_SECONDS", 240)
    monkeypatch.setattr(monitor_module, "SPAN_CHUNK_SECONDS", 300)
    shift = f"{{kind: prompt_drift, start: {SHIFT_AT}s, duration: 10m, target: chat, factor: 3.6}}"
    rt, t0, _ = run(tmp_path, shift, 45, every=1e9, spans=True)
    config = rt.settings.drift.model_copy(update={"refresh": 120.0, "tenants": True, "min_events": 50})
    engine_reads: list[tuple[int, int]] = []
    span_reads: list[tuple[int, int, frozenset[str] | None]] = []
    volume_reads: list[tuple[int, int]] = []

    def rows(lo: int, hi: int, metrics: Sequence[str]) -> Sequence[Row]:
        engine_reads.append((lo, hi))
        return rt.store.read_rows(lo, hi, metrics=metrics)

    def requests(lo: int, hi: int, tenants: Collection[str] | None) -> Sequence[tuple[RequestKey, RequestCell]]:
        span_reads.append((lo, hi, None if tenants is None else frozenset(tenants)))
        return read_requests(rt.store, lo, hi, tenants=tenants)

    def volumes(lo: int, hi: int) -> Mapping[str, float]:
        volume_reads.append((lo, hi))
        return request_volumes(rt.store, lo, hi)

    kept = DriftMonitor(config, rows, requests, volumes, rt.business_type_of)
    minutes_read = counted(kept)
    for now in range(int(t0) + 26 * 60 + 30, int(t0) + 45 * 60, 150):
        kept.evaluate(float(now))
        fresh = whole_reader(rt, config)
        fresh.evaluate(float(now))
        same_reference(kept, fresh)
    assert max(hi - lo for lo, hi in engine_reads) <= 240, "the engines' rows are read in pieces"
    assert minutes_read[0] == 25 and max(minutes_read[1:]) <= 6, minutes_read  # never the whole reference again
    # the busiest tenants are chosen from the whole reference's volumes, at the start and every 300 s
    assert len([r for r in volume_reads if r[1] - r[0] >= 25 * 60]) >= 3, volume_reads
    # the spans themselves are read in pieces on the 300 s clock, only the chosen tenants' cells
    assert span_reads and all(lo // 300 == (hi - 1) // 300 for lo, hi, _ in span_reads), span_reads
    assert all(tenants for _, _, tenants in span_reads), "never every tenant's cells"


def whole_reader(rt: Runtime, config: DriftConfig) -> DriftMonitor:
    """A monitor as drift was before its reads were chunked: every span cell of a range read at
    once and the busiest tenants counted from them in Python (the oracle of the store's sums)."""

    def volumes(lo: int, hi: int) -> dict[str, float]:
        out: dict[str, float] = {}
        for key, cell in read_requests(rt.store, lo, hi):
            out[key.tenant] = out.get(key.tenant, 0.0) + cell.total
        return out

    return DriftMonitor(
        config,
        lambda lo, hi, metrics: rt.store.read_rows(lo, hi, metrics=metrics),
        lambda lo, hi, tenants: read_requests(rt.store, lo, hi),  # every tenant's: span_minutes picks
        volumes,
        rt.business_type_of,
    )

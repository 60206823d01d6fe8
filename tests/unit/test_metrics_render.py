"""The per-target self-metrics, rendered by hand for speed: valid exposition text that
prometheus_client's own parser reads back, value for value, with the rest of /metrics."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from collector.api.metrics import TARGET_FAMILIES, TargetRenderer, build_registry, render_targets
from collector.config import Settings
from collector.runtime import Runtime


def test_target_families_parse_back_and_join_the_rest(tmp_path: Path) -> None:
    settings = Settings.model_validate(
        {
            "data_dir": str(tmp_path),
            "targets": [
                {"name": "vllm-a", "url": "http://127.0.0.1:9/metrics"},
                {"name": "vllm.b:1", "url": "http://127.0.0.1:9/metrics"},
            ],
        }
    )
    rt = Runtime(settings)
    a = rt.scrapers["vllm-a"].status
    a.up, a.last_duration_seconds, a.samples, a.scrapes_total, a.last_scrape_unix = True, 0.25, 311, 7, 1.7e9
    a.errors_total["timeout"] += 2
    a.restarts_total, a.last_restart_unix, a.process_start_unix = 1, 1.69e9, 1.69e9
    text = generate_latest(build_registry(rt)).decode() + render_targets(rt)
    families = list(text_string_to_metric_families(text))
    names = [f.name for f in families]
    assert len(names) == len(set(names)), "a family is rendered twice"
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}
    assert samples[("llmslo_target_up", (("target", "vllm-a"),))] == 1.0
    assert samples[("llmslo_scrape_duration_seconds", (("target", "vllm-a"),))] == 0.25
    assert samples[("llmslo_scrapes_total", (("target", "vllm-a"),))] == 7
    assert samples[("llmslo_scrape_errors_total", (("reason", "timeout"), ("target", "vllm-a")))] == 2
    # every reason is a series from the start (at 0, so increase() sees the first failure); a
    # target never scraped has no up or duration yet
    assert samples[("llmslo_scrape_errors_total", (("reason", "connect"), ("target", "vllm.b:1")))] == 0
    assert ("llmslo_target_up", (("target", "vllm.b:1"),)) not in samples
    assert samples[("llmslo_scrapes_total", (("target", "vllm.b:1"),))] == 0
    types = {f.name: f.type for f in families}
    for name, kind, _ in TARGET_FAMILIES:
        assert types[name.removesuffix("_total") if kind == "counter" else name] == kind


def test_kept_target_lines_follow_their_values(tmp_path: Path) -> None:
    """The renderer reuses a target's text while its values hold: a changed value, a new error
    reason and a target that is no longer configured all show at the next render, and a render
    equals a fresh one."""
    targets = [{"name": f"vllm-{i}", "url": "http://127.0.0.1:9/metrics"} for i in range(3)]
    rt = Runtime(Settings.model_validate({"data_dir": str(tmp_path), "targets": targets}))
    for scraper in rt.scrapers.values():
        scraper.status.up, scraper.status.scrapes_total = True, 1
    renderer = TargetRenderer()
    first = renderer.render(rt)
    assert renderer.render(rt) == first == render_targets(rt)
    st = rt.scrapers["vllm-1"].status
    st.scrapes_total, st.up = 2, False
    st.errors_total["timeout"] += 1
    del rt.scrapers["vllm-2"]
    second = renderer.render(rt)
    assert second == render_targets(rt) != first
    assert 'llmslo_scrapes_total{target="vllm-1"} 2.0' in second
    assert 'llmslo_target_up{target="vllm-1"} 0.0' in second
    assert 'llmslo_scrape_errors_total{target="vllm-1",reason="timeout"} 1.0' in second
    assert 'target="vllm-2"' not in second


def test_metrics_render_while_incident_and_slo_alerts_are_active(tmp_path: Path) -> None:
    """An incident alert (a restart, drift: no `slo` label) and a burn-rate alert active at once:
    /metrics renders (it raised KeyError before), listing the burn-rate alert in its SLO family."""
    from collector.slo.alerts import AlertInstance

    rt = Runtime(Settings.model_validate({"data_dir": str(tmp_path), "rules": "rules"}))
    restart = {"alertname": "LLMSLOTargetRestarted", "severity": "ticket", "target": "chat-0", "business_type": "chat"}
    burn = {"alertname": "LLMSLOChatErrorsBudgetBurn", "severity": "page", "slo": "chat-errors",
            "business_type": "chat", "long_window": "1h", "short_window": "5m"}  # fmt: skip
    for i, labels in enumerate((restart, burn)):
        rt.alerts.instances[str(i)] = AlertInstance(str(i), labels, {}, "firing", 1.7e9)
    text = generate_latest(build_registry(rt)).decode()
    firing = [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == "llmslo_slo_alert_firing"]
    assert [s.labels["slo"] for s in firing] == ["chat-errors"]


def test_slo_event_counters_grow_by_what_the_servers_counted_and_never_drop_on_a_restart(tmp_path: Path) -> None:
    """`llmslo_slo_events_total` / `_good_events_total` count the engine events llmslo has seen
    since it started: between two renders they grow by exactly what the servers' own cumulative
    counts grew by, per business type (a model no rule lists counts nowhere), and a replica's
    restart never makes them drop. (A sum of the servers' own counters would drop, and rate()
    would read the drop as a reset of the whole fleet: every event of the other replicas' lives
    counted again in one window.)"""
    from prometheus_client.parser import text_string_to_metric_families

    from collector.analytics.percentiles import fraction_at_or_below
    from collector.slo.evaluate import ERROR_REASONS
    from collector.sources.vllm import Kind

    body = (Path(__file__).parents[2] / "collector" / "data" / "vllm-0.13-sample.txt").read_text()
    created = 1.7682643398898673e9  # the sample's _created timestamps
    targets = [
        {"name": "chat-0", "url": "http://127.0.0.1:9/metrics", "business_type": "chat"},
        {"name": "chat-1", "url": "http://127.0.0.1:9/metrics", "business_type": "chat"},
        {"name": "code-0", "url": "http://127.0.0.1:9/metrics", "business_type": "code_completion"},
        {"name": "nowhere", "url": "http://127.0.0.1:9/metrics"},  # its model is in no rule: no SLO
    ]
    rt = Runtime(Settings.model_validate({"data_dir": str(tmp_path), "rules": "rules", "targets": targets}))
    assert rt.rules is not None
    registry = build_registry(rt)
    asyncio.run(rt.start())

    def scaled(factor: float, started: float | None = None) -> str:
        """The sample with its request and latency counts times `factor` (a restart: fewer, and
        _created at `started`)."""
        out = []
        for line in body.splitlines():
            name, _, value = line.rpartition(" ")
            if line.startswith(("vllm:request_success_total", "vllm:time_to_first_token_seconds_")):
                line = f"{name} {float(value) * factor}"
            elif started is not None and "_created{" in line and not line.startswith("#"):
                line = f"{name} {started}"
            out.append(line)
        return "\n".join(out) + "\n"

    def scrape(name: str, text: str, unix: float) -> None:
        assert rt.scrapers[name].ingest(text.encode(), None, unix)

    def rendered() -> dict[tuple[str, str], float]:
        text = generate_latest(registry).decode()
        return {
            (s.name, s.labels["slo"]): s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name in ("llmslo_slo_events_total", "llmslo_slo_good_events_total")
        }

    def counted_by_servers(names: tuple[str, ...]) -> dict[tuple[str, str], float]:
        """The same events from the servers' own cumulative counts (the oracle)."""
        assert rt.rules is not None
        out: dict[tuple[str, str], float] = {}
        for o in rt.rules.objectives:
            if o.sli not in ("latency", "error_ratio") or (o.sli == "latency" and o.source != "engine"):
                continue
            good = total = 0.0
            for name in names:
                for ident, cum in rt.scrapers[name].tracker.state.items():
                    if rt.business_type_of(name, ident.key.model) != o.business_type:
                        continue
                    if o.sli == "latency" and ident.key.metric == o.metric and ident.kind is Kind.HISTOGRAM:
                        assert o.threshold_seconds is not None and cum.buckets
                        share = fraction_at_or_below(o.threshold_seconds, ident.bounds, cum.buckets)
                        good += share[0] * cum.buckets[-1] if share else 0.0
                        total += cum.buckets[-1]
                    elif o.sli == "error_ratio" and ident.key.metric == "request_success":
                        total += cum.value
                        reason = dict(ident.key.labels).get("finished_reason")
                        good += 0.0 if reason in ERROR_REASONS else cum.value
            out[("llmslo_slo_good_events_total", o.slo)] = good
            out[("llmslo_slo_events_total", o.slo)] = total
        return out

    def grew(before: dict[tuple[str, str], float], after: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
        return {k: round(after.get(k, 0.0) - before.get(k, 0.0), 6) for k in after}

    t = created + 3600
    for name in ("chat-0", "chat-1", "code-0", "nowhere"):
        scrape(name, body, t)
    first, servers_first = rendered(), counted_by_servers(("chat-0", "chat-1", "code-0", "nowhere"))
    assert set(first) == set(servers_first)  # every engine objective, from the first render on
    # more requests on chat-0 and code-0 (same series, new counts)
    for name in ("chat-0", "code-0"):
        scrape(name, scaled(2.0), t + 15)
    second = rendered()
    servers_second = counted_by_servers(("chat-0", "chat-1", "code-0", "nowhere"))
    assert grew(first, second) == grew(servers_first, servers_second)
    assert second[("llmslo_slo_events_total", "chat-errors")] > first[("llmslo_slo_events_total", "chat-errors")]
    assert (
        second[("llmslo_slo_events_total", "code-completion-errors")]
        > first[("llmslo_slo_events_total", "code-completion-errors")]
    )
    # chat-1 restarts: its own counts fall to a quarter (a sum of the servers' counts drops), and
    # llmslo's counters grow by what the new process counted since it started
    scrape("chat-1", scaled(0.25, started=t + 20), t + 30)
    third = rendered()
    assert sum(counted_by_servers(("chat-0", "chat-1", "code-0"))[k] for k in third) < sum(
        servers_second[k] for k in third
    )
    assert all(third[k] >= second[k] for k in third)
    restarted = counted_by_servers(("chat-1",))
    assert grew(second, third) == {k: round(v, 6) for k, v in restarted.items()}
    assert restarted[("llmslo_slo_events_total", "chat-errors")] > 0

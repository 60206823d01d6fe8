"""The per-target self-metrics, rendered by hand for speed: valid exposition text that
prometheus_client's own parser reads back, value for value, with the rest of /metrics."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from collector.api.metrics import TARGET_FAMILIES, build_registry, render_targets
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

"""Alert links: the dashboard link an alert carries opens on the alert's own time range (llmslo's
evaluator knows when the alert became active and when it resolved), keeps the business type,
and for an alert on one server names its instance."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from collector.slo.alerts import AlertInstance, alert_time_range
from collector.slo.spec import load_rules

BASE = "http://grafana.example:3000/d/llmslo-overview/llmslo-overview?var-business_type=chat&from=now-6h&to=now"


def test_the_link_spans_the_alert() -> None:
    q = parse_qs(urlsplit(alert_time_range(BASE, 1_700_000_000, None)).query)
    assert q == {"var-business_type": ["chat"], "from": [str((1_700_000_000 - 3600) * 1000)], "to": ["now"]}
    q = parse_qs(urlsplit(alert_time_range(BASE, 1_700_000_000, 1_700_001_000)).query)
    assert q["to"] == [str((1_700_001_000 + 900) * 1000)]
    # a link without a time range (a runbook page, a custom dashboard URL) is left as it is
    plain = "http://grafana.example:3000/d/llmslo-overview?var-business_type=chat"
    assert alert_time_range(plain, 1_700_000_000, None) == plain


def test_alertmanager_receives_the_alerts_range_and_the_api_keeps_the_template() -> None:
    inst = AlertInstance("fp", {"alertname": "X"}, {"dashboard_url": BASE}, "firing", 1_700_000_000.0)
    sent = inst.payload(60.0, 1_700_000_500.0)["annotations"]["dashboard_url"]
    assert f"from={(1_700_000_000 - 3600) * 1000}" in sent and "to=now" in sent
    assert inst.annotations["dashboard_url"] == BASE  # the stored annotation is unchanged


def test_a_per_server_alert_names_its_instance() -> None:
    rules = load_rules("rules").rules
    url = rules.dashboard("chat", "10.0.0.5:8000")
    assert parse_qs(urlsplit(url).query)["var-instance"] == ["10.0.0.5:8000"]
    assert "var-instance" not in rules.dashboard("chat")

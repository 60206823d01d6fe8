"""Alertmanager routing: pages and tickets to their receivers, a ticket inhibited while a page
of the same SLO fires. Receivers are examples (loopback webhooks) to replace."""

from __future__ import annotations

from typing import Any

from collector.slo.spec import SloRules


def alertmanager_config(rules: SloRules, webhook_base: str = "http://127.0.0.1:9999") -> dict[str, Any]:
    del rules  # one routing tree serves every SLO: routing keys on labels the rules always set
    return {
        "route": {
            "receiver": "llmslo-tickets",
            "group_by": ["alertname", "slo", "business_type"],
            "group_wait": "30s",
            "group_interval": "5m",
            "repeat_interval": "12h",
            "routes": [
                {
                    "receiver": "llmslo-pager",
                    "matchers": ['severity="page"'],
                    "group_wait": "10s",
                    "repeat_interval": "1h",
                },
                {"receiver": "llmslo-tickets", "matchers": ['severity="ticket"']},
            ],
        },
        "inhibit_rules": [
            {
                "source_matchers": ['severity="page"'],
                "target_matchers": ['severity="ticket"'],
                "equal": ["slo", "business_type"],
            },
        ],
        "receivers": [
            {
                "name": "llmslo-pager",
                "webhook_configs": [{"url": f"{webhook_base}/pager", "send_resolved": True}],
            },
            {
                "name": "llmslo-tickets",
                "webhook_configs": [{"url": f"{webhook_base}/tickets", "send_resolved": True}],
            },
        ],
    }

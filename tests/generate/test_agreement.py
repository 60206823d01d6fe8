"""llmslo's own SLO evaluation and the generated Prometheus rules agree on the same data.

The simulator runs on a virtual clock with one scrape a minute. The same scrapes feed llmslo's
store and, as promtool input series (one sample a minute), the generated recording rules; at
several times inside and around an error burst the two burn rates must agree within 1 %.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from collector.generate.files import generate
from collector.generate.promql import error_ratio_record, num
from collector.sim.fastclock import run_into_store
from collector.sim.scenario import load_scenario
from collector.slo.evaluate import evaluate, period_bounds
from collector.slo.spec import load_rules
from collector.store.repository import Store
from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]
MINUTES = 105  # the incident scenario's chat error burst runs from 90 to 100 minutes


def test_collector_and_prometheus_burn_rates_agree(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    require(promtool is not None, "Debian's promtool (package prometheus) is not installed")
    assert promtool is not None
    scenario = load_scenario("incidents")
    rules = load_rules(ROOT / "rules").rules
    series: dict[str, list[str]] = {}

    def record(t: float, replica: str, body: str | None) -> None:
        if not replica.startswith("chat-") or body is None:
            return
        minute = int(t // 60)
        for fam in text_string_to_metric_families(body):
            for s in fam.samples:
                if s.name == "vllm:request_success_total":
                    key = (
                        f'vllm:request_success_total{{model_name="{s.labels["model_name"]}",'
                        f'finished_reason="{s.labels["finished_reason"]}",instance="{replica}"}}'
                    )
                    values = series.setdefault(key, ["_"] * (MINUTES + 1))
                    values[minute] = num(s.value)

    store = Store(f"sqlite:///{tmp_path / 'agree.db'}")
    run_into_store(scenario, store, MINUTES * 60, scrape_interval=60.0, on_scrape=record)

    budget = next(o for o in rules.objectives if o.slo == "chat-errors").error_budget
    checks = []
    for minute in (80, 93, 97, 100, 104):
        now = scenario.start_unix + minute * 60
        start, end = period_bounds(rules, now)
        status = next(s for s in evaluate(rules, store.read_rows(start, end), now) if s.objective.slo == "chat-errors")
        for window in (300.0, 1800.0, 3600.0):
            ours = status.burn_rate(window)
            assert ours is not None
            checks.append(
                {
                    "expr": f'abs({error_ratio_record(window)}{{slo="chat-errors"}} / {num(budget)} - {ours!r}) '
                    f"<= bool (0.01 * {ours!r} + 0.000001)",
                    "eval_time": f"{minute}m",
                    "exp_samples": [{"labels": '{business_type="chat",slo="chat-errors"}', "value": 1}],
                }
            )
    burst = next(
        s
        for s in evaluate(
            rules, store.read_rows(*period_bounds(rules, scenario.start_unix + 97 * 60)), scenario.start_unix + 97 * 60
        )
        if s.objective.slo == "chat-errors"
    )
    assert (burst.burn_rate(300.0) or 0) > 14.4  # the burst really burns: agreement is not 0 == 0

    for name, text in generate(rules).items():
        if name.endswith(".rules.yml"):
            (tmp_path / name).write_text(text)
    suite = {
        "rule_files": ["llmslo-recording.rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": k, "values": " ".join(v)} for k, v in series.items()],
                "promql_expr_test": checks,
            }
        ],
    }
    (tmp_path / "agree.test.yml").write_text(yaml.safe_dump(suite, width=10_000))
    proc = subprocess.run([promtool, "test", "rules", "agree.test.yml"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    store.close()

"""`llmslo generate`: every file under alerts/ from the SLO rules, with the generated header."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from collector.generate import drift
from collector.generate.alertmanager import alertmanager_config
from collector.generate.promql import GENERATED_HEADER, num, window
from collector.generate.promtool_tests import test_files
from collector.generate.rules import burn_rate_alerts, rule_files, threshold_alerts
from collector.slo.spec import SloRules

CAUSES = {
    "ttft": "queueing (`vllm:num_requests_waiting`, queue time p95), long prefills (prompt length drift), a "
    "prefix-cache collapse (hit ratio down), or a restart that cold-started the cache",
    "tpot": "a larger running batch (overload), preemptions (`vllm:num_preemptions_total`), a slower model build "
    "or GPU, or speculative decoding turned off",
    "itl": "a larger running batch, preemptions, or GPU contention",
    "e2e": "longer outputs (generation length drift) or any of the TTFT and TPOT causes",
    "queue": "too little capacity for the arrival rate: max_num_seqs or the KV cache binds",
    "errors": "aborts (clients giving up on slow responses), engine errors, or a restart",
}


def _dump(content: dict[str, Any]) -> str:
    return GENERATED_HEADER + yaml.safe_dump(content, sort_keys=False, width=10_000, allow_unicode=True)


def runbook(rules: SloRules) -> str:
    lines = [
        "<!-- " + GENERATED_HEADER.strip("# \n") + " -->",
        "",
        "# llmslo runbook",
        "",
        "One section per generated alert. Every alert links here by `runbook_url` and to its dashboard "
        "by `dashboard_url`. `GET /api/v1/slos` on llmslo shows each SLO's windows, burn rates and "
        "remaining error budget.",
        "",
    ]
    seen: set[str] = set()
    by_alert: dict[str, list[dict[str, Any]]] = {}
    for rule in burn_rate_alerts(rules) + threshold_alerts(rules) + drift.alerts(rules):
        by_alert.setdefault(rule["alert"], []).append(rule)
    objectives = {o.alert_name: o for o in rules.objectives}
    for name, group in by_alert.items():
        if name in seen:
            continue
        seen.add(name)
        first = group[0]
        lines += [f"## {name}", "", f"**{first['annotations']['summary']}.**", ""]
        o = objectives.get(name)
        if o is not None:
            pairs = ", ".join(
                f"{p.severity} {num(p.factor)}x over {window(p.long_seconds)} and {window(p.short_seconds)}"
                for p in rules.pairs
            )
            what = (
                f"share of {o.business_type} requests with {o.metric} at most {num(o.threshold_seconds or 0)} s"
                if o.sli == "latency"
                else "share of finished requests that did not end in abort or error"
            )
            lines += [
                f"- SLO `{o.slo}`: {o.description or what}. SLI: {what}; objective {num(o.objective * 100)} % "
                f"over a {window(rules.period_seconds)} {rules.calendar} period.",
                f"- Fires per window pair ({pairs}), only with at least {rules.min_events} events in the "
                "long window; never on no data.",
                f"- Likely causes: {CAUSES.get(o.metric or '', CAUSES['errors'])}.",
                "- Check: the llmslo serving dashboard for the business type; `llmslo_business_requests_waiting`, "
                "`llmslo_business_prefix_cache_hit_ratio`, prompt length quantiles; `GET /api/v1/slos`.",
                "- Act: shed or reroute load, add replicas, roll back the last model or server change; a page "
                "means users are hurt now.",
                "- Tickets on 1d and 3d windows stay open after recovery until the long window clears; check "
                "the short window before acting on one.",
                "",
            ]
        else:
            lines += [
                f"- {first['annotations']['description']}",
                "- Severity: " + ", ".join(sorted({r["labels"]["severity"] for r in group})) + ".",
                "",
            ]
    for o in rules.objectives:  # objectives Prometheus cannot compute: llmslo's evaluator pages
        if o.alert_name in seen:
            continue
        seen.add(o.alert_name)
        needs = {
            "cost_ceiling": "the inventory's GPU prices",
            "throughput": "complete time slices judged one by one",
        }.get(o.sli, "gateway spans")
        check = (
            "`llmslo cost --window 1d` and `GET /api/v1/cost` show where the dollars went (busy, idle, per group)"
            if o.sli == "cost_ceiling"
            else "`GET /api/v1/serving?window=1h` for the business type's token throughput"
            if o.sli == "throughput"
            else "`GET /api/v1/requests/summary` for the business type"
        )
        lines += [
            f"## {o.alert_name}",
            "",
            f"**{o.business_type}: SLO {o.slo} is burning its error budget.**",
            "",
            f"- SLO `{o.slo}`: {o.description or o.sli}; objective {num(o.objective * 100)} %.",
            f"- From llmslo's evaluator only (it needs {needs}, which Prometheus does not have).",
            f"- Check: {check}; `GET /api/v1/slos`.",
            "",
        ]
    for name, summary, bullets in EVALUATOR_ONLY:
        lines += [f"## {name}", "", f"**{summary}.**", "", *(f"- {b}" for b in bullets), ""]
    return "\n".join(lines).rstrip() + "\n"


# alerts only llmslo's own evaluator raises (they need what Prometheus does not have)
EVALUATOR_ONLY = (
    (
        "LLMSLOMemoryNearlyFull",
        "a deployment's memory is nearly full",
        (
            "From llmslo's evaluator only (it knows which GPUs belong to which deployment): the highest "
            "DCGM framebuffer ratio of the deployment's GPUs when its exporters answer (threshold 5 points "
            "above gpu_memory_utilization, at least kv_cache_usage), else vLLM's KV-cache usage.",
            "Check: `GET /api/v1/capacity` (memory fit at the measured peak concurrency and context), "
            "`nvidia-smi` on the node for processes besides vLLM, `vllm:num_preemptions_total`.",
            "Act: move the other process away, cap --max-num-seqs, use an fp8 KV cache, add replicas.",
            "Severity: ticket.",
        ),
    ),
)


def generate(rules: SloRules) -> dict[str, str]:
    """Relative path under alerts/ -> file text."""
    files: dict[str, str] = {}
    rule_file_content = rule_files(rules)
    for name, content in rule_file_content.items():
        files[name] = _dump(content)
    files["alertmanager.yml"] = _dump(alertmanager_config(rules))
    for name, content in test_files(rules, list(rule_file_content)).items():
        files[name] = _dump(content)
    files["RUNBOOK.md"] = runbook(rules)
    return files


def write(files: dict[str, str], out: Path) -> list[str]:
    """Write what differs; return the relative paths that changed."""
    changed = []
    for rel, text in sorted(files.items()):
        path = out / rel
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        changed.append(rel)
    return changed


def differences(files: dict[str, str], out: Path) -> list[str]:
    return [
        rel
        for rel, text in sorted(files.items())
        if not (out / rel).exists() or (out / rel).read_text(encoding="utf-8") != text
    ]


def leftovers(files: dict[str, str], out: Path) -> list[str]:
    """Generated files under `out` the rules no longer give (a renamed or dropped test file, say):
    each carries the generated header, so a file of the user's own is never taken for one."""
    marker = GENERATED_HEADER.strip("# \n")
    if not out.is_dir():
        return []
    return sorted(
        rel
        for path in out.rglob("*")
        if path.is_file()
        and path.suffix in (".yml", ".yaml", ".md", ".json")
        and (rel := path.relative_to(out).as_posix()) not in files
        and marker in path.read_text(encoding="utf-8", errors="replace")
    )

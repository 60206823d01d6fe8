"""rules/*.yaml: the versioned SLO spec (`version: v1`), read by pydantic with unknown keys
refused, checked with every problem located, and mapped to frozen internal types that the
evaluator and every generator use (nothing downstream reads the YAML models)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from collector.config import Duration, regex
from collector.slo.windows import WORKBOOK, BurnPair
from collector.sources.vllm_buckets import LATENCY_HISTOGRAMS
from collector.yamlfile import YamlProblem, describe_errors, line_of, parse_yaml_mapping

LatencyMetric = Literal["ttft", "tpot", "itl", "e2e", "queue"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ObjectiveIn(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_]*$")
    sli: Literal["latency", "error_ratio", "goodput", "throughput", "cost_ceiling"]
    objective: float = Field(gt=0, lt=1, description="share of good events (or time slices) required")
    metric: LatencyMetric | None = None
    threshold: Duration | None = None
    source: Literal["engine", "traces"] = "engine"
    min_tokens_per_second: float | None = Field(None, gt=0)
    slice: Duration = 300.0
    max_usd_per_million_tokens: float | None = Field(None, gt=0)
    description: str = ""


class BusinessTypeIn(_Strict):
    models: list[str] = Field(
        default_factory=list,
        description="regular expressions on vLLM's model_name (full match); the fallback for series "
        "whose target names no business type",
    )
    objectives: list[ObjectiveIn] = Field(min_length=1)

    @field_validator("models")
    @classmethod
    def _regexes(cls, v: list[str]) -> list[str]:
        return [regex(p) for p in v]


class ThresholdsIn(_Strict):
    """The seeds' plain threshold alerts (besides the burn-rate ones)."""

    ttft_p95_seconds: float | None = Field(2.0, gt=0)
    queue_waiting: float | None = Field(10.0, gt=0)
    queue_for: Duration = 300.0
    kv_cache_usage: float | None = Field(0.95, gt=0, le=1)
    kv_cache_for: Duration = 300.0
    error_ratio: float | None = Field(0.01, gt=0, lt=1)
    target_down_for: Duration = 60.0  # ticket per target; page when a business type has none up
    restart_window: Duration = 600.0  # a restart ticket stays open this long after the restart
    # prefix-cache collapse: the hit ratio over `prefix_cache_window` falls below
    # `prefix_cache_drop` x its own level over the `prefix_cache_reference` before it
    prefix_cache_drop: float | None = Field(0.5, gt=0, lt=1)
    prefix_cache_window: Duration = 300.0
    prefix_cache_reference: Duration = 3600.0
    prefix_cache_min_ratio: float = Field(0.1, ge=0, lt=1, description="reference level below which no alert")
    prefix_cache_min_queries: float = Field(1000.0, ge=0, description="queried tokens in the window, at least")


class AlertmanagerIn(_Strict):
    url: str | None = None
    resend_interval: Duration = 60.0
    timeout: Duration = 5.0


class RulesIn(_Strict):
    version: Literal["v1"]
    period: Duration = 28 * 86400.0
    calendar: Literal["rolling", "month"] = "rolling"
    min_events: int = Field(30, ge=1, description="events in a pair's long window before it may fire")
    window_scale: float = Field(1.0, gt=0, le=1, description="tests only: shrink every window alike")
    evaluation_interval: Duration = 30.0
    runbook_url: str = "https://github.com/llmslo/llmslo/blob/main/alerts/RUNBOOK.md#{anchor}"
    dashboard_url: str = (
        "http://127.0.0.1:3000/d/llmslo-overview/llmslo-overview?var-business_type={business_type}&from=now-6h&to=now"
    )
    business_types: dict[str, BusinessTypeIn] = Field(min_length=1)
    thresholds: ThresholdsIn = ThresholdsIn()
    alertmanager: AlertmanagerIn = AlertmanagerIn()
    vllm_job: str = Field("vllm", description="Prometheus job label of the vLLM scrape (target-down alert)")
    llmslo_job: str = Field(
        "llmslo", description="Prometheus job label of llmslo's own /metrics scrape (the collector's health alert)"
    )


# --- the internal model -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Objective:
    slo: str  # "<business_type>-<name>", the `slo` label everywhere
    business_type: str
    name: str
    sli: str
    objective: float
    metric: str | None = None
    threshold_seconds: float | None = None
    source: str = "engine"
    min_tokens_per_second: float | None = None
    slice_seconds: float = 300.0
    max_usd_per_million_tokens: float | None = None
    description: str = ""

    @property
    def error_budget(self) -> float:
        return 1.0 - self.objective

    @property
    def alert_name(self) -> str:
        camel = "".join(part.capitalize() for part in re.split(r"[-_]", self.slo))
        return f"LLMSLO{camel}BudgetBurn"


@dataclass(frozen=True, slots=True)
class BusinessType:
    name: str
    model_patterns: tuple[str, ...]
    objectives: tuple[Objective, ...]

    @property
    def model_regex(self) -> str:
        """One PromQL/RE2 alternative for all patterns (anchored by PromQL itself)."""
        return "|".join(self.model_patterns)

    def matches(self, model: str) -> bool:
        return any(re.fullmatch(p, model) for p in self.model_patterns)


@dataclass(frozen=True, slots=True)
class Thresholds:
    ttft_p95_seconds: float | None
    queue_waiting: float | None
    queue_for_seconds: float
    kv_cache_usage: float | None
    kv_cache_for_seconds: float
    error_ratio: float | None
    target_down_for_seconds: float
    restart_window_seconds: float = 600.0
    prefix_cache_drop: float | None = 0.5
    prefix_cache_window_seconds: float = 300.0
    prefix_cache_reference_seconds: float = 3600.0
    prefix_cache_min_ratio: float = 0.1
    prefix_cache_min_queries: float = 1000.0


@dataclass(frozen=True, slots=True)
class SloRules:
    period_seconds: float
    calendar: str
    min_events: int
    window_scale: float
    evaluation_interval_seconds: float
    runbook_url: str
    dashboard_url: str
    business_types: tuple[BusinessType, ...]
    thresholds: Thresholds
    pairs: tuple[BurnPair, ...]
    alertmanager_url: str | None
    resend_interval_seconds: float
    alertmanager_timeout_seconds: float
    vllm_job: str = "vllm"
    llmslo_job: str = "llmslo"

    @property
    def objectives(self) -> tuple[Objective, ...]:
        return tuple(o for bt in self.business_types for o in bt.objectives)

    def business_type_of(self, model: str) -> str | None:
        for bt in self.business_types:
            if bt.matches(model):
                return bt.name
        return None

    def runbook(self, anchor: str) -> str:
        return self.runbook_url.replace("{anchor}", anchor)

    def dashboard(self, business_type: str, instance: str | None = None) -> str:
        """The dashboard link of an alert on `business_type` (and, for an alert on one server,
        its Prometheus `instance`, which the dashboards' instance variable takes)."""
        url = self.dashboard_url.replace("{business_type}", business_type)
        return url + (f"&var-instance={instance}" if instance and "?" in url else "")


class RulesError(Exception):
    def __init__(self, problems: list[str], warnings: list[str] | None = None) -> None:
        self.problems = problems
        self.warnings = warnings or []
        super().__init__("\n".join(problems))


@dataclass(frozen=True, slots=True)
class Loaded:
    rules: SloRules
    warnings: tuple[str, ...]


def load_rules(path: str | Path) -> Loaded:
    """Load one rules file, or every *.yaml/*.yml in a directory (merged; business types must
    not repeat). Raises RulesError with every problem located."""
    root = Path(path)
    files = sorted([*root.glob("*.yaml"), *root.glob("*.yml")]) if root.is_dir() else [root]
    if not files:
        raise RulesError([f"{root}: no rules files (*.yaml) found"])
    problems: list[str] = []
    warnings: list[str] = []
    merged: list[tuple[str, RulesIn, yaml.Node | None]] = []
    for file in files:
        node: yaml.Node | None = None
        try:
            text = file.read_text(encoding="utf-8")
            data, node = parse_yaml_mapping(text, str(file))
            merged.append((str(file), RulesIn.model_validate(data), node))
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(f"{file}: cannot read: {exc}")
        except YamlProblem as exc:
            problems.append(str(exc))
        except ValidationError as exc:
            problems.extend(describe_errors(exc, str(file), node))
    if problems:
        raise RulesError(problems)
    for source, spec, tree in merged:
        p, w = _check(spec, source, tree)
        problems.extend(p)
        warnings.extend(w)
    seen: dict[str, str] = {}
    for source, spec, _ in merged:
        for name in spec.business_types:
            if name in seen:
                problems.append(f"{source}: business_types.{name}: also defined in {seen[name]}")
            seen.setdefault(name, source)
    if problems:
        raise RulesError(problems, warnings)
    first = merged[0][1]
    business = [bt for _, spec, _ in merged for bt in _business_types(spec)]
    return Loaded(_resolve(first, tuple(business)), tuple(warnings))


def _business_types(spec: RulesIn) -> list[BusinessType]:
    out = []
    for name, bt in spec.business_types.items():
        objectives = tuple(
            Objective(
                slo=f"{name}-{o.name}".replace("_", "-"),
                business_type=name,
                name=o.name,
                sli=o.sli,
                objective=o.objective,
                metric=o.metric,
                threshold_seconds=o.threshold,
                source=o.source,
                min_tokens_per_second=o.min_tokens_per_second,
                slice_seconds=o.slice,
                max_usd_per_million_tokens=o.max_usd_per_million_tokens,
                description=o.description,
            )
            for o in bt.objectives
        )
        out.append(BusinessType(name, tuple(bt.models), objectives))
    return out


def _resolve(spec: RulesIn, business: tuple[BusinessType, ...]) -> SloRules:
    t = spec.thresholds
    return SloRules(
        period_seconds=spec.period,
        calendar=spec.calendar,
        min_events=spec.min_events,
        window_scale=spec.window_scale,
        evaluation_interval_seconds=spec.evaluation_interval,
        runbook_url=spec.runbook_url,
        dashboard_url=spec.dashboard_url,
        business_types=business,
        thresholds=Thresholds(
            t.ttft_p95_seconds,
            t.queue_waiting,
            t.queue_for,
            t.kv_cache_usage,
            t.kv_cache_for,
            t.error_ratio,
            t.target_down_for,
            t.restart_window,
            t.prefix_cache_drop,
            t.prefix_cache_window,
            t.prefix_cache_reference,
            t.prefix_cache_min_ratio,
            t.prefix_cache_min_queries,
        ),
        pairs=tuple(p.scaled(spec.window_scale) for p in WORKBOOK),
        alertmanager_url=spec.alertmanager.url,
        resend_interval_seconds=spec.alertmanager.resend_interval,
        alertmanager_timeout_seconds=spec.alertmanager.timeout,
        vllm_job=spec.vllm_job,
        llmslo_job=spec.llmslo_job,
    )


def _check(spec: RulesIn, source: str, node: yaml.Node | None) -> tuple[list[str], list[str]]:
    problems: list[str] = []
    warnings: list[str] = []

    def at(*loc: str | int) -> str:
        return f"{source}:{line_of(node, loc) or '?'}"

    names = list(spec.business_types)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            for pa in spec.business_types[a].models:
                for pb in spec.business_types[b].models:
                    if pa == pb or re.fullmatch(pa, pb) or re.fullmatch(pb, pa):
                        problems.append(
                            f"{at('business_types', b, 'models')}: business_types.{b}.models: {pb!r} "
                            f"overlaps {pa!r} of business type {a!r}; "
                            "a model must belong to one business type"
                        )
    for bt_name, bt in spec.business_types.items():
        seen: set[str] = set()
        for j, o in enumerate(bt.objectives):
            key = f"business_types.{bt_name}.objectives[{j}]"
            where = at("business_types", bt_name, "objectives", j)
            if o.name in seen:
                problems.append(f"{where}: {key}.name: duplicate objective {o.name!r}")
            seen.add(o.name)
            if o.sli == "latency":
                if o.metric is None or o.threshold is None:
                    problems.append(f"{where}: {key}: a latency SLI needs `metric` and `threshold`")
                    continue
                family, bounds = LATENCY_HISTOGRAMS[o.metric]
                if o.source == "engine" and not any(abs(o.threshold - b) < 1e-9 for b in bounds):
                    lower = max((b for b in bounds if b < o.threshold), default=0.0)
                    upper = min((b for b in bounds if b > o.threshold), default=float("inf"))
                    warnings.append(
                        f"{where}: {key}: threshold {o.threshold:g}s is not a bucket bound of {family} "
                        f"(nearest bounds {lower:g}s and {upper:g}s). From vLLM's histogram the share under "
                        f"it is interpolated inside ({lower:g}, {upper:g}], not measured. Only traces "
                        f"measure it exactly: set `source: traces` (gateway spans), or use llmslo's own "
                        f"good/total counters, or start vLLM with --custom-histogram-buckets including "
                        f"{o.threshold:g}."
                    )
            elif o.sli == "throughput" and o.min_tokens_per_second is None:
                problems.append(f"{where}: {key}: a throughput SLI needs `min_tokens_per_second`")
            elif o.sli == "cost_ceiling" and o.max_usd_per_million_tokens is None:
                problems.append(f"{where}: {key}: a cost_ceiling SLI needs `max_usd_per_million_tokens`")
            if o.sli in ("goodput",) or (o.sli == "latency" and o.source == "traces"):
                warnings.append(
                    f"{where}: {key}: needs trace ingestion (gateway spans); it reports no data, "
                    f"never good, until spans arrive"
                )
            if o.sli == "cost_ceiling":
                warnings.append(
                    f"{where}: {key}: needs the cost model (`deployments:` with GPU prices in llmslo.yaml); it "
                    "reports no data where none is configured"
                )
    return problems, warnings

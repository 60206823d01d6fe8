# ruff: noqa: E501 - panel descriptions and PromQL read best unwrapped
"""Grafana dashboards from the same model as the alerts, built with Grafana's own Python SDK
(grafana-foundation-sdk): a set linked to each other, every query over the selected time range.

- overview (`llmslo-overview`, the page alerts open): every business type's SLO state, burn rate,
  budget, firing alerts, engines down, traffic and TTFT against the SLO;
- SLO detail (`llmslo-slo`): SLI against the objective, burn rate per window, budget over time;
- latency budget (`llmslo-latency`): TTFT, TPOT, ITL, e2e p50/p90/p95/p99 from vLLM's buckets
  over the range, queue vs prefill vs decode, bucket heatmaps, gateway-span percentiles beside;
- cache and cost (`llmslo-cost`), workload drift (`llmslo-drift`), capacity (`llmslo-capacity`),
  fleet (`llmslo-fleet`).

Engine queries read vLLM's own series (every name generation llmslo reads, by `__name__` regex)
with `$__rate_interval`, filtered by the `business_type` target label (README: "One
business-type mapping"), model and instance. llmslo's series are used where only llmslo has the
data (SLOs, traces, cost, drift, scrape health).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import heatmap, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DashboardLinkType, DataSourceRef, VariableRefresh

from collector import conventions as conv
from collector.config import format_duration
from collector.generate.promql import GENERATED_HEADER, skipped_slots_share
from collector.slo.spec import SloRules
from collector.sources.vllm import LOGICAL_BY_NAME

DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
ENGINE = 'business_type=~"$business_type",model_name=~"$model",instance=~"$instance"'
BT = 'business_type=~"$business_type"'
RATE = "$__rate_interval"
QUANTILES = ((0.5, "p50"), (0.9, "p90"), (0.95, "p95"), (0.99, "p99"))
OVERVIEW = "llmslo-overview"
ERRORS = 'finished_reason=~"abort|error"'


def names(logical: str, suffix: str = "") -> str:
    """A `__name__` regex matching every exposed name of a logical vLLM metric (all releases)."""
    aliases = LOGICAL_BY_NAME[logical].aliases
    body = "|".join(a.replace(":", ":") + suffix for a in aliases)
    return f'__name__=~"{body}"'


def sel(logical: str, suffix: str = "", extra: str = "") -> str:
    return "{" + ",".join(x for x in (names(logical, suffix), ENGINE, extra) if x) + "}"


def quantile(q: float, logical: str, by: str = "business_type") -> str:
    return f"histogram_quantile({q}, sum by (le, {by}) (rate({sel(logical, '_bucket')}[{RATE}])))"


def mean(logical: str, by: str = "business_type") -> str:
    return (
        f"sum by ({by}) (rate({sel(logical, '_sum')}[{RATE}])) / sum by ({by}) (rate({sel(logical, '_count')}[{RATE}]))"
    )


def rate(logical: str, by: str = "business_type", extra: str = "", suffix: str = "") -> str:
    return f"sum by ({by}) (rate({sel(logical, suffix, extra)}[{RATE}]))"


@dataclass
class Board:
    """One dashboard being laid out: rows of panels, 24 columns wide."""

    uid: str
    title: str
    description: str
    builder: gd.Dashboard = field(init=False)
    next_id: int = 1
    x: int = 0
    y: int = 0
    row_height: int = 0

    def __post_init__(self) -> None:
        self.builder = (
            gd.Dashboard(self.title)
            .uid(self.uid)
            .description(self.description)
            .tags(["llmslo", "vllm"])
            .editable()
            .refresh("30s")
            .time("now-3h", "now")
            .timezone("browser")
            .link(
                gd.DashboardLink("llmslo")
                .type(DashboardLinkType.DASHBOARDS)
                .tags(["llmslo"])
                .as_dropdown(True)
                .include_vars(True)
                .keep_time(True)
            )
        )

    def row(self, title: str) -> None:
        self._newline()
        self.builder.with_row(gd.Row(title).id(self._id()).grid_pos(_pos(0, self.y, 24, 1)))
        self.y += 1

    def add(self, panel: Any, w: int = 12, h: int = 8) -> None:
        if self.x + w > 24:
            self._newline()
        panel.id(self._id()).grid_pos(_pos(self.x, self.y, w, h)).datasource(DS)
        self.builder.with_panel(panel)
        self.x += w
        self.row_height = max(self.row_height, h)

    def _newline(self) -> None:
        if self.x:
            self.y += self.row_height
        self.x, self.row_height = 0, 0

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1


def _pos(x: int, y: int, w: int, h: int) -> Any:
    from grafana_foundation_sdk.models.dashboard import GridPos

    return GridPos(h=h, w=w, x=x, y=y)


def q(expr: str, legend: str, ref: int, instant: bool = False, fmt: str | None = None) -> prometheus.Dataquery:
    query = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(65 + ref)).datasource(DS)
    if instant:
        query.instant()
    if fmt is not None:
        from grafana_foundation_sdk.models.prometheus import PromQueryFormat

        query.format(PromQueryFormat(fmt))
    return query


def series(title: str, description: str, unit: str, queries: list[tuple[str, str]], **opts: Any) -> Any:
    panel = timeseries.Panel().title(title).description(description).unit(unit)
    for i, (expr, legend) in enumerate(queries):
        panel.with_target(q(expr, legend, i))
    if opts.get("stack"):
        from grafana_foundation_sdk.builders.common import StackingConfig
        from grafana_foundation_sdk.models.common import StackingMode

        panel.stacking(StackingConfig().mode(StackingMode.NORMAL)).fill_opacity(40)
    if "min" in opts:
        panel.min(opts["min"])
    if "max" in opts:
        panel.max(opts["max"])
    if opts.get("log"):
        from grafana_foundation_sdk.builders.common import ScaleDistributionConfig
        from grafana_foundation_sdk.models.common import ScaleDistribution

        panel.scale_distribution(ScaleDistributionConfig().type(ScaleDistribution.LOG).log(10))
    if "dashed" in opts:  # series drawn as dashed threshold lines (the SLO's)
        from grafana_foundation_sdk.models.dashboard import DynamicConfigValue, MatcherConfig

        panel.with_override(
            MatcherConfig(id_val="byRegexp", options=opts["dashed"]),
            [
                DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}),
                DynamicConfigValue(id_val="color", value={"mode": "fixed", "fixedColor": "red"}),
            ],
        )
    return panel


def single(title: str, description: str, unit: str, expr: str, legend: str, **opts: Any) -> Any:
    panel = stat.Panel().title(title).description(description).unit(unit).with_target(q(expr, legend, 0))
    if "decimals" in opts:
        panel.decimals(opts["decimals"])
    if "link" in opts:  # a data link: the clicked series' business type and the time range go along
        title, url = opts["link"]
        panel.data_links([gd.DashboardLink(title).type(DashboardLinkType.LINK).url(url)])
    return panel


def listing(title: str, description: str, queries: list[tuple[str, str]]) -> Any:
    panel = table.Panel().title(title).description(description)
    for i, (expr, legend) in enumerate(queries):
        panel.with_target(q(expr, legend, i, instant=True, fmt="table"))
    return panel


def buckets(title: str, description: str, logical: str) -> Any:
    expr = f"sum by (le) (increase({sel(logical, '_bucket')}[{RATE}]))"
    return (
        heatmap.Panel().title(title).description(description).with_target(q(expr, "{{le}}", 0, fmt="heatmap")).unit("s")
    )


def slo_link(uid: str) -> tuple[str, str]:
    return ("SLO detail", f"/d/{uid}?var-business_type=${{__field.labels.business_type}}&${{__url_time_range}}")


def variables(board: Board, rules: SloRules, extra: list[str] = ()) -> None:  # type: ignore[assignment]
    b = board.builder
    b.with_variable(gd.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
    types = [bt.name for bt in rules.business_types]
    b.with_variable(
        gd.CustomVariable("business_type")
        .label("Business type")
        .values(",".join(types))
        .multi(True)
        .include_all(True)
        .all_value(".*")
    )
    running = names("requests_running")
    for name, label, query in (
        ("model", "Model", f"label_values({{{running},{BT}}}, model_name)"),
        ("instance", "Engine", f"label_values({{{running},{BT}}}, instance)"),
        ("tenant", "Tenant", f"label_values({conv.REQUESTS_SEEN}{{{BT}}}, tenant)"),
    ):
        if name == "tenant" and "tenant" not in extra:
            continue
        b.with_variable(
            gd.QueryVariable(name)
            .label(label)
            .datasource(DS)
            .query(query)
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
    if "window" in extra:  # the burn-rate windows of the rules, the first pair's long one first
        windows = sorted({s for p in rules.pairs for s in (p.long_seconds, p.short_seconds)})
        first = format_duration(rules.pairs[0].long_seconds) if rules.pairs else "1h"
        b.with_variable(
            gd.CustomVariable("window")
            .label("SLO window")
            .values(",".join([first, *(format_duration(w) for w in windows if format_duration(w) != first)]))
        )
    b.annotation(
        gd.AnnotationQuery()
        .name("Alerts")
        .datasource(DS)
        .enable(True)
        .icon_color("red")
        .expr(f'ALERTS{{alertstate="firing",alertname=~"LLMSLO.*",{BT}}}')
    )
    b.annotation(
        gd.AnnotationQuery()
        .name("Engine restarts")
        .datasource(DS)
        .enable(True)
        .icon_color("orange")
        .expr(f"increase({conv.TARGET_RESTARTS_TOTAL}[2m]) > 0")
    )


def overview(rules: SloRules) -> Board:
    board = Board(
        OVERVIEW, "llmslo / on-call overview", "Every business type's SLOs, alerts and engines: the page alerts open."
    )
    variables(board, rules)
    board.row("SLOs")
    board.add(
        single(
            "Error budget left (SLO period)",
            "llmslo's evaluator: 1 - bad/total over the period, divided by the budget. Below 0: the objective is missed.",
            "percentunit",
            f"min by (slo) ({conv.SLO_BUDGET_REMAINING}{{{BT}}})",
            "{{slo}}",
            decimals=1,
            link=slo_link("llmslo-slo"),
        ),
        w=12,
        h=6,
    )
    board.add(
        single(
            "Burn rate over $window",
            "Error rate over the budget's rate (1 = spending the budget exactly by the period's end), over the window chosen above. Pages at 14.4 over 1h and 5m.",
            "none",
            f'max by (slo) ({conv.SLO_BURN_RATE}{{{BT},window="$window"}})',
            "{{slo}}",
            decimals=2,
            link=slo_link("llmslo-slo"),
        ),
        w=12,
        h=6,
    )
    board.add(
        listing(
            "Firing alerts",
            "Prometheus' ALERTS series for the generated rules (alerts/*.rules.yml).",
            [(f'ALERTS{{alertstate="firing",alertname=~"LLMSLO.*",{BT}}}', "{{alertname}}")],
        ),
        w=16,
        h=7,
    )
    board.add(
        single(
            "Engines down",
            "vLLM servers Prometheus cannot scrape (job vllm).",
            "none",
            f'count(up{{job="vllm",{BT}}} == 0) or vector(0)',
            "down",
        ),
        w=8,
        h=7,
    )
    board.row("Traffic and latency")
    board.add(
        series(
            "Requests per second",
            "Finished requests per second by finish reason group, from vLLM's request_success counter.",
            "reqps",
            [(rate("request_success", "business_type"), "{{business_type}}")],
        )
    )
    board.add(
        series(
            "TTFT p95 against the SLO threshold",
            "histogram_quantile over vLLM's TTFT buckets for the selected range (interpolated inside a bucket); dashed: each business type's TTFT SLO threshold.",
            "s",
            [
                (quantile(0.95, "ttft"), "{{business_type}} p95"),
                (
                    f'max by (business_type) ({conv.SLO_THRESHOLD_SECONDS}{{{BT},metric="ttft"}})',
                    "{{business_type}} SLO",
                ),
            ],
            dashed=".* SLO$",
            log=True,
        )
    )
    board.add(
        series(
            "Error ratio",
            "Requests that finished with abort or error over all finished requests (vLLM's counters).",
            "percentunit",
            [
                (
                    rate("request_success", extra=ERRORS) + " / " + rate("request_success"),
                    "{{business_type}}",
                )
            ],
            min=0,
        )
    )
    board.add(
        series(
            "Queue: requests waiting and running",
            "vLLM's scheduler gauges summed per business type: waiting grows before the KV cache fills.",
            "short",
            [
                (f"sum by (business_type) ({sel('requests_waiting')})", "{{business_type}} waiting"),
                (f"sum by (business_type) ({sel('requests_running')})", "{{business_type}} running"),
            ],
        )
    )
    return board


def slo_detail(rules: SloRules) -> Board:
    board = Board("llmslo-slo", "llmslo / SLO detail", "One business type's SLOs: SLI, burn rates, budget.")
    variables(board, rules, ["window"])
    board.row("SLI and budget")
    board.add(
        series(
            "SLI against the objective",
            "Share of good events over the window chosen above (llmslo's evaluator); dashed: the objective.",
            "percentunit",
            [
                (f'{conv.SLO_SLI}{{{BT},window="$window"}}', "{{slo}} $window"),
                (f"{conv.SLO_OBJECTIVE}{{{BT}}}", "{{slo}} objective"),
            ],
            dashed=".* objective$",
        ),
        w=24,
    )
    board.add(
        series(
            "Burn rate per window",
            "Error rate over the budget's rate for every window of the burn-rate pairs (1h/5m and 6h/30m page; 1d/2h and 3d/6h open tickets).",
            "none",
            [(f"{conv.SLO_BURN_RATE}{{{BT}}}", "{{slo}} {{window}}")],
            log=True,
        )
    )
    board.add(
        series(
            "Error budget left over time",
            "The budget left in the SLO period as it was at each moment (burn-down).",
            "percentunit",
            [(f"{conv.SLO_BUDGET_REMAINING}{{{BT}}}", "{{slo}}")],
        )
    )
    board.row("Events")
    board.add(
        series(
            "Good and total events per second",
            "llmslo's SLO event counters (since each server started; a restart resets them).",
            "short",
            [
                (f"sum by (slo) (rate({conv.SLO_EVENTS}{{{BT}}}[{RATE}]))", "{{slo}} total"),
                (f"sum by (slo) (rate({conv.SLO_GOOD_EVENTS}{{{BT}}}[{RATE}]))", "{{slo}} good"),
            ],
        ),
        w=24,
    )
    return board


def latency(rules: SloRules) -> Board:
    board = Board(
        "llmslo-latency",
        "llmslo / latency budget",
        "Where the time goes, from vLLM's histograms over the selected range.",
    )
    variables(board, rules, ["tenant"])
    for logical, title in (
        ("ttft", "Time to first token"),
        ("tpot", "Time per output token"),
        ("itl", "Inter-token latency"),
        ("e2e", "End-to-end latency"),
    ):
        board.row(title)
        queries = [(quantile(qv, logical), f"{{{{business_type}}}} {label}") for qv, label in QUANTILES]
        dashed = {}
        if logical in ("ttft", "tpot", "e2e"):
            queries.append(
                (
                    f'max by (business_type) ({conv.SLO_THRESHOLD_SECONDS}{{{BT},metric="{logical}"}})',
                    "{{business_type}} SLO",
                )
            )
            dashed = {"dashed": ".* SLO$"}
        board.add(
            series(
                f"{title}: p50, p90, p95, p99",
                f"histogram_quantile over vLLM's {LOGICAL_BY_NAME[logical].aliases[0]} buckets (every name it had), per business type, over the selected range; values are interpolated inside a bucket.",
                "s",
                queries,
                log=True,
                **dashed,
            ),
            w=14,
        )
        board.add(
            buckets(f"{title}: buckets", "Requests per bucket over time (increase of vLLM's buckets).", logical), w=10
        )
    board.row("Stages and traces")
    board.add(
        series(
            "Queue, prefill and decode (mean per request)",
            "Mean seconds per request in each stage (vLLM's _sum/_count): a queueing incident grows the first, long prompts the second.",
            "s",
            [(mean(stage), f"{{{{business_type}}}} {stage}") for stage in ("queue", "prefill", "decode")],
            stack=True,
        )
    )
    board.add(
        series(
            "TTFT p95 per tenant (gateway spans)",
            "Exact percentiles from the gateway's spans (as measured where the span was made), beside the engine's view above.",
            "s",
            [
                (
                    f'{conv.REQUESTS_TTFT}{{{BT},tenant=~"$tenant",window="5m",quantile="0.95"}}',
                    "{{business_type}} {{tenant}}",
                )
            ],
        )
    )
    return board


def cost(rules: SloRules) -> Board:
    board = Board("llmslo-cost", "llmslo / cache and cost", "Prefix cache, cost per token and per tenant.")
    variables(board, rules, ["tenant"])
    board.row("Cache")
    board.add(
        series(
            "Prefix-cache hit ratio",
            "Tokens served from vLLM's prefix cache over tokens queried (both name generations of the counters).",
            "percentunit",
            [
                (
                    f"{rate('prefix_cache_hits')} / {rate('prefix_cache_queries')}",
                    "{{business_type}}",
                )
            ],
            min=0,
            max=1,
        )
    )
    board.add(
        series(
            "Tokens per second",
            "Prompt and generated tokens per second (vLLM's counters).",
            "short",
            [
                (rate("prompt_tokens"), "{{business_type}} prompt"),
                (rate("generation_tokens"), "{{business_type}} generated"),
            ],
        )
    )
    board.row("Cost (needs `deployments:` with prices)")
    board.add(
        series(
            "Cost per hour, busy and idle",
            "llmslo's dollar counters per deployment: allocated (price x GPU-hours) and the busy part (requests running).",
            "currencyUSD",
            [
                (
                    f"sum by (deployment) (rate({conv.COST_ALLOCATED_USD}_total[{RATE}])) * 3600",
                    "{{deployment}} allocated",
                ),
                (f"sum by (deployment) (rate({conv.COST_BUSY_USD}_total[{RATE}])) * 3600", "{{deployment}} busy"),
            ],
        )
    )
    board.add(
        series(
            "Cost per 1M tokens by business type",
            "Attributed dollars (busy work plus its share of idle) over prompt + generated tokens.",
            "currencyUSD",
            [
                (
                    f"sum by (business_type) (rate({conv.COST_ATTRIBUTED_USD}_total{{{BT}}}[{RATE}])) * 1e6 / "
                    f"(sum by (business_type) (rate({sel('prompt_tokens', '')}[{RATE}])) + sum by (business_type) (rate({sel('generation_tokens', '')}[{RATE}])))",
                    "{{business_type}}",
                )
            ],
        )
    )
    board.row("Tenants (gateway spans)")
    board.add(
        series(
            "Requests per tenant",
            'Gateway spans per second over the last 5 minutes; tenants past traces.top_tenants are counted as "other".',
            "reqps",
            [(f'{conv.REQUESTS_SEEN}{{{BT},tenant=~"$tenant",window="5m"}} / 300', "{{business_type}} {{tenant}}")],
        ),
        w=24,
    )
    return board


def drift(rules: SloRules) -> Board:
    board = Board(
        "llmslo-drift",
        "llmslo / workload drift",
        "Length distributions now against the reference, and the drift statistics.",
    )
    variables(board, rules)
    board.row("Lengths")
    for logical, title in (("prompt_length", "Prompt length"), ("generation_length", "Generation length")):
        board.add(
            series(
                f"{title}: p50 and p95 (tokens)",
                f"histogram_quantile over vLLM's {LOGICAL_BY_NAME[logical].aliases[0]} buckets; a shift here is what the drift statistics measure.",
                "short",
                [
                    (quantile(0.5, logical), "{{business_type}} p50"),
                    (quantile(0.95, logical), "{{business_type}} p95"),
                ],
                log=True,
            )
        )
    board.row("Statistics")
    board.add(
        series(
            "PSI against the reference, with its threshold",
            "llmslo's drift pass: PSI of each signal's current window against its reference; dashed: the threshold in force (calibrated on the reference, else 0.25).",
            "none",
            [
                (f'{conv.DRIFT_STATISTIC}{{{BT},statistic="psi",tenant=""}}', "{{business_type}} {{signal}}"),
                (f'{conv.DRIFT_THRESHOLD}{{{BT},tenant=""}}', "{{business_type}} {{signal}} threshold"),
            ],
            dashed=".* threshold$",
        ),
        w=16,
    )
    board.add(
        listing(
            "Signals drifted now",
            "1 while a signal is beyond its threshold (LLMSLOWorkloadDrift).",
            [(f"{conv.DRIFT_DETECTED}{{{BT}}} == 1", "{{business_type}} {{signal}}")],
        ),
        w=8,
    )
    return board


def capacity(rules: SloRules) -> Board:
    board = Board("llmslo-capacity", "llmslo / capacity", "KV cache, queue, preemptions, throughput per replica, GPUs.")
    variables(board, rules)
    board.row("Engines")
    board.add(
        series(
            "KV-cache usage (highest engine)",
            "vLLM's KV-cache usage per engine (both name generations); at 1 requests queue or are preempted.",
            "percentunit",
            [(f"max by (business_type, instance) ({sel('kv_cache_usage')})", "{{business_type}} {{instance}}")],
            min=0,
            max=1,
        )
    )
    board.add(
        series(
            "Requests running and waiting per engine",
            "vLLM's scheduler gauges per engine.",
            "short",
            [
                (f"sum by (instance) ({sel('requests_running')})", "{{instance}} running"),
                (f"sum by (instance) ({sel('requests_waiting')})", "{{instance}} waiting"),
            ],
        )
    )
    board.add(
        series(
            "Preemptions per second",
            "Requests vLLM evicted from the KV cache to make room (recomputed later).",
            "short",
            [(rate("preemptions", "instance"), "{{instance}}")],
        )
    )
    board.add(
        series(
            "Generated tokens per second per engine",
            "Throughput per replica: compare with llmslo capacity's throughput at SLO (`llmslo capacity`).",
            "short",
            [(rate("generation_tokens", "instance"), "{{instance}}")],
        )
    )
    board.row("GPUs (DCGM exporter, when scraped)")
    board.add(
        series(
            "GPU memory used",
            "DCGM_FI_DEV_FB_USED over used + free, per GPU.",
            "percentunit",
            [("DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)", "{{Hostname}} GPU {{gpu}}")],
        )
    )
    board.add(
        series(
            "GPU engine active",
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE: the share of time the GPU computed.",
            "percentunit",
            [("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "{{Hostname}} GPU {{gpu}}")],
        )
    )
    return board


def fleet(rules: SloRules) -> Board:
    board = Board("llmslo-fleet", "llmslo / fleet", "Every engine: up, scrape health, restarts.")
    variables(board, rules)
    board.row("Engines")
    board.add(
        listing(
            "Engines",
            "Prometheus' up for job vllm, with llmslo's view of each target beside.",
            [
                (f'up{{job="vllm",{BT}}}', "{{instance}}"),
                (f"{conv.TARGET_UP}", "{{target}}"),
            ],
        ),
        w=24,
    )
    board.add(
        series(
            "Scrape duration",
            "How long Prometheus' and llmslo's scrapes of each engine take.",
            "s",
            [
                (f'scrape_duration_seconds{{job="vllm",{BT}}}', "prometheus {{instance}}"),
                (f"{conv.SCRAPE_DURATION_SECONDS}", "llmslo {{target}}"),
            ],
        )
    )
    board.add(
        series(
            "llmslo scrape errors by reason",
            "Failed scrapes per second (connect, timeout, http, parse, limits ...).",
            "short",
            [
                (
                    f"sum by (target, reason) (rate({conv.SCRAPE_ERRORS_TOTAL}[{RATE}])) > 0",
                    "{{target}} {{reason}}",
                )
            ],
        )
    )
    board.add(
        series(
            "Restarts",
            "Engine processes restarted (llmslo counts one per restart).",
            "short",
            [(f"increase({conv.TARGET_RESTARTS_TOTAL}[{RATE}])", "{{target}}")],
        ),
        w=24,
    )
    board.add(
        series(
            "llmslo scrape slots skipped",
            "Share of each llmslo collector's scrape slots skipped: a target slower than its interval, or "
            "a collector past what one core scrapes (LLMSLOCollectorSkippingScrapes tickets above 1 %).",
            "percentunit",
            [(skipped_slots_share("rate", RATE), "{{instance}}")],
        ),
        w=24,
    )
    return board


BOARDS = (overview, slo_detail, latency, cost, drift, capacity, fleet)


def dashboards(rules: SloRules) -> list[dict[str, Any]]:
    out = []
    for make in BOARDS:
        board = make(rules)
        built = tidy(json.loads(JSONEncoder(sort_keys=True, indent=2).encode(board.builder.build())))
        built["description"] = GENERATED_HEADER.strip("# \n") + " " + board.description
        out.append(built)
    return out


INTERVAL_ONLY = ("auto", "auto_count", "auto_min")


def tidy(board: dict[str, Any]) -> dict[str, Any]:
    """The SDK writes an interval variable's `auto*` fields on every variable; Grafana's schema
    (@grafana/schema) knows them on none: drop them where they mean nothing."""
    for variable in board.get("templating", {}).get("list", []):
        if variable.get("type") != "interval":
            for key in INTERVAL_ONLY:
                variable.pop(key, None)
    return board


def dashboard_files(rules: SloRules) -> dict[str, str]:
    """Relative path under dashboards/ -> JSON text."""
    return {f"{d['uid']}.json": json.dumps(d, indent=2, sort_keys=True) + "\n" for d in dashboards(rules)}

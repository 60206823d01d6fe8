"""Cost per request that reconciles to the GPU bill
(shared/reference/genai-traces-gateways-cost-drift.md section 6.5; OpenCost's allocation model,
llm-d's usage/allocation split).

For a deployment d and a window W:

    allocated  C_d  = GPU $/h x GPUs per replica x replica-hours(W) + fixed $/h x hours(W)
    busy       C_b  = C_d x busy share   (share of scrapes with requests running, per replica)
    work       w_g  = a x uncached prompt tokens + b x cached prompt tokens + c x output tokens
               a    = sum prefill seconds / sum uncached prompt tokens     (vLLM's histograms)
               c    = sum decode seconds / sum output tokens
               b    = cost.cached_token_weight x a                         (0: hits skip prefill)
    group      cost = C_b x w_g / sum w   (+ the idle C_d - C_b pro rata, when shared)

so the groups' costs (plus the unshared idle) add up to C_d exactly, and C_d over deployments is
the bill. Everything the formula reads is a sum (`CostInputs`), so a window's inputs are a merge
of its minutes' and the result of a window never depends on how it was cut.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from collector.config import CostConfig
from collector.cost.inventory import Deployment, Inventory
from collector.rollup import Cell, Row, SeriesIdent
from collector.sources.dcgm import ENGINE_ACTIVE
from collector.sources.vllm import BUSY, Kind
from collector.traces.rollup import RequestCell, RequestKey

MILLION = 1_000_000.0
# the stored series the cost model reads
COST_METRICS = (
    "prompt_tokens",
    "generation_tokens",
    "prefix_cache_hits",
    "request_success",
    "prefill",
    "decode",
    BUSY,
    ENGINE_ACTIVE,  # DCGM: the busy share when the engines' own state is not sampled
)
GROUP_BY = ("deployment", "business_type", "model", "target", "tenant")


@dataclass(slots=True)
class Work:
    """Additive engine counts of one (target, model) over some time."""

    requests: float = 0.0
    prompt_tokens: float = 0.0
    cached_tokens: float = 0.0  # prefix-cache hits (tokens)
    output_tokens: float = 0.0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    prefill_requests: float = 0.0  # requests the prefill histogram counted
    busy_sum: float = 0.0  # busy gauge: sum of 0/1 samples, their count, the time they cover
    busy_n: float = 0.0
    observed_seconds: float = 0.0
    gpu_active_sum: float = 0.0  # DCGM_FI_PROF_GR_ENGINE_ACTIVE samples (0-1) and their count
    gpu_active_n: float = 0.0

    def merge(self, o: Work) -> None:
        self.requests += o.requests
        self.prompt_tokens += o.prompt_tokens
        self.cached_tokens += o.cached_tokens
        self.output_tokens += o.output_tokens
        self.prefill_seconds += o.prefill_seconds
        self.decode_seconds += o.decode_seconds
        self.prefill_requests += o.prefill_requests
        self.busy_sum += o.busy_sum
        self.busy_n += o.busy_n
        self.observed_seconds += o.observed_seconds
        self.gpu_active_sum += o.gpu_active_sum
        self.gpu_active_n += o.gpu_active_n

    @property
    def is_gpu_only(self) -> bool:
        """A DCGM GPU's entry: activity, no requests or tokens of its own."""
        return self.gpu_active_n > 0 and not (self.requests or self.prompt_tokens or self.output_tokens or self.busy_n)

    @property
    def uncached_tokens(self) -> float:
        return max(0.0, self.prompt_tokens - min(self.cached_tokens, self.prompt_tokens))


@dataclass(slots=True)
class CostInputs:
    """Everything the cost model reads, per (target, model): a merge of cells."""

    work: dict[tuple[str, str], Work] = field(default_factory=dict)

    def add(self, target: str, ident: SeriesIdent, cell: Cell) -> None:
        metric = ident.key.metric
        if metric not in COST_METRICS:
            return
        key = (target, ident.key.model)
        w = self.work.get(key)
        if w is None:
            w = self.work[key] = Work()
        kind = ident.kind
        if kind is Kind.COUNTER:
            if metric == "prompt_tokens":
                w.prompt_tokens += cell.value
            elif metric == "generation_tokens":
                w.output_tokens += cell.value
            elif metric == "prefix_cache_hits":
                w.cached_tokens += cell.value
            elif metric == "request_success":
                w.requests += cell.value
        elif kind is Kind.HISTOGRAM:
            if metric == "prefill":
                w.prefill_seconds += cell.sum
                w.prefill_requests += cell.value
            elif metric == "decode":
                w.decode_seconds += cell.sum
        elif metric == BUSY:
            w.busy_sum += cell.sum
            w.busy_n += cell.n
            w.observed_seconds += cell.observed_seconds
        elif metric == ENGINE_ACTIVE:
            w.gpu_active_sum += cell.sum
            w.gpu_active_n += cell.n

    def plus(self, other: CostInputs) -> CostInputs:
        """Add another span's inputs (a day's into its week's) without reading their rows again."""
        for key, w in other.work.items():
            have = self.work.get(key)
            if have is None:
                have = self.work[key] = Work()
            have.merge(w)
        return self

    def add_rows(self, rows: Iterable[Row]) -> CostInputs:
        for r in rows:
            self.add(r.cell.target, r.cell.ident, r.cell.cell)
        return self


@dataclass(slots=True)
class Line:
    """Cost and work of one group (any grouping): sums, and the ratios users read."""

    requests: float = 0.0
    prompt_tokens: float = 0.0
    cached_tokens: float = 0.0
    output_tokens: float = 0.0
    busy_usd: float = 0.0  # usage basis
    idle_usd: float = 0.0  # the idle share charged to this group (share_idle)
    input_usd: float = 0.0  # of busy + idle: the prompt's part
    output_usd: float = 0.0
    cache_savings_usd: float = 0.0  # prefill not recomputed for prefix-cache hits, at its price
    api_usd: float | None = None  # what a managed API would have billed for the same tokens

    def add(self, o: Line) -> None:
        self.requests += o.requests
        self.prompt_tokens += o.prompt_tokens
        self.cached_tokens += o.cached_tokens
        self.output_tokens += o.output_tokens
        self.busy_usd += o.busy_usd
        self.idle_usd += o.idle_usd
        self.input_usd += o.input_usd
        self.output_usd += o.output_usd
        self.cache_savings_usd += o.cache_savings_usd
        if o.api_usd is not None:
            self.api_usd = (self.api_usd or 0.0) + o.api_usd

    @property
    def total_usd(self) -> float:
        return self.busy_usd + self.idle_usd

    def as_dict(self) -> dict[str, float | None]:
        tokens = self.prompt_tokens + self.output_tokens

        def per(value: float, count: float, scale: float = 1.0) -> float | None:
            return value / count * scale if count > 0 else None

        usage = per(self.busy_usd, tokens, MILLION)
        allocation = per(self.total_usd, tokens, MILLION)
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached_tokens,
            "output_tokens": self.output_tokens,
            "cost_usd": self.total_usd,
            "busy_usd": self.busy_usd,
            "idle_usd": self.idle_usd,
            "usd_per_request": per(self.total_usd, self.requests),
            "usd_per_1k_requests": per(self.total_usd, self.requests, 1000.0),
            "usd_per_million_input_tokens": per(self.input_usd, self.prompt_tokens, MILLION),
            "usd_per_million_output_tokens": per(self.output_usd, self.output_tokens, MILLION),
            "usage_usd_per_million_tokens": usage,
            "allocation_usd_per_million_tokens": allocation,
            "utilization": usage / allocation if usage is not None and allocation else None,
            "cache_savings_usd": self.cache_savings_usd,
            "api_usd": self.api_usd,
        }


@dataclass(slots=True)
class DeploymentCost:
    name: str
    gpu: str
    allocated_usd: float
    gpu_hours: float
    replica_hours: float
    busy_share: float | None  # None: no busy samples (older data): all cost counted busy
    busy_source: str  # "engine" (requests running), "dcgm" (GPU engine activity) or "none"
    busy_usd: float
    idle_usd: float  # allocated - busy
    unshared_idle_usd: float  # idle charged to no group (share_idle false, or no work at all)
    prefill_seconds_per_token: float | None
    decode_seconds_per_token: float | None
    calibrated: bool  # False: the output-token multiplier stood in for measured times
    line: Line = field(default_factory=Line)


@dataclass(slots=True)
class CostReport:
    start_unix: int
    end_unix: int
    deployments: list[DeploymentCost]
    groups: dict[tuple[str | None, str, str, str | None], Line]  # (deployment, target, model, business type)
    unpriced_targets: list[str]

    @property
    def allocated_usd(self) -> float:
        return sum(d.allocated_usd for d in self.deployments)

    def by(self, group_by: str) -> dict[str, Line]:
        index = {"deployment": 0, "target": 1, "model": 2, "business_type": 3}[group_by]
        out: dict[str, Line] = defaultdict(Line)
        for key, line in self.groups.items():
            out[str(key[index] if key[index] is not None else "(none)")].add(line)
        return dict(out)

    def business_type_costs(self) -> dict[str, tuple[float, float]]:
        """(allocated USD incl. its idle share, tokens) per business type (the cost SLI)."""
        out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for (_d, _t, _m, bt), line in self.groups.items():
            if bt is not None:
                out[bt][0] += line.total_usd
                out[bt][1] += line.prompt_tokens + line.output_tokens
        return {bt: (v[0], v[1]) for bt, v in out.items()}


BusinessTypeOf = Callable[[str, str], str | None]


def attribute(
    inputs: CostInputs,
    inventory: Inventory,
    config: CostConfig,
    start_unix: int,
    end_unix: int,
    business_type_of: BusinessTypeOf,
) -> CostReport:
    """The cost report of one window from its inputs."""
    hours = (end_unix - start_unix) / 3600.0
    by_deployment: dict[str, list[tuple[tuple[str, str], Work]]] = defaultdict(list)
    unpriced: set[str] = set()
    groups: dict[tuple[str | None, str, str, str | None], Line] = {}
    for (target, model), w in inputs.work.items():
        d = inventory.deployment_of(target)
        if d is None:
            unpriced.add(target)
            groups[(None, target, model, business_type_of(target, model))] = Line(
                w.requests, w.prompt_tokens, min(w.cached_tokens, w.prompt_tokens), w.output_tokens
            )
        else:
            by_deployment[d.name].append(((target, model), w))
    deployments = []
    for d in inventory.deployments.values():
        cost = _deployment(d, by_deployment.get(d.name, []), config, hours, business_type_of, groups)
        deployments.append(cost)
    return CostReport(start_unix, end_unix, deployments, groups, sorted(unpriced))


def _deployment(
    d: Deployment,
    members: list[tuple[tuple[str, str], Work]],
    config: CostConfig,
    hours: float,
    business_type_of: BusinessTypeOf,
    groups: dict[tuple[str | None, str, str, str | None], Line],
) -> DeploymentCost:
    # replica time and busy time, per target (a target serving several models is busy when any is)
    gpus = [w for _key, w in members if w.is_gpu_only]
    members = [(key, w) for key, w in members if not w.is_gpu_only]
    present: dict[str, float] = defaultdict(float)
    busy: dict[str, float] = defaultdict(float)
    sampled = False
    for (target, _model), w in members:
        if w.busy_n > 0:
            sampled = True
            present[target] = max(present[target], w.observed_seconds)
            busy[target] = max(busy[target], w.busy_sum / w.busy_n * w.observed_seconds)
    seen_hours = sum(present.values()) / 3600.0
    replica_hours = d.config.replicas * hours if d.config.replicas is not None else seen_hours
    gpu_hours = replica_hours * d.config.gpus_per_replica
    allocated = gpu_hours * d.gpu_hour_usd + d.fixed_hour_usd() * hours
    busy_share: float | None = None
    source = "none"
    if sampled:
        busy_share = sum(busy.values()) / sum(present.values()) if sum(present.values()) > 0 else 0.0
        source = "engine"
    elif sum(g.gpu_active_n for g in gpus) > 0:
        busy_share = sum(g.gpu_active_sum for g in gpus) / sum(g.gpu_active_n for g in gpus)
        source = "dcgm"
    busy_usd = allocated * (busy_share if busy_share is not None else 1.0)

    # price of a unit of work, calibrated on this deployment's own prefill and decode times
    total = Work()
    for _key, w in members:
        total.merge(w)
    a: float | None = None
    c: float | None = None
    if total.uncached_tokens > 0 and total.prefill_seconds > 0:
        a = total.prefill_seconds / total.uncached_tokens
    if total.output_tokens > 0 and total.decode_seconds > 0:
        c = total.decode_seconds / total.output_tokens
    calibrated = a is not None and c is not None
    if not calibrated:
        a, c = 1.0, config.output_token_multiplier  # relative weights (OpenCost's multiplier mode)
    assert a is not None and c is not None
    b = config.cached_token_weight * a

    def work_of(w: Work) -> tuple[float, float, float]:
        cached = min(w.cached_tokens, w.prompt_tokens)
        return a * w.uncached_tokens, b * cached, c * w.output_tokens

    total_work = sum(sum(work_of(w)) for _key, w in members)
    if total_work <= 0:
        busy_usd = 0.0  # no work to charge busy time to: all of it is idle
    idle_usd = allocated - busy_usd
    shared_idle = idle_usd if config.share_idle and total_work > 0 else 0.0
    per_work = busy_usd / total_work if total_work > 0 else 0.0
    per_work_idle = shared_idle / total_work if total_work > 0 else 0.0
    prices = d.api_prices
    summary = Line()
    for (target, model), w in members:
        unc, cac, out = work_of(w)
        rate = per_work + per_work_idle
        cached = min(w.cached_tokens, w.prompt_tokens)
        line = Line(
            requests=w.requests,
            prompt_tokens=w.prompt_tokens,
            cached_tokens=cached,
            output_tokens=w.output_tokens,
            busy_usd=per_work * (unc + cac + out),
            idle_usd=per_work_idle * (unc + cac + out),
            input_usd=rate * (unc + cac),
            output_usd=rate * out,
            cache_savings_usd=per_work * (a - b) * cached,
            api_usd=None if prices is None else prices.cost(w.uncached_tokens, cached, w.output_tokens),
        )
        groups[(d.name, target, model, business_type_of(target, model))] = line
        summary.add(line)
    return DeploymentCost(
        name=d.name,
        gpu=d.config.gpu,
        allocated_usd=allocated,
        gpu_hours=gpu_hours,
        replica_hours=replica_hours,
        busy_share=busy_share,
        busy_source=source,
        busy_usd=busy_usd,
        idle_usd=idle_usd,
        unshared_idle_usd=idle_usd - shared_idle,
        prefill_seconds_per_token=a if calibrated else None,
        decode_seconds_per_token=c if calibrated else None,
        calibrated=calibrated,
        line=summary,
    )


def tenant_lines(
    report: CostReport, requests: Iterable[tuple[RequestKey, RequestCell]], cached_token_weight: float
) -> dict[str, Line]:
    """Cost per tenant (from gateway spans): each model's measured price per uncached prompt,
    cached prompt and output token (the engine side of the report, idle share included) times
    the tokens each tenant's requests carried. Spans cover what the gateway saw, so the tenants
    add up to the engine's total only when every request went through it; spans claiming more
    tokens of a model than its engines counted (a gateway in front of servers llmslo does not
    scrape, clocks apart) are scaled down to the engines' count, so tenants never sum above the
    cost they split."""
    # per model: input USD, input work (tokens, hits weighted), output USD, output tokens, busy USD, total USD
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0] * 6)
    for (_d, _t, model, _bt), line in report.groups.items():
        s = sums[model]
        s[0] += line.input_usd
        s[1] += line.prompt_tokens - line.cached_tokens + cached_token_weight * line.cached_tokens
        s[2] += line.output_usd
        s[3] += line.output_tokens
        s[4] += line.busy_usd
        s[5] += line.total_usd
    # one pass over the cells (a month of a large gateway's is millions, read an hour at a time):
    # per (tenant, model) requests, input tokens, cached tokens (at most the input), output
    # tokens and input work (uncached plus weighted cached tokens); per model, what spans claim
    per: dict[tuple[str, str], list[float]] = {}
    for key, cell in requests:
        clipped = min(cell.cached_input_tokens, cell.input_tokens)
        acc = per.get((key.tenant, key.model))
        if acc is None:
            acc = per[(key.tenant, key.model)] = [0.0] * 5
        acc[0] += cell.total
        acc[1] += cell.input_tokens
        acc[2] += clipped
        acc[3] += cell.output_tokens
        acc[4] += cell.input_tokens - clipped + cached_token_weight * clipped
    claimed: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])  # model -> span input work, output tokens
    for (_tenant, model), acc in per.items():
        claimed[model][0] += acc[4]
        claimed[model][1] += acc[3]
    out: dict[str, Line] = defaultdict(Line)
    for (tenant, model), (n, input_tokens, cached, output_tokens, work) in sorted(per.items()):
        line = Line(n, input_tokens, cached, output_tokens)
        m = sums.get(model)
        if m is not None:
            c_in, c_out = claimed[model]
            per_input = m[0] / max(m[1], c_in) if m[1] > 0 else 0.0
            per_output = m[2] / max(m[3], c_out) if m[3] > 0 else 0.0
            line.input_usd = per_input * work
            line.output_usd = per_output * output_tokens
            busy_share = m[4] / m[5] if m[5] > 0 else 1.0
            line.busy_usd = (line.input_usd + line.output_usd) * busy_share
            line.idle_usd = (line.input_usd + line.output_usd) - line.busy_usd
        out[tenant].add(line)
    return dict(out)


@dataclass(slots=True)
class CostMeter:
    """Running dollar counters for /metrics, so that Prometheus can rate() and sum() them:
    allocated per deployment, attributed per (deployment, business type, model). Advanced one
    closed minute range at a time from the store (counters start at zero when llmslo starts,
    as any counter does after a restart)."""

    until: int | None = None  # the minute up to which the counters have counted (exclusive)
    allocated: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    busy: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    attributed: dict[tuple[str, str, str], float] = field(default_factory=lambda: defaultdict(float))

    def add(self, report: CostReport) -> None:
        for d in report.deployments:
            self.allocated[d.name] += d.allocated_usd
            self.busy[d.name] += d.busy_usd
        for (deployment, _target, model, bt), line in report.groups.items():
            if deployment is not None:
                self.attributed[(deployment, bt or "unassigned", model)] += line.total_usd
        self.until = report.end_unix

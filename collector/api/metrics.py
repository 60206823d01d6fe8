"""/metrics: llmslo's self-metrics and derived serving series, as a prometheus-client Collector.

Values are computed elsewhere (scrapers keep their status, the scheduler refreshes the derived
snapshot); `collect()` only formats what is there, so a Prometheus scrape of llmslo is cheap.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from collector import __version__
from collector import conventions as conv
from collector.analytics.serving import GaugeStats, ServingStats
from collector.config import format_duration
from collector.slo.evaluate import burn

if TYPE_CHECKING:
    from collector.runtime import Runtime

# (scope, suffix, help, extra label names) -> the family, created on first use
FamilyFactory = Callable[[str, str, str, list[str]], GaugeMetricFamily]


class LlmsloCollector(Collector):
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def collect(self) -> Iterator[Metric]:
        yield from self._self_metrics()
        yield from self._slos()
        yield from self._traces()
        yield from self._cost()
        yield from self._drift()

    def _drift(self) -> Iterator[Metric]:
        monitor = self.runtime.drift
        if monitor is None:
            return
        labels = ["business_type", "tenant", "signal"]
        stats = GaugeMetricFamily(
            conv.DRIFT_STATISTIC,
            "Distance of the current window from the reference (statistic: psi, js, ks, wasserstein).",
            labels=[*labels, "statistic"],
        )
        threshold = GaugeMetricFamily(
            conv.DRIFT_THRESHOLD, "PSI above which the signal is reported as drifted.", labels=[*labels, "calibrated"]
        )
        drifted = GaugeMetricFamily(conv.DRIFT_DETECTED, "1 while the signal is beyond its threshold.", labels=labels)
        for f in monitor.latest:
            key = [f.business_type, f.tenant, f.signal]
            for name in ("psi", "js", "ks", "wasserstein"):
                value = f.distances.get(name)
                if value is not None:
                    stats.add_metric([*key, name], value)
            threshold.add_metric([*key, "true" if f.threshold.calibrated else "false"], f.threshold.psi)
            drifted.add_metric(key, 1.0 if f.drifted else 0.0)
        minutes = CounterMetricFamily(
            conv.DRIFT_REFERENCE_MINUTES_TOTAL,
            "Engine minutes the drift reference took in, by source: saved (loaded from the store: "
            "collector/drift/saved.py) or rollups (reduced from every target's stored rows).",
            labels=[conv.LABEL_SOURCE],
        )
        for source, n in sorted(monitor.minutes_read.items()):
            minutes.add_metric([source], float(n))
        yield from (stats, threshold, drifted, minutes)

    def _cost(self) -> Iterator[Metric]:
        rt = self.runtime
        if not rt.inventory:
            return
        meter = rt.cost_meter
        allocated = CounterMetricFamily(
            conv.COST_ALLOCATED_USD,
            "USD allocated to the deployment (GPU price x GPU-hours + fixed costs) since llmslo started.",
            labels=["deployment"],
        )
        busy = CounterMetricFamily(
            conv.COST_BUSY_USD, "Of the allocated USD, the share while requests were running.", labels=["deployment"]
        )
        price = GaugeMetricFamily(
            conv.COST_GPU_HOUR_USD, "Configured price of one GPU-hour.", labels=["deployment", "gpu"]
        )
        for name, d in rt.inventory.deployments.items():
            allocated.add_metric([name], meter.allocated.get(name, 0.0))
            busy.add_metric([name], meter.busy.get(name, 0.0))
            price.add_metric([name, d.config.gpu], d.gpu_hour_usd)
        attributed = CounterMetricFamily(
            conv.COST_ATTRIBUTED_USD,
            "USD attributed to the work of a business type and model (busy cost by work, plus the shared idle).",
            labels=["deployment", "business_type", "model"],
        )
        for (deployment, business_type, model), usd in sorted(meter.attributed.items()):
            attributed.add_metric([deployment, business_type, model], usd)
        yield from (allocated, busy, attributed, price)

    def _traces(self) -> Iterator[Metric]:
        t = self.runtime.traces
        spans = CounterMetricFamily(
            conv.TRACE_SPANS_TOTAL, "Spans received over OTLP, by what became of them.", labels=[conv.LABEL_RESULT]
        )
        for result in ("accepted", "duplicate", "rejected", "ignored"):
            spans.add_metric([result], float(t.spans.get(result, 0)))
        calls = CounterMetricFamily(
            conv.TRACE_REQUESTS_TOTAL,
            "OTLP export requests, by transport and status (as in HTTP; gRPC codes map to them).",
            labels=[conv.LABEL_TRANSPORT, conv.LABEL_STATUS],
        )
        for (transport, status), n in sorted(t.requests.items()):
            calls.add_metric([transport, str(status)], float(n))
        stored = HistogramMetricFamily(
            conv.TRACE_STORE_SECONDS,
            "Seconds to store one trace batch, on the event loop's thread (blocking it) or a worker's.",
            labels=[conv.LABEL_THREAD],
        )
        for thread, histogram in t.store_seconds.items():
            buckets = [("+Inf" if b == math.inf else str(b), float(n)) for b, n in histogram.cumulative()]
            stored.add_metric([thread], buckets, histogram.total)
        folded = CounterMetricFamily(
            conv.TRACE_VALUES_FOLDED,
            'Span values past the cardinality limits, folded into "other" (tenant, model, track) or "unassigned".',
            labels=["field"],
        )
        for name in ("business_type", "tenant", "model", "track"):
            folded.add_metric([name], float(t.guard.folded.get(name, 0)))
        yield from (spans, calls, stored, folded)
        snap = self.runtime.request_snapshot
        if not snap:
            return
        base = [conv.LABEL_BUSINESS_TYPE, conv.LABEL_TENANT, conv.LABEL_WINDOW]
        seen = GaugeMetricFamily(
            conv.REQUESTS_SEEN,
            'Requests seen in traces over the window (top tenants, the rest as tenant="other").',
            labels=base,
        )
        ttft = GaugeMetricFamily(
            conv.REQUESTS_TTFT,
            "Per-request TTFT quantile from traces (sketch, <= 1 % error).",
            labels=[*base, conv.LABEL_QUANTILE],
        )
        goodput = GaugeMetricFamily(
            conv.REQUESTS_GOODPUT, "Share of requests meeting every latency objective at once.", labels=base
        )
        for (window, business_type, tenant), s in sorted(snap.items()):
            labels = [business_type, tenant, format_duration(window)]
            seen.add_metric(labels, float(s.requests))
            for q, v in s.latencies["ttft"].quantiles.items() if "ttft" in s.latencies else ():
                ttft.add_metric([*labels, conv.quantile_label(q)], v)
            if s.goodput_ratio is not None:
                goodput.add_metric(labels, s.goodput_ratio)
        yield from (seen, ttft, goodput)

    def _slos(self) -> Iterator[Metric]:
        rt = self.runtime
        if rt.rules is None:
            return
        base = [conv.LABEL_SLO, conv.LABEL_BUSINESS_TYPE]
        objective = GaugeMetricFamily(conv.SLO_OBJECTIVE, "SLO objective: required share of good events.", labels=base)
        sli = GaugeMetricFamily(
            conv.SLO_SLI,
            "Share of good events over the window (no series = no data).",
            labels=[*base, conv.LABEL_WINDOW],
        )
        burn_rate = GaugeMetricFamily(
            conv.SLO_BURN_RATE,
            "Error rate / error budget over the window.",
            labels=[*base, conv.LABEL_WINDOW],
        )
        remaining = GaugeMetricFamily(
            conv.SLO_BUDGET_REMAINING, "Error budget left in the SLO period (1 = all).", labels=base
        )
        good = CounterMetricFamily(
            conv.SLO_GOOD_EVENTS, "Good events llmslo counted from the engines since it started.", labels=base
        )
        total = CounterMetricFamily(
            conv.SLO_EVENTS, "Events llmslo counted from the engines since it started.", labels=base
        )
        firing = GaugeMetricFamily(
            conv.SLO_ALERT_FIRING,
            "1 while a burn-rate alert instance fires.",
            labels=[*base, conv.LABEL_SEVERITY, conv.LABEL_LONG_WINDOW, conv.LABEL_SHORT_WINDOW],
        )
        threshold = GaugeMetricFamily(
            conv.SLO_THRESHOLD_SECONDS,
            "A latency SLO's threshold: a request slower than this is a bad event (dashboards draw it).",
            labels=[*base, conv.LABEL_METRIC],
        )
        for o in rt.rules.objectives:
            labels = [o.slo, o.business_type]
            objective.add_metric(labels, o.objective)
            if o.sli == "latency" and o.metric is not None and o.threshold_seconds is not None:
                threshold.add_metric([*labels, o.metric], o.threshold_seconds)
        if rt.ledger is not None:
            # monotonic whichever replica restarts: rate() over them is the fleet's event rate
            for o, counted in rt.ledger.events_since_start():
                good.add_metric([o.slo, o.business_type], counted.good)
                total.add_metric([o.slo, o.business_type], counted.total)
        # sharded, the status series come from the elected evaluator alone (collector/cluster.py)
        for st in rt.slo_statuses if rt.exports_slo_status else ():
            labels = [st.objective.slo, st.objective.business_type]
            for seconds, w in sorted(st.windows.items()):
                if w.sli is not None:
                    sli.add_metric([*labels, format_duration(seconds)], w.sli)
                b = burn(w.events, st.objective)
                if b is not None:
                    burn_rate.add_metric([*labels, format_duration(seconds)], b)
            if st.budget_remaining is not None:
                remaining.add_metric(labels, st.budget_remaining)
        for inst in rt.alerts.active():
            lbl = inst.labels
            if "slo" not in lbl:  # an incident alert (restart, drift, cache collapse): not an SLO's
                continue
            firing.add_metric(
                [lbl["slo"], lbl["business_type"], lbl["severity"], lbl["long_window"], lbl["short_window"]],
                1.0 if inst.state == "firing" else 0.0,
            )
        yield from (objective, threshold, sli, burn_rate, remaining, good, total, firing)
        yield from self._ledger_fill()

    def _ledger_fill(self) -> Iterator[Metric]:
        """How the SLO ledger was filled at start-up, and how far its saved counts go."""
        rt = self.runtime
        if rt.ledger is None or not rt.ledger.ready:
            return
        yield _gauge(
            conv.SLO_LEDGER_FILL_SECONDS,
            "How long the SLO ledger's fill took at start-up (no SLO status or alert before it ended).",
            rt.slo_fill_seconds,
        )
        yield _gauge(
            conv.SLO_LEDGER_FILL_ROWS,
            "Stored rollup rows the SLO ledger counted at start-up: those after its saved counts "
            "(the whole SLO period's when none could be used).",
            rt.slo_backfill_rows,
        )
        yield _gauge(
            conv.SLO_LEDGER_RECOUNTING,
            "Objectives (and prefix-cache counts) whose definition changed since their counts were saved, "
            "still being counted again from the stored rollups: no status or alert for them until then.",
            len(rt.ledger.save_state()[0]),
        )
        if rt.slo_recount_seconds is not None:
            yield _gauge(
                conv.SLO_LEDGER_RECOUNT_SECONDS,
                "How long counting the changed objectives again from the stored rollups took.",
                rt.slo_recount_seconds,
            )
            yield _gauge(
                conv.SLO_LEDGER_RECOUNT_ROWS,
                "Stored rollup rows the recount of the changed objectives read (their own series alone).",
                rt.slo_recount_rows,
            )
        if rt.slo_counts_saved_through is not None:
            through = GaugeMetricFamily(
                conv.SLO_COUNTS_SAVED_THROUGH,
                "Every closed minute before this time has its SLO counts saved in the store: a restart "
                "counts the stored rollups again only from here.",
            )
            through.add_metric([], float(rt.slo_counts_saved_through))
            yield through

    def _self_metrics(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(conv.BUILD_INFO, "llmslo build information.", labels=["version"])
        info.add_metric([__version__], 1.0)
        yield info
        skipped = CounterMetricFamily(
            conv.SCRAPE_SLOTS_SKIPPED_TOTAL,
            "Scrape slots skipped because the target's previous scrape overran its interval, or the "
            "process could not keep up (all targets together).",
        )
        skipped.add_metric([], float(self.runtime.loops.skipped_slots))
        yield skipped
        commits = self.runtime.committer.stats
        transactions = CounterMetricFamily(
            conv.STORE_TRANSACTIONS_TOTAL,
            "Transactions that wrote scrapes' rows (a group commit carries several targets' writes).",
        )
        transactions.add_metric([], float(commits.transactions))
        writes = CounterMetricFamily(
            conv.STORE_WRITES_TOTAL,
            "Scrapes' writes committed (a 15 s target writes once a minute, with its minute's last scrape).",
        )
        writes.add_metric([], float(commits.scrapes))
        yield from (transactions, writes)
        timings = self.runtime.job_timings
        last = GaugeMetricFamily(
            conv.JOB_LAST_DURATION,
            "How long the last run of each periodic job took (derive, drift, slo, ...): near its "
            "interval, the collector is near its limit.",
            labels=[conv.LABEL_PERIODIC_JOB],
        )
        job_label = [conv.LABEL_PERIODIC_JOB]
        total = CounterMetricFamily(conv.JOB_DURATION_TOTAL, "Time spent in each periodic job.", labels=job_label)
        runs = CounterMetricFamily(conv.JOB_RUNS_TOTAL, "Runs of each periodic job.", labels=job_label)
        when = GaugeMetricFamily(conv.JOB_LAST_RUN, "When each periodic job last finished.", labels=job_label)
        for job in sorted(timings.runs):
            last.add_metric([job], timings.last_seconds[job])
            total.add_metric([job], timings.total_seconds[job])
            runs.add_metric([job], float(timings.runs[job]))
            when.add_metric([job], timings.last_unix[job])
        yield from (last, total, runs, when)
        encodes = CounterMetricFamily(
            conv.FLEET_VIEW_ENCODES_TOTAL,
            "Encodes of the fleet view (/api/v1/serving without a selector): ahead of its readers by a "
            "derive pass, or on_request by a read that found no recent body and waited.",
            labels=["when"],
        )
        spent = CounterMetricFamily(
            conv.FLEET_VIEW_ENCODE_SECONDS_TOTAL, "Time spent encoding the fleet view.", labels=["when"]
        )
        for how, (n, seconds) in sorted(self.runtime.view_encodes.items()):
            encodes.add_metric([how], float(n))
            spent.add_metric([how], seconds)
        yield from (encodes, spent)
        fleet = self.runtime.fleet
        pair = [conv.LABEL_TARGET, conv.LABEL_MODEL]
        unassigned = GaugeMetricFamily(
            conv.UNASSIGNED_MODELS,
            "1 per (target, model) that no business type claims: no SLO evaluates its traffic.",
            labels=pair,
        )
        for target, model in fleet.unassigned():
            unassigned.add_metric([target, model], 1.0)
        conflicts = GaugeMetricFamily(
            conv.BUSINESS_TYPE_CONFLICTS,
            "1 per (target, model) whose target configuration and SLO rules name different business types.",
            labels=pair,
        )
        for target, model, _ in fleet.conflicts():
            conflicts.add_metric([target, model], 1.0)
        yield from (unassigned, conflicts)
        yield from self._cluster()

    def _cluster(self) -> Iterator[Metric]:
        cluster = self.runtime.cluster
        if cluster is None:
            return
        leader = GaugeMetricFamily(
            conv.CLUSTER_LEADER,
            "1 while this collector is the elected SLO evaluator of the sharded fleet (it sends the fleet's alerts).",
        )
        leader.add_metric([], 1.0 if cluster.leader else 0.0)
        peers = GaugeMetricFamily(
            conv.CLUSTER_PEERS, "Other collectors whose SLO counts arrived within the last 10 minutes."
        )
        peers.add_metric([], float(cluster.exchange.peers()))
        published = CounterMetricFamily(
            conv.CLUSTER_COUNTS_PUBLISHED_TOTAL, "SLO counts (rows) this collector published for the others."
        )
        published.add_metric([], float(cluster.published))
        received = CounterMetricFamily(
            conv.CLUSTER_COUNTS_RECEIVED_TOTAL, "SLO counts (rows) taken from the other collectors."
        )
        received.add_metric([], float(cluster.received))
        late = CounterMetricFamily(
            conv.CLUSTER_COUNTS_LATE_TOTAL,
            "Published slice counts that arrived after their slice was judged (raise cluster.settle).",
        )
        late.add_metric([], float(self.runtime.ledger.late if self.runtime.ledger is not None else 0))
        failures = CounterMetricFamily(
            conv.CLUSTER_EXCHANGE_FAILURES_TOTAL, "SLO passes whose exchange with the database failed."
        )
        failures.add_metric([], float(cluster.failures))
        yield from (leader, peers, published, received, late, failures)


class DerivedCollector(Collector):
    """The serving series of the last derive pass (per business type, and per (target, model) up
    to `server.metrics_target_limit` pairs): they change once per pass (see DerivedText)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def collect(self) -> Iterator[Metric]:
        yield from self._derived()

    def _derived(self) -> Iterator[Metric]:
        families: dict[str, GaugeMetricFamily] = {}
        # the targets' static labels (configuration `labels:`) go on their per-target series
        static = sorted({k for t in self.runtime.targets.values() for k in t.labels})

        def fam(scope: str, suffix: str, doc: str, extra: list[str]) -> GaugeMetricFamily:
            name = scope + suffix
            if name not in families:
                base = (
                    [conv.LABEL_TARGET, conv.LABEL_MODEL, conv.LABEL_BUSINESS_TYPE, *static]
                    if scope == conv.SCOPE_SERVING
                    else [conv.LABEL_BUSINESS_TYPE]
                )
                families[name] = GaugeMetricFamily(name, doc, labels=[*base, conv.LABEL_WINDOW, *extra])
            return families[name]

        limit = self.runtime.settings.server.metrics_target_limit
        omitted = GaugeMetricFamily(
            conv.SERVING_GROUPS_OMITTED,
            "(target, model) pairs whose llmslo_serving_* series are left out of /metrics because the "
            "fleet has more than server.metrics_target_limit of them (business-type series stay).",
        )
        reports = sorted(self.runtime.snapshot.reports.items())
        pairs = max((len(r.groups) for _, r in reports), default=0)
        omitted.add_metric([], float(pairs if pairs > limit else 0))
        yield omitted
        for window, report in reports:
            w = format_duration(window)
            for g in report.groups if pairs <= limit else ():
                cfg = self.runtime.targets.get(g.target)
                values = [cfg.labels.get(k, "") if cfg else "" for k in static]
                _emit(fam, conv.SCOPE_SERVING, [g.target, g.model, g.business_type, *values, w], g.stats)
            for b in report.business_types:
                _emit(fam, conv.SCOPE_BUSINESS, [b.business_type, w], b.stats)
        yield from families.values()


def _emit(fam: FamilyFactory, scope: str, labels: list[str], s: ServingStats) -> None:
    def put(
        suffix: str,
        doc: str,
        value: float | None,
        extra: list[str] | None = None,
        extra_values: list[str] | None = None,
    ) -> None:
        if value is None or math.isnan(value):
            return  # no data is absent, never zero
        fam(scope, suffix, doc, extra or []).add_metric([*labels, *(extra_values or [])], value)

    put(conv.REQUESTS_PER_SECOND, "Finished requests per second (all finish reasons).", s.requests_per_second)
    put(conv.ERROR_RATIO, "Share of finished requests that ended in abort or error.", s.error_ratio)
    if s.requests:
        for reason, count in sorted(s.finished.items()):
            put(
                conv.FINISHED_RATIO,
                "Share of finished requests by finish reason.",
                count / s.requests,
                [conv.LABEL_FINISHED_REASON],
                [reason],
            )
    put(conv.PROMPT_TOKENS_PER_SECOND, "Prompt tokens processed per second.", s.prompt_tokens_per_second)
    put(conv.GENERATION_TOKENS_PER_SECOND, "Generated tokens per second.", s.generation_tokens_per_second)
    put(conv.PREEMPTIONS_PER_SECOND, "Preemptions per second.", s.preemptions_per_second)
    put(conv.PREFIX_CACHE_HIT_RATIO, "Prefix-cache hits / queries (ratio of sums).", s.prefix_cache_hit_ratio)
    for suffix, doc, g in (
        (
            conv.KV_CACHE_USAGE_RATIO,
            "KV-cache usage (0-1), last value; max across replicas.",
            s.kv_cache_usage,
        ),
        (conv.REQUESTS_RUNNING, "Requests running, last value.", s.requests_running),
        (conv.REQUESTS_WAITING, "Requests waiting (queue depth), last value.", s.requests_waiting),
    ):
        put(suffix, doc, _last(g))
    for metric, length in s.lengths.items():
        for q in length.quantiles:
            put(
                conv.LENGTH_SUFFIX[metric],
                f"{metric} quantile over the window (tokens per request)",
                q.value,
                [conv.LABEL_QUANTILE],
                [conv.quantile_label(q.quantile)],
            )
    for metric, lat in s.latencies.items():
        doc = (
            f"{metric} quantile over the window by histogram interpolation, somewhere between the "
            f"{conv.BOUND_LOWER} and {conv.BOUND_UPPER} series of the same labels"
            + (f" (estimated from {lat.source})" if lat.estimated else "")
        )
        suffix = conv.LATENCY_SUFFIX[metric]
        for q in lat.quantiles:
            q_values = [conv.quantile_label(q.quantile), "true" if lat.estimated else "false"]
            extra = [conv.LABEL_QUANTILE, conv.LABEL_ESTIMATED]
            put(suffix, doc, q.value, extra, q_values)
            put(
                conv.bound_name(suffix, conv.BOUND_LOWER),
                "Lower bound of the bucket the quantile fell in.",
                q.lower_bound,
                extra,
                q_values,
            )
            put(
                conv.bound_name(suffix, conv.BOUND_UPPER),
                "Upper bound of the bucket the quantile fell in (+Inf above the top bound).",
                q.upper_bound,
                extra,
                q_values,
            )


def _last(g: GaugeStats | None) -> float | None:
    return None if g is None else g.last


# The per-target self-metrics: (name, type, help). Rendered by `render_targets` rather than
# through prometheus_client: at a thousand targets they are most of /metrics' lines, and
# formatting them from label strings escaped once per target takes a fraction of the time.
TARGET_FAMILIES: tuple[tuple[str, str, str], ...] = (
    (conv.TARGET_UP, "gauge", "1 if the last scrape of the target succeeded, else 0."),
    (conv.SCRAPE_DURATION_SECONDS, "gauge", "Duration of the last scrape."),
    (conv.SCRAPE_SAMPLES, "gauge", "Samples llmslo used from the last good scrape."),
    (conv.SCRAPE_BODY_BYTES, "gauge", "Decompressed body size of the last scrape."),
    (conv.LAST_SCRAPE_TIMESTAMP_SECONDS, "gauge", "Unix time of the last scrape."),
    (conv.SCRAPES_TOTAL, "counter", "Scrapes attempted."),
    (conv.SCRAPE_ERRORS_TOTAL, "counter", "Failed scrapes by reason."),
    (conv.COUNTER_RESETS_TOTAL, "counter", "Series whose counters reset (a restart resets every series)."),
    (conv.TARGET_RESTARTS_TOTAL, "counter", "Restarts of the target's server seen by llmslo (one per restart)."),
    (conv.TARGET_LAST_RESTART_SECONDS, "gauge", "Unix time the last restarted server process started."),
    (
        conv.TARGET_PROCESS_START_SECONDS,
        "gauge",
        "Unix time the target's server process started (process_start_time_seconds or _created).",
    ),
)
_label_cache: dict[str, str] = {}


def _target_label(name: str) -> str:
    text = _label_cache.get(name)
    if text is None:
        escaped = name.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
        text = _label_cache[name] = f'{conv.LABEL_TARGET}="{escaped}"'
    return text


class TargetRenderer:
    """Every target's scrape health in the text exposition format (0.0.4), family by family.

    Half of the lines are the scrape errors by reason (eleven per target), which change rarely:
    each target's block of them is kept with the errors' total (a counter only grows, so an
    unchanged total means unchanged counts) and reused while it holds. Targets no longer
    configured drop out at the next render."""

    def __init__(self) -> None:
        self._errors: dict[str, tuple[int, str]] = {}
        self._lock = threading.Lock()  # renders in two threads at once would race on the kept blocks

    def render(self, runtime: Runtime) -> str:
        rows = [(name, _target_label(name), scraper.status) for name, scraper in sorted(runtime.scrapers.items())]
        out: list[str] = []
        with self._lock:
            kept, fresh = self._errors, {}
            for name, kind, doc in TARGET_FAMILIES:
                out.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")
                if name == conv.SCRAPE_ERRORS_TOTAL:
                    for target, label, st in rows:
                        total = sum(st.errors_total.values())
                        have = kept.get(target)
                        if have is None or have[0] != total:
                            lines = _target_values(name, label, st)
                            have = (total, "".join(f"{name}{{{label}{sfx}}} {v!r}\n" for sfx, v in lines))
                        fresh[target] = have
                        out.append(have[1])
                    continue
                value_of = _TARGET_VALUE[name]
                for _, label, st in rows:
                    value = value_of(st)
                    if value is not None:
                        out.append(f"{name}{{{label}}} {float(value)!r}\n")
            self._errors = fresh
        return "".join(out)


def render_targets(runtime: Runtime) -> str:
    """One render with nothing kept (tests, one-off callers)."""
    return TargetRenderer().render(runtime)


def _target_values(name: str, label: str, st: Any) -> list[tuple[str, float]]:
    """A target's samples of one family: (label suffix after `target="..."`, value)."""
    if name == conv.SCRAPE_ERRORS_TOTAL:
        # every known reason from the start, at 0: a series born at 1 would hide its first
        # failure from rate() and increase()
        return [(f',{conv.LABEL_REASON}="{r}"', float(st.errors_total.get(r, 0))) for r in conv.SCRAPE_ERROR_REASONS]
    value = _TARGET_VALUE[name](st)
    return [] if value is None else [("", float(value))]


# The one value of each single-sample family (None: no sample yet).
_TARGET_VALUE: dict[str, Callable[[Any], float | None]] = {
    conv.TARGET_UP: lambda st: None if st.up is None else (1.0 if st.up else 0.0),
    conv.SCRAPE_DURATION_SECONDS: lambda st: None if st.up is None else st.last_duration_seconds,
    conv.SCRAPE_SAMPLES: lambda st: st.samples,
    conv.SCRAPE_BODY_BYTES: lambda st: st.body_bytes,
    conv.LAST_SCRAPE_TIMESTAMP_SECONDS: lambda st: st.last_scrape_unix,
    conv.SCRAPES_TOTAL: lambda st: st.scrapes_total,
    conv.COUNTER_RESETS_TOTAL: lambda st: st.counter_resets_total,
    conv.TARGET_RESTARTS_TOTAL: lambda st: st.restarts_total,
    conv.TARGET_LAST_RESTART_SECONDS: lambda st: st.last_restart_unix,
    conv.TARGET_PROCESS_START_SECONDS: lambda st: st.process_start_unix,
}


class DerivedText:
    """The derived serving series as exposition text, rendered once per derive pass and reused by
    every /metrics request until the next pass (most of the samples prometheus_client formats).

    Once /metrics has been read, each pass renders it as it ends (`prepare`, in the pass's
    thread), so that a request only copies this part: rendered by the first request after a
    pass, at a thousand targets it waited ~50-100 ms for the interpreter beside the scrapes."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(DerivedCollector(runtime))
        self._kept: tuple[object, bytes] | None = None  # (the snapshot it was rendered from, text)
        self._lock = threading.Lock()
        self.read = False  # /metrics has been read: passes render ahead

    def render(self) -> bytes:
        self.read = True
        snapshot = self.runtime.snapshot
        with self._lock:
            kept = self._kept
            if kept is None or kept[0] is not snapshot:
                kept = self._kept = (snapshot, generate_latest(self.registry))
        return kept[1]

    def ready(self) -> bool:
        """The text of the current snapshot is rendered (a render only returns it)."""
        kept = self._kept
        return kept is not None and kept[0] is self.runtime.snapshot

    def prepare(self) -> None:
        """At the end of a derive pass: render the new snapshot's text if /metrics is read."""
        if self.read:
            self.render()


def build_registry(runtime: Runtime, derived: bool = True) -> CollectorRegistry:
    """llmslo's own families; with `derived`, the derived serving series too (the app renders those
    once per pass through DerivedText instead)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LlmsloCollector(runtime))
    if derived:
        registry.register(DerivedCollector(runtime))
    return registry


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    """A gauge of one unlabelled sample."""
    family = GaugeMetricFamily(name, documentation)
    family.add_metric([], float(value))
    return family

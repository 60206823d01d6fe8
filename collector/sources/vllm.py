"""vLLM exposition -> logical engine series: every vLLM version from 0.6 (V0) to current.

The alias table (reference vllm-metrics.md §3.5) maps each logical metric to the exposed sample
names of every version, newest first. When a transitional version exposes both the old and the
new name (0.9-0.11), only the newest is used. Series are summed over the data-parallel `engine`
label; gauges that are fractions (KV usage) take the max over engines, never the mean (trap T1/T2).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from collector.sources.expfmt import (
    ExpositionError,
    Labels,
    SeriesCache,
    decode_body,
    detect_format,
    family_of,
    scan,
)


class Kind(StrEnum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


class Agg(StrEnum):
    SUM = "sum"
    MAX = "max"


@dataclass(frozen=True, slots=True)
class Logical:
    """One logical engine metric and the exposed names that carry it, newest first."""

    name: str
    kind: Kind
    aliases: tuple[str, ...]
    agg: Agg = Agg.SUM
    keep_labels: tuple[str, ...] = ()


BUSY = "busy"

LOGICAL_METRICS: tuple[Logical, ...] = (
    # counters (exposed sample names, with `_total`)
    Logical("prompt_tokens", Kind.COUNTER, ("vllm:prompt_tokens_total",)),
    Logical("generation_tokens", Kind.COUNTER, ("vllm:generation_tokens_total",)),
    Logical("preemptions", Kind.COUNTER, ("vllm:num_preemptions_total",)),
    Logical(
        "request_success",
        Kind.COUNTER,
        ("vllm:request_success_total",),
        keep_labels=("finished_reason",),
    ),
    Logical(
        "prefix_cache_queries",
        Kind.COUNTER,
        ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    ),
    Logical(
        "prefix_cache_hits",
        Kind.COUNTER,
        ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    ),
    # gauges
    Logical("requests_running", Kind.GAUGE, ("vllm:num_requests_running",)),
    Logical("requests_waiting", Kind.GAUGE, ("vllm:num_requests_waiting",)),
    Logical(
        "kv_cache_usage",
        Kind.GAUGE,
        ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        agg=Agg.MAX,
    ),
    Logical("prefix_cache_hit_rate_v0", Kind.GAUGE, ("vllm:gpu_prefix_cache_hit_rate",), agg=Agg.MAX),
    # derived, exposed by no server: 1 when the scrape saw requests running, else 0, so that a
    # cell's mean (sum / n) is the share of scrapes the engine was busy (the cost model's busy/idle split)
    Logical(BUSY, Kind.GAUGE, (), agg=Agg.MAX),
    # histograms (family names)
    Logical("ttft", Kind.HISTOGRAM, ("vllm:time_to_first_token_seconds",)),
    Logical(
        "itl",
        Kind.HISTOGRAM,
        ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    ),
    Logical("tpot", Kind.HISTOGRAM, ("vllm:request_time_per_output_token_seconds",)),
    Logical("e2e", Kind.HISTOGRAM, ("vllm:e2e_request_latency_seconds",)),
    Logical("queue", Kind.HISTOGRAM, ("vllm:request_queue_time_seconds",)),
    Logical("prefill", Kind.HISTOGRAM, ("vllm:request_prefill_time_seconds",)),
    Logical("decode", Kind.HISTOGRAM, ("vllm:request_decode_time_seconds",)),
    Logical("inference", Kind.HISTOGRAM, ("vllm:request_inference_time_seconds",)),
    Logical("prompt_length", Kind.HISTOGRAM, ("vllm:request_prompt_tokens",)),
    Logical("generation_length", Kind.HISTOGRAM, ("vllm:request_generation_tokens",)),
)
LOGICAL_BY_NAME = {m.name: m for m in LOGICAL_METRICS}

# Sample label names that identify where a series came from, not what it measures.
_MODEL_LABEL = "model_name"
_DROPPED_LABELS = frozenset({"engine", "pid", "le"})

_PART_VALUE, _PART_BUCKET, _PART_SUM, _PART_COUNT, _PART_PROCESS_START, _PART_CREATED = 0, 1, 2, 3, 4, 5
# prometheus_client's process collector: it changes when the server restarts, even when the new
# process's counters happen to be back at (or above) their old values
_PROCESS_START = "process_start_time_seconds"
_PROCESS = Logical("process_start", Kind.GAUGE, (_PROCESS_START,), agg=Agg.MAX)


class _Route(NamedTuple):
    logical: Logical
    rank: int  # alias index: 0 = newest name
    part: int


def _build_routes() -> dict[str, _Route]:
    routes: dict[str, _Route] = {}
    for metric in LOGICAL_METRICS:
        for rank, alias in enumerate(metric.aliases):
            if metric.kind is Kind.HISTOGRAM:
                routes[alias + "_bucket"] = _Route(metric, rank, _PART_BUCKET)
                routes[alias + "_sum"] = _Route(metric, rank, _PART_SUM)
                routes[alias + "_count"] = _Route(metric, rank, _PART_COUNT)
                routes[alias + "_created"] = _Route(metric, rank, _PART_CREATED)
            else:
                routes[alias] = _Route(metric, rank, _PART_VALUE)
                if metric.kind is Kind.COUNTER:
                    # prometheus_client's creation time of the series: `<name>_created` (no _total)
                    routes[alias.removesuffix("_total") + "_created"] = _Route(metric, rank, _PART_CREATED)
    return routes


_ROUTES = _build_routes()


class SeriesKey(NamedTuple):
    """A logical engine series of one target: model, logical metric, and the labels kept."""

    model: str
    metric: str
    labels: Labels = ()


@dataclass(slots=True)
class HistogramPoint:
    """Cumulative histogram state: `cumulative[i]` counts observations <= bounds[i];
    the last entry (one past the finite bounds) is the +Inf bucket."""

    bounds: tuple[float, ...]
    cumulative: list[float]
    sum: float
    count: float


@dataclass(slots=True)
class EngineSnapshot:
    """Everything llmslo uses from one scrape of one vLLM server."""

    counters: dict[SeriesKey, float] = field(default_factory=dict)
    gauges: dict[SeriesKey, float] = field(default_factory=dict)
    histograms: dict[SeriesKey, HistogramPoint] = field(default_factory=dict)
    units: dict[SeriesKey, str] = field(default_factory=dict)
    samples: int = 0
    # When the server process started: `process_start_time_seconds`, else the earliest `_created`
    # sample of a vLLM series (the series vLLM creates at start-up). None in multiprocess mode,
    # where vLLM exposes neither.
    process_start_unix: float | None = None


class _Slot(NamedTuple):
    """Where one sample lands: its accumulation key, part and `le` bound."""

    ident: tuple[SeriesKey, int, str]  # (series, alias rank: 0 = newest name, engine)
    logical: Logical
    part: int
    le: float
    sample_name: str


SlotCache = SeriesCache["_Slot | None"]


def new_cache() -> SlotCache:
    """A per-target cache; keep one per target across scrapes for the fast path."""
    return SeriesCache()


def _resolver(default_model: str, label_value_length_limit: int = 0) -> Callable[[str, Labels, int], _Slot | None]:
    """Resolves a line's `name{labels}` once per target (the result is cached by the scanner), so
    the checks here cost nothing for a series already seen."""

    def resolve(name: str, labels: Labels, line: int) -> _Slot | None:
        if name == _PROCESS_START:
            return _Slot((SeriesKey("", "process_start"), 0, ""), _PROCESS, _PART_PROCESS_START, math.nan, name)
        route = _ROUTES.get(name)
        if route is None:
            return None
        if route.part == _PART_CREATED:
            return _Slot((SeriesKey("", "created"), 0, ""), route.logical, _PART_CREATED, math.nan, name)
        model = default_model
        kept: list[tuple[str, str]] = []
        le = math.nan
        engine = ""
        for label, value in labels:
            if label == _MODEL_LABEL:
                model = value
            elif label == "le":
                try:
                    le = float(value)
                except ValueError:
                    raise ExpositionError("parse", f"{name}: le={value!r} is not a number", line) from None
            elif label == "engine":
                engine = value
            elif label == "finish_reason":  # llm-d-inference-sim spells it without the "ed"
                kept.append(("finished_reason", value))
            elif label == "server":
                return None  # production-stack router series reuse vllm: names; not engine data
            elif label in route.logical.keep_labels:
                kept.append((label, value))
        if route.part == _PART_BUCKET and math.isnan(le):
            raise ExpositionError("parse", f"{name} has no le label", line)
        if label_value_length_limit:
            for lname, lvalue in ((_MODEL_LABEL, model), *kept):
                if len(lvalue) > label_value_length_limit:
                    raise ExpositionError(
                        "label_limit",
                        f"{lname} value of {len(lvalue)} characters is longer than "
                        f"scrape.label_value_length_limit {label_value_length_limit}; nothing stored",
                        line,
                    )
        kept.sort()
        key = SeriesKey(model, route.logical.name, tuple(kept))
        return _Slot((key, route.rank, engine), route.logical, route.part, le, name)

    return resolve


class _HistBuilder:
    __slots__ = ("buckets", "count", "first_line", "sum")

    def __init__(self, line: int) -> None:
        self.buckets: dict[float, float] = {}
        self.sum = math.nan
        self.count = math.nan
        self.first_line = line


def read_scrape(
    body: bytes | str,
    content_type: str | None = None,
    cache: SlotCache | None = None,
    default_model: str = "unknown",
    sample_limit: int = 0,
    model_limit: int = 0,
    label_value_length_limit: int = 0,
) -> EngineSnapshot:
    """Parse and normalize one scrape body of a vLLM server.

    Raises ExpositionError (with the line) for a body llmslo cannot use: bad syntax, bad
    encoding, a non-finite or negative counter, a histogram whose buckets decrease, a used
    family without a TYPE line. Nothing is returned in that case, so nothing gets stored.
    """
    fmt = detect_format(content_type)
    text = decode_body(body) if isinstance(body, bytes) else body
    resolver = _resolver(default_model, label_value_length_limit)
    if cache is None:
        cache = new_cache()
    slots, types = scan(text, fmt, cache, resolver, sample_limit)
    plan = cache.plan
    if isinstance(plan, _Plan) and plan.types == types and plan.slots == list(map(_first, slots)):
        planned = plan.apply(slots)
        if planned is not None:
            return planned
        # a value the plan does not take (a negative counter, a NaN, buckets going down): the
        # full reading below names it and its line
    cache.plan = None
    scalars: dict[tuple[SeriesKey, int, str], float] = {}
    hists: dict[tuple[SeriesKey, int, str], _HistBuilder] = {}
    process_start: float | None = None
    created: float | None = None
    n_created = 0
    # the sample names whose TYPE is checked: those of an earlier body with the same TYPE lines
    # are (a check reads only the TYPE lines and the name); names are added as they pass
    if types != cache.checked_types:
        cache.checked, cache.checked_types = set(), types
    checked = cache.checked
    for slot, value, line, _key in slots:
        part = slot.part
        if part == _PART_CREATED:
            n_created += 1
            # a timestamp: a gauge family in text 0.0.4, part of the counter in OpenMetrics
            if math.isfinite(value) and value > 0:
                created = value if created is None else min(created, value)
            continue
        if slot.sample_name not in checked:
            _check_type(types, slot.sample_name, slot.logical, line)
            checked.add(slot.sample_name)
        ident = slot.ident
        if part == _PART_PROCESS_START:
            process_start = value if process_start is None else max(process_start, value)
            continue
        if part == _PART_VALUE:
            if slot.logical.kind is Kind.COUNTER and not (0.0 <= value < math.inf):
                raise ExpositionError("parse", f"counter {slot.sample_name} has value {value}", line)
            prev = scalars.get(ident)
            if prev is None:
                scalars[ident] = value
            elif slot.logical.agg is Agg.MAX:
                scalars[ident] = max(prev, value)
            else:
                scalars[ident] = prev + value
            continue
        if not (0.0 <= value < math.inf) and not (part == _PART_SUM and -math.inf < value < 0.0):
            raise ExpositionError("parse", f"histogram sample {slot.sample_name} has value {value}", line)
        builder = hists.get(ident)
        if builder is None:
            builder = hists[ident] = _HistBuilder(line)
        if part == _PART_BUCKET:
            builder.buckets[slot.le] = value
        elif part == _PART_SUM:
            builder.sum = value
        else:
            builder.count = value
    if model_limit:
        models = {series.model for series, _rank, _engine in (*scalars, *hists)}  # one entry per series
        if len(models) > model_limit:
            raise ExpositionError(
                "model_limit",
                f"{len(models)} distinct model_name values, more than scrape.model_limit {model_limit}; nothing stored",
            )
    if process_start is None:
        process_start = created
    snapshot = EngineSnapshot(samples=len(slots) - n_created, process_start_unix=process_start)
    _fold_scalars(scalars, snapshot)
    _fold_histograms(hists, snapshot)
    for key, running in list(snapshot.gauges.items()):
        if key.metric == "requests_running":
            snapshot.gauges[SeriesKey(key.model, BUSY, key.labels)] = 1.0 if running > 0 else 0.0
    cache.plan = _Plan.of(slots, types, snapshot)
    return snapshot


_first = operator.itemgetter(0)
_value = operator.itemgetter(1)


_Sample = tuple["_Slot", float, int, str]  # (slot, value, line, key) as `scan` returns it
_Pick = Callable[[list[float]], tuple[float, ...]]


def _picker(positions: list[int]) -> _Pick:
    """The values at `positions` as a tuple (itemgetter returns a bare value for one position)."""
    if len(positions) == 1:
        only = positions[0]
        return lambda values: (values[only],)
    if not positions:
        return lambda values: ()
    return operator.itemgetter(*positions)


class _Plan:
    """What `read_scrape` made of a body's samples, position by position: a body whose samples
    resolve to the same slots in the same order, with the same TYPE lines (what a server sends
    scrape after scrape), gives the same snapshot with its own values, so it is read by taking
    each value from its position (C, itemgetter) instead of the loop over every sample. Made only
    for a body whose every series comes from one sample line (no engines or duplicate lines
    summed, no older alias kept beside a newer one). The values are checked as the full reading
    checks them; any that it would refuse is left to it (None), which names it and its line."""

    __slots__ = (
        "counters",
        "created",
        "gauges",
        "histograms",
        "nonneg",
        "process_start",
        "samples",
        "signed",
        "slots",
        "types",
        "units",
    )

    def __init__(self, slots: list[_Slot], types: dict[str, str]) -> None:
        self.slots = slots
        self.types = types
        self.counters: list[tuple[SeriesKey, int]] = []
        self.gauges: list[tuple[SeriesKey, int]] = []
        # key, bounds, positions of the buckets then +Inf (or _count), of _sum (or -1), of _count (or -1)
        self.histograms: list[tuple[SeriesKey, tuple[float, ...], _Pick, int, int]] = []
        self.units: dict[SeriesKey, str] = {}
        self.samples = 0
        self.nonneg = self.signed = self.process_start = self.created = _picker([])

    @classmethod
    def of(cls, slots: list[_Sample], types: dict[str, str], snap: EngineSnapshot) -> _Plan | None:
        """The plan of a body `read_scrape` read into `snap`, or None where one cannot say it."""
        plan = cls([s for s, _, _, _ in slots], types)
        by_ident: dict[tuple[SeriesKey, int, str], list[int]] = {}
        parts: dict[tuple[tuple[SeriesKey, int, str], int, float], int] = {}
        nonneg: list[int] = []
        signed: list[int] = []
        starts: list[int] = []
        created: list[int] = []
        for i, slot in enumerate(plan.slots):
            part = slot.part
            if part == _PART_CREATED:
                created.append(i)
                continue
            if part == _PART_PROCESS_START:
                starts.append(i)
                continue
            if (slot.ident, part, slot.le) in parts:
                return None  # a line repeated (or two engines' samples in one sum): the loop adds
            parts[(slot.ident, part, slot.le)] = i
            by_ident.setdefault(slot.ident, []).append(i)
            if part == _PART_VALUE:
                if slot.logical.kind is Kind.COUNTER:
                    nonneg.append(i)
            elif part == _PART_SUM:
                signed.append(i)
            else:
                nonneg.append(i)
        keys = [ident[0] for ident in by_ident]
        if len(set(keys)) != len(keys):
            return None  # aliases or engines of one series: folded by rank and summed
        for (key, rank, engine), positions in by_ident.items():
            slot = plan.slots[positions[0]]
            if slot.part == _PART_VALUE:
                if len(positions) != 1:
                    return None
                into = plan.counters if slot.logical.kind is Kind.COUNTER else plan.gauges
                into.append((key, positions[0]))
                continue
            point = snap.histograms.get(key)
            if point is None:
                return None
            finite = sorted((plan.slots[i].le, i) for i in positions if plan.slots[i].part == _PART_BUCKET)
            top = [i for le, i in finite if le == math.inf]
            finite = [(le, i) for le, i in finite if le != math.inf]
            count = parts.get(((key, rank, engine), _PART_COUNT, math.nan), -1)
            total = parts.get(((key, rank, engine), _PART_SUM, math.nan), -1)
            if not top and count < 0:
                return None
            bucket_positions = [i for _, i in finite] + (top or [count])
            if tuple(le for le, _ in finite) != point.bounds:
                return None
            plan.histograms.append((key, point.bounds, _picker(bucket_positions), total, count))
        # the snapshot must be what these positions give, in its order: else the loop reads it
        if [k for k, _ in plan.counters] != list(snap.counters) or [h[0] for h in plan.histograms] != list(
            snap.histograms
        ):
            return None
        busy = [k for k in snap.gauges if k.metric == BUSY]
        if [k for k, _ in plan.gauges] + busy != list(snap.gauges):
            return None
        plan.units = dict(snap.units)
        plan.samples = snap.samples
        plan.nonneg, plan.signed = _picker(nonneg), _picker(signed)
        plan.process_start, plan.created = _picker(starts), _picker(created)
        return plan

    def apply(self, slots: list[_Sample]) -> EngineSnapshot | None:
        values: list[float] = list(map(_value, slots))
        checked = self.nonneg(values)
        if checked and (any(map(math.isnan, checked)) or min(checked) < 0.0 or max(checked) == math.inf):
            return None
        sums = self.signed(values)
        if sums and (any(map(math.isnan, sums)) or min(sums) == -math.inf or max(sums) == math.inf):
            return None
        histograms: dict[SeriesKey, HistogramPoint] = {}
        for key, bounds, pick, total, count in self.histograms:
            cumulative = list(pick(values))
            if not all(map(operator.le, cumulative, cumulative[1:])):
                return None  # buckets going down: the loop names the histogram
            total_value = values[total] if total >= 0 else 0.0
            count_value = values[count] if count >= 0 else cumulative[-1]
            histograms[key] = HistogramPoint(bounds, cumulative, total_value, count_value)
        gauges = {key: values[i] for key, i in self.gauges}
        for key, running in list(gauges.items()):
            if key.metric == "requests_running":
                gauges[SeriesKey(key.model, BUSY, key.labels)] = 1.0 if running > 0 else 0.0
        starts = self.process_start(values)
        process_start = max(starts) if starts else None
        if process_start is None:
            created = [v for v in self.created(values) if math.isfinite(v) and v > 0]
            process_start = min(created) if created else None
        counters = {key: values[i] for key, i in self.counters}
        return EngineSnapshot(counters, gauges, histograms, dict(self.units), self.samples, process_start)


_EXPECTED_TYPE = {Kind.COUNTER: "counter", Kind.GAUGE: "gauge", Kind.HISTOGRAM: "histogram"}


def _check_type(types: dict[str, str], sample_name: str, logical: Logical, line: int) -> None:
    family = family_of(sample_name, types)
    if family is None:
        raise ExpositionError("parse", f"{sample_name} has no # TYPE line; llmslo needs its type to interpret it", line)
    declared = types[family]
    if declared != _EXPECTED_TYPE[logical.kind]:
        raise ExpositionError(
            "parse", f"{family} is declared {declared}, expected {_EXPECTED_TYPE[logical.kind]}", line
        )


def _newest_ranks(keys: Iterable[tuple[SeriesKey, int, str]]) -> dict[SeriesKey, int]:
    """The lowest alias rank (the newest name) seen for each series."""
    best: dict[SeriesKey, int] = {}
    for key, rank, _engine in keys:
        if rank < best.get(key, rank + 1):
            best[key] = rank
    return best


def _fold_scalars(scalars: dict[tuple[SeriesKey, int, str], float], snapshot: EngineSnapshot) -> None:
    best = _newest_ranks(scalars)
    # 0.9-0.11 expose both prefix-cache spellings and count tokens; before 0.9 only the gpu_
    # names existed and counted KV blocks. kv_cache_usage_perc arrived with 0.9.
    new_kv_names = any(k.metric == "kv_cache_usage" and r == 0 for k, r, _ in scalars)
    for (key, rank, _engine), value in scalars.items():
        if rank != best[key]:
            continue
        logical = LOGICAL_BY_NAME[key.metric]
        target = snapshot.counters if logical.kind is Kind.COUNTER else snapshot.gauges
        if key.metric in ("prefix_cache_queries", "prefix_cache_hits"):
            snapshot.units[key] = "tokens" if rank == 0 or new_kv_names else "blocks"
        if key not in target:
            target[key] = value
        elif logical.agg is Agg.MAX:
            target[key] = max(target[key], value)
        else:
            target[key] += value


def _fold_histograms(hists: dict[tuple[SeriesKey, int, str], _HistBuilder], snapshot: EngineSnapshot) -> None:
    best = _newest_ranks(hists)
    for (key, rank, _engine), builder in hists.items():
        if rank != best[key]:
            continue
        point = _to_point(key, builder)
        have = snapshot.histograms.get(key)
        if have is None:
            snapshot.histograms[key] = point
            continue
        if have.bounds != point.bounds:
            raise ExpositionError(
                "parse",
                f"{key.metric} for model {key.model}: engines expose different bucket bounds",
                builder.first_line,
            )
        have.cumulative = [a + b for a, b in zip(have.cumulative, point.cumulative, strict=True)]
        have.sum += point.sum
        have.count += point.count


def _to_point(key: SeriesKey, b: _HistBuilder) -> HistogramPoint:
    inf_count = b.buckets.pop(math.inf, None)
    if inf_count is None:
        if math.isnan(b.count):
            raise ExpositionError(
                "parse",
                f"histogram {key.metric} ({key.model}) has neither a +Inf bucket nor _count",
                b.first_line,
            )
        inf_count = b.count
    count = inf_count if math.isnan(b.count) else b.count
    bounds = tuple(sorted(b.buckets))
    cumulative = [b.buckets[x] for x in bounds]
    cumulative.append(inf_count)
    for i in range(1, len(cumulative)):
        if cumulative[i] < cumulative[i - 1]:
            where = bounds[i] if i < len(bounds) else "+Inf"
            raise ExpositionError(
                "parse",
                f"histogram {key.metric} ({key.model}): bucket counts decrease at le={where}",
                b.first_line,
            )
    return HistogramPoint(bounds, cumulative, 0.0 if math.isnan(b.sum) else b.sum, count)

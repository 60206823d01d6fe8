"""Canary and version comparison: two populations of the fleet's engine rollups over the same
window, each metric's difference with a bootstrap confidence interval, a verdict per metric and
overall, suitable as a deployment gate (Kayenta's question: is the candidate worse than the
baseline by more than we tolerate, and are we sure?).

Populations are chosen by selectors: `target=a,b`, `model=NAME`, `deployment=NAME` (the
inventory) or `label.KEY=VALUE` (a target label, e.g. `label.track=canary`).

Latency quantiles come from vLLM's histograms (interpolated inside a bucket, as everywhere in
llmslo); their confidence intervals come from resampling each population's bucket counts
(multinomial bootstrap, 1,000 draws, fixed seed: the same data always gives the same verdict). The
error ratio's interval is the bootstrap of two binomials. Length, finish-reason and cache
differences are reported with their distances but do not gate.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from scipy.stats import mannwhitneyu

from collector.analytics.percentiles import histogram_quantile
from collector.drift.engine import Population, compare
from collector.drift.stats import decumulate
from collector.rollup import Row, add_counts
from collector.sources.vllm import BUSY, Kind
from collector.traces.normalize import SHADOW
from collector.traces.rollup import LENGTH_BOUNDS, RequestCell, RequestKey
from collector.traces.sketch import MIN_VALUE, Sketch, upper_bound

if TYPE_CHECKING:
    from collector.config import CompareConfig

COMPARE_METRICS = ("ttft", "tpot", "e2e", "request_success", "prompt_length", "generation_length",
                   "prefix_cache_hits", "prefix_cache_queries", "generation_tokens", BUSY)  # fmt: skip
LATENCIES = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "e2e latency"}
ERRORS = ("abort", "error")
DRAWS = 1000


class SelectorError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Selector:
    kind: str  # target | model | deployment | label | track | tenant | business_type | shadow
    key: str
    values: frozenset[str]
    text: str

    @classmethod
    def parse(cls, text: str) -> Selector:
        name, sep, value = text.partition("=")
        name = name.strip(" \t")  # only blanks: any other character belongs to a label key
        if not sep or not value.strip():
            raise SelectorError(
                f"selector {text!r}: expected target=A,B | model=NAME | deployment=NAME | track=NAME | label.KEY=VALUE"
            )
        values = frozenset(v.strip() for v in value.split(",") if v.strip())
        if name in ("target", "model", "deployment", "track", "tenant", "business_type"):
            return cls(name, "", values, text)
        if name == "shadow":
            if not values <= {"true", "false"}:
                raise SelectorError(f"selector {text!r}: shadow=true or shadow=false")
            return cls(name, "", values, text)
        if name.startswith("label.") and len(name) > 6:
            return cls("label", name[6:], values, text)
        raise SelectorError(
            f"selector {text!r}: unknown key {name!r} "
            "(target, model, deployment, track, label.KEY; from spans: tenant, business_type, shadow)"
        )

    @property
    def on_spans(self) -> bool:
        """Whether gateway spans can be chosen by it (they carry model, tenant, business type, track)."""
        return self.kind in ("model", "track", "tenant", "business_type", "shadow")

    @property
    def on_engines(self) -> bool:
        return self.kind in ("target", "model", "deployment", "label", "track", "business_type")

    def matches_span(self, key: RequestKey) -> bool:
        """A span rollup's key. Shadow spans are chosen only by `shadow=true`."""
        shadow = key.measured_at == SHADOW
        if self.kind == "shadow":
            return shadow == ("true" in self.values)
        if shadow:
            return False
        fields = {"model": key.model, "tenant": key.tenant, "business_type": key.business_type, "track": key.track}
        return fields[self.kind] in self.values

    def matches(
        self, target: str, model: str, labels: dict[str, str], deployment: str | None, track_label: str = "track"
    ) -> bool:
        """An engine's series: `track=` reads the target's track label (traces.track_label)."""
        if self.kind == "target":
            return target in self.values
        if self.kind == "model":
            return model in self.values
        if self.kind == "deployment":
            return deployment in self.values
        if self.kind == "track":
            return labels.get(track_label) in self.values
        return labels.get(self.key) in self.values


@dataclass(slots=True)
class Side:
    """What one population did over the window."""

    hist: dict[str, dict[tuple[float, ...], list[float]]] = field(default_factory=dict)  # de-cumulated
    finish: dict[str, float] = field(default_factory=dict)
    lengths: dict[str, Population] = field(default_factory=dict)
    hits: float = 0.0
    queried: float = 0.0
    generated: float = 0.0
    replica_seconds: float = 0.0
    targets: set[str] = field(default_factory=set)
    counted: tuple[float, float] = (0.0, 0.0)  # spans: (requests, errors) as the spans report them
    sketches: dict[str, Sketch] = field(default_factory=dict)

    @property
    def requests(self) -> float:
        return self.counted[0] if self.counted[0] else sum(self.finish.values())

    @property
    def errors(self) -> float:
        if self.counted[0]:
            return self.counted[1]
        return sum(v for k, v in self.finish.items() if k in ERRORS)


def collect(rows: Iterable[Row], choose: Callable[[str, str], bool], side: Side | None = None) -> Side:
    """The engine rows that `choose` takes (by target and model), added into `side` (a new one
    with None): a long range is read and added a piece at a time (`Runtime.compare`)."""
    side = Side() if side is None else side
    for r in rows:
        ident, cell = r.cell.ident, r.cell.cell
        if not choose(r.cell.target, ident.key.model):
            continue
        side.targets.add(r.cell.target)
        metric = ident.key.metric
        if ident.kind is Kind.HISTOGRAM and cell.buckets is not None:
            counts = decumulate(cell.buckets)
            if metric in LATENCIES:
                add_counts(side.hist.setdefault(metric, {}), ident.bounds, counts)
            elif metric in ("prompt_length", "generation_length"):
                side.lengths.setdefault(metric, Population()).add(
                    Population(hist={ident.bounds: counts}, total=cell.sum, events=cell.value)
                )
        elif ident.kind is Kind.COUNTER:
            if metric == "request_success":
                reason = dict(ident.key.labels).get("finished_reason", "unknown")
                side.finish[reason] = side.finish.get(reason, 0.0) + cell.value
            elif metric == "prefix_cache_hits":
                side.hits += cell.value
            elif metric == "prefix_cache_queries":
                side.queried += cell.value
            elif metric == "generation_tokens":
                side.generated += cell.value
        elif metric == BUSY:
            side.replica_seconds += cell.observed_seconds
    return side


def collect_spans(rows: Iterable[tuple[RequestKey, RequestCell]], choose: Callable[[RequestKey], bool]) -> Side:
    """One side from gateway span rollups: latencies from their sketches (1 % relative accuracy,
    so the bootstrap resamples what amounts to the requests themselves), errors as the spans
    report them, lengths on the spans' power-of-two bins."""
    side = Side()
    sketches: dict[str, Sketch] = {}
    lengths = {"prompt_length": [0.0] * (len(LENGTH_BOUNDS) + 1), "generation_length": [0.0] * (len(LENGTH_BOUNDS) + 1)}
    tokens = {"prompt_length": 0.0, "generation_length": 0.0}
    for key, cell in rows:
        if not choose(key):
            continue
        side.targets.add(f"{key.model} ({key.measured_at})")
        side.counted = (side.counted[0] + cell.total, side.counted[1] + cell.errors)
        for reason, n in cell.finish.items():
            side.finish[reason] = side.finish.get(reason, 0.0) + n
        for metric in LATENCIES:
            sk = cell.sketches.get(metric)
            if sk is not None:
                sketches.setdefault(metric, Sketch()).merge(sk)
        for i, n in enumerate(cell.input_lengths):
            lengths["prompt_length"][i] += n
        for i, n in enumerate(cell.output_lengths):
            lengths["generation_length"][i] += n
        tokens["prompt_length"] += cell.input_tokens
        tokens["generation_length"] += cell.output_tokens
    side.sketches = sketches
    for metric, counts in lengths.items():
        events = sum(counts)
        if events:
            side.lengths[metric] = Population(hist={LENGTH_BOUNDS: counts}, total=tokens[metric], events=events)
    return side


def align_sketches(a: Side, b: Side) -> None:
    """Put both sides' latency sketches on one bucket layout (the union of their buckets), as
    the histogram comparison needs."""
    for metric in LATENCIES:
        sa, sb = a.sketches.get(metric), b.sketches.get(metric)
        if sa is None or sb is None:
            continue
        present = set(sa.buckets) | set(sb.buckets)
        # each bucket with its lower edge as a bound, so interpolation stays inside the bucket
        indexes = sorted(present | {i - 1 for i in present})
        bounds = (MIN_VALUE, *(upper_bound(i) for i in indexes))
        for side, sk in ((a, sa), (b, sb)):
            counts = [float(sk.zeros), *(float(sk.buckets.get(i, 0)) for i in indexes), 0.0]  # + the +Inf bucket
            side.hist[metric] = {bounds: counts}


@dataclass(frozen=True, slots=True)
class MetricResult:
    name: str  # "ttft_p95", "error_ratio", ...
    baseline: float | None
    candidate: float | None
    change: float | None  # relative (latency) or absolute (ratios), candidate vs baseline
    ci: tuple[float, float] | None  # 95 % interval of `change`
    relative: bool
    tolerance: float | None  # None: reported, not gated
    verdict: str  # pass | hold | rollback | info
    text: str
    p_value: float | None = None
    # the change the histogram buckets allow: each side's quantile anywhere in its bucket (None:
    # exact data, or an open-ended bucket). Interpolation places a quantile inside its bucket; a
    # bootstrap interval cannot be wider than that guess, so this range is shown beside it.
    bucket_range: tuple[float | None, float | None] | None = None


@dataclass(frozen=True, slots=True)
class Comparison:
    baseline: str
    candidate: str
    window_seconds: float
    baseline_requests: float
    candidate_requests: float
    metrics: list[MetricResult]
    verdict: str  # promote | hold | rollback
    reason: str
    source: str = "engines"  # engines (vLLM's histograms) | spans (gateway span rollups)


def _merged(hists: dict[tuple[float, ...], list[float]]) -> tuple[tuple[float, ...], np.ndarray] | None:
    """One layout per side (the most used one): quantiles are never mixed across layouts."""
    if not hists:
        return None
    bounds = max(hists, key=lambda b: sum(hists[b]))
    return bounds, np.asarray(hists[bounds], dtype=float)


def _quantile(bounds: Sequence[float], counts: np.ndarray, q: float) -> float | None:
    est = histogram_quantile(q, bounds, np.cumsum(counts).tolist())
    return None if est is None else est.value


def _bucket_range(
    bounds: Sequence[float], ca: np.ndarray, cb: np.ndarray, q: float
) -> tuple[float | None, float | None]:
    """The relative change of the q-quantile from side a to side b that their buckets allow."""
    ea = histogram_quantile(q, bounds, np.cumsum(ca).tolist())
    eb = histogram_quantile(q, bounds, np.cumsum(cb).tolist())
    if ea is None or eb is None:
        return None, None
    low = eb.lower_bound / ea.upper_bound - 1 if math.isfinite(ea.upper_bound) and ea.upper_bound > 0 else None
    high = eb.upper_bound / ea.lower_bound - 1 if math.isfinite(eb.upper_bound) and ea.lower_bound > 0 else None
    return low, high


def _pct(x: float) -> str:
    return f"{x * 100:+.0f} %"


def _latency(
    metric: str, q: float, base: Side, cand: Side, tolerance: float, min_requests: float, rng: np.random.Generator
) -> MetricResult:
    name = f"{metric}_p{int(q * 100)}"
    label = f"{LATENCIES[metric]} p{int(q * 100)}"
    a, b = _merged(base.hist.get(metric, {})), _merged(cand.hist.get(metric, {}))
    if a is None or b is None or a[0] != b[0]:
        why = "no data" if a is None or b is None else "different bucket layouts"
        return MetricResult(name, None, None, None, None, True, tolerance, "hold", f"{label}: {why}")
    bounds, ca = a
    cb = b[1]
    na, nb = ca.sum(), cb.sum()
    qa, qb = _quantile(bounds, ca, q), _quantile(bounds, cb, q)
    if qa is None or qb is None or qa <= 0:
        return MetricResult(name, qa, qb, None, None, True, tolerance, "hold", f"{label}: no data")
    change = qb / qa - 1
    if na < min_requests or nb < min_requests:
        return MetricResult(
            name, qa, qb, change, None, True, tolerance, "hold",
            f"{label} {_pct(change)}: not enough data ({nb:.0f} vs {na:.0f} requests, need {min_requests:.0f})",
        )  # fmt: skip
    # Resample requests, not observations: vLLM's per-token histograms (TPOT, ITL) count every
    # output token, and the tokens of one request are not independent draws. Resampling as many
    # observations as there are tokens would make the interval look ten-thousand-fold surer than
    # the requests behind it allow; as many as there are requests is the honest sample size.
    draws_a = rng.multinomial(_sample_size(na, base), ca / na, size=DRAWS)
    draws_b = rng.multinomial(_sample_size(nb, cand), cb / nb, size=DRAWS)
    changes = []
    for da, db in zip(draws_a, draws_b, strict=True):
        x, y = _quantile(bounds, da, q), _quantile(bounds, db, q)
        if x and y is not None:
            changes.append(y / x - 1)
    lo, hi = (float(v) for v in np.percentile(changes, [2.5, 97.5]))
    mids = _midpoints(bounds)
    p = float(mannwhitneyu(np.repeat(mids, cb.astype(int)), np.repeat(mids, ca.astype(int))).pvalue)
    verdict = "rollback" if lo > tolerance else "pass" if hi <= tolerance else "hold"
    allowed = _bucket_range(bounds, ca, cb, q)
    within = ""
    if allowed[0] is not None and allowed[1] is not None and allowed[1] - allowed[0] > max(0.05, 2 * (hi - lo)):
        within = f"; its buckets allow {_pct(allowed[0])}..{_pct(allowed[1])}"  # coarse buckets: say so
    text = (
        f"{label} {_pct(change)} (CI {_pct(lo)}..{_pct(hi)}; {qa:.3g} s → {qb:.3g} s, tolerance {_pct(tolerance)}"
        f"{within})"
    )
    return MetricResult(name, qa, qb, change, (lo, hi), True, tolerance, verdict, text, p, allowed)


def _sample_size(observations: float, side: Side) -> int:
    """Observations to draw per bootstrap resample: at most one per request of the side."""
    return int(min(observations, side.requests) if side.requests > 0 else observations)


def _midpoints(bounds: Sequence[float]) -> np.ndarray:
    edges = [0.0, *bounds]
    mids = [(lo + hi) / 2 for lo, hi in itertools.pairwise(edges)]
    mids.append(bounds[-1] * 1.5 if bounds else 1.0)
    return np.asarray(mids)


def _error_ratio(
    base: Side, cand: Side, tolerance: float, min_requests: float, rng: np.random.Generator
) -> MetricResult:
    na, nb = base.requests, cand.requests
    if na <= 0 or nb <= 0:
        return MetricResult("error_ratio", None, None, None, None, False, tolerance, "hold", "error ratio: no data")
    ra, rb = base.errors / na, cand.errors / nb
    change = rb - ra
    if na < min_requests or nb < min_requests:
        return MetricResult("error_ratio", ra, rb, change, None, False, tolerance, "hold",
                            f"error ratio {change * 100:+.2f} points: not enough data")  # fmt: skip
    diffs = rng.binomial(int(nb), rb, DRAWS) / nb - rng.binomial(int(na), ra, DRAWS) / na
    lo, hi = (float(v) for v in np.percentile(diffs, [2.5, 97.5]))
    verdict = "rollback" if lo > tolerance else "pass" if hi <= tolerance else "hold"
    text = (
        f"error ratio {ra:.2%} → {rb:.2%} ({change * 100:+.2f} points, CI {lo * 100:+.2f}..{hi * 100:+.2f}, "
        f"tolerance {tolerance * 100:+.2f})"
    )
    return MetricResult("error_ratio", ra, rb, change, (lo, hi), False, tolerance, verdict, text)


def _info(base: Side, cand: Side) -> list[MetricResult]:
    out = []
    for metric in ("prompt_length", "generation_length"):
        a, b = base.lengths.get(metric), cand.lengths.get(metric)
        if a is None or b is None:
            continue
        d = compare(a, b)
        if d is None:
            continue
        ma = a.total / a.events if a.events else None
        mb = b.total / b.events if b.events else None
        text = f"{metric.replace('_', ' ')}: PSI {d.psi:.2f}" + (
            f", mean {ma:.0f} → {mb:.0f} tokens" if ma is not None and mb is not None else ""
        )
        out.append(MetricResult(f"{metric}_psi", None, None, d.psi, None, False, None, "info", text))
    reasons = sorted(set(base.finish) | set(cand.finish))
    if reasons and base.requests and cand.requests:
        d = compare(Population(cats=dict(base.finish)), Population(cats=dict(cand.finish)))
        if d is not None:
            mix = ", ".join(
                f"{k} {base.finish.get(k, 0) / base.requests:.0%} → {cand.finish.get(k, 0) / cand.requests:.0%}"
                for k in reasons
            )
            out.append(
                MetricResult(
                    "finish_reason_psi", None, None, d.psi, None, False, None, "info", f"finish reasons: {mix}"
                )
            )
    if base.queried > 0 and cand.queried > 0:
        ha, hb = base.hits / base.queried, cand.hits / cand.queried
        out.append(MetricResult("prefix_cache_hit_ratio", ha, hb, hb - ha, None, False, None, "info",
                                f"prefix-cache hit ratio {ha:.0%} → {hb:.0%}"))  # fmt: skip
    if base.replica_seconds > 0 and cand.replica_seconds > 0:
        ta, tb = base.generated / base.replica_seconds, cand.generated / cand.replica_seconds
        change = tb / ta - 1 if ta > 0 else None
        out.append(MetricResult("tokens_per_second_per_replica", ta, tb, change, None, True, None, "info",
                                f"generated tokens/s per replica {ta:.1f} → {tb:.1f}"))  # fmt: skip
    return out


@dataclass(frozen=True, slots=True)
class Tolerances:
    latency_p95: float = 0.10  # candidate's p95 may be up to 10 % slower
    latency_p50: float = 0.10
    error_ratio: float = 0.005  # half a percentage point more errors
    min_requests: float = 100.0


def tolerances(
    config: CompareConfig,
    p95: float | None = None,
    p50: float | None = None,
    errors: float | None = None,
    min_requests: int | None = None,
) -> Tolerances:
    """The configured tolerances (a `CompareConfig`) with the given ones in their place."""
    return Tolerances(
        config.latency_p95 if p95 is None else p95,
        config.latency_p50 if p50 is None else p50,
        config.error_ratio if errors is None else errors,
        float(config.min_requests if min_requests is None else min_requests),
    )


def compare_sides(
    baseline: Side,
    candidate: Side,
    names: tuple[str, str],
    window: float,
    tol: Tolerances = Tolerances(),
    source: str = "engines",
) -> Comparison:
    rng = np.random.default_rng(12345)
    results = []
    for metric in LATENCIES:
        for q, t in ((0.95, tol.latency_p95), (0.5, tol.latency_p50)):
            results.append(_latency(metric, q, baseline, candidate, t, tol.min_requests, rng))
    results.append(_error_ratio(baseline, candidate, tol.error_ratio, tol.min_requests, rng))
    results += _info(baseline, candidate)
    gated = [r for r in results if r.verdict != "info" and not r.text.endswith(": no data")]
    rollback = [r for r in gated if r.verdict == "rollback"]
    hold = [r for r in gated if r.verdict == "hold"]
    if candidate.requests < tol.min_requests or baseline.requests < tol.min_requests:
        verdict = "hold"
        reason = (
            f"hold: not enough data ({candidate.requests:.0f} candidate and {baseline.requests:.0f} baseline "
            f"requests, need {tol.min_requests:.0f} each)"
        )
    elif rollback:
        verdict, reason = "rollback", "rollback: " + "; ".join(r.text for r in rollback)
    elif hold:
        verdict, reason = "hold", "hold: inconclusive: " + "; ".join(r.text for r in hold)
    elif not gated:
        verdict, reason = "hold", "hold: no latency or error data to compare"
    else:
        verdict, reason = "promote", "promote: every gated metric within tolerance"
    return Comparison(
        names[0], names[1], window, baseline.requests, candidate.requests, results, verdict, reason, source
    )

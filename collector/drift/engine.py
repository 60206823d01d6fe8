"""Workload drift: for each business type (and, from gateway spans, each busy tenant), the
current window of each signal against a reference, with thresholds calibrated on the
reference's own variability.

Signals (engine rollups, all replicas of a business type merged):
    prompt_length, generation_length        vLLM's token histograms (1-2-5 buckets)
    queue_time, prefill_time, decode_time   the latency stages, for "what changed" in an incident
    finish_reason                           the mix (a rise of `length` = outputs hitting max_tokens)
    prefix_cache                            hit / miss shares of the queried prompt tokens
    model_mix                               requests per model within the business type
and from spans, per tenant: prompt_length and generation_length on power-of-two bins.

Reference (`drift.reference`): `trailing` = the `reference_length` before the current window;
`hour_of_week` = the same window's hours over the previous `weeks` weeks. Thresholds (NannyML's
method): the statistic of every window-sized chunk of the reference against the whole reference,
alert above mean + 3 sigma; with fewer than 10 chunks holding `min_events`, the fixed default
(PSI 0.25, Evidently's and credit scoring's "major shift"). A window with fewer than `min_events`
requests is not judged (a quiet tenant never alerts).

The reference is rebuilt every `refresh` (it moves slowly); each pass reads only the current
window's rows, so a pass costs the same whatever the reference length.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from collector.analytics.percentiles import histogram_quantile
from collector.drift.stats import Distances, common_bounds, decumulate, distances, psi, rebin
from collector.rollup import MINUTE_SECONDS, Row, add_counts, period_start
from collector.sources.vllm import Kind
from collector.traces.rollup import LENGTH_BOUNDS, RequestCell, RequestKey

HIST_SIGNALS = {
    "prompt_length": ("prompt_length", "tokens"),
    "generation_length": ("generation_length", "tokens"),
    "queue_time": ("queue", "seconds"),
    "prefill_time": ("prefill", "seconds"),
    "decode_time": ("decode", "seconds"),
}
CATEGORY_SIGNALS = ("finish_reason", "prefix_cache", "model_mix")
SIGNALS = (*HIST_SIGNALS, *CATEGORY_SIGNALS)
DRIFT_METRICS = ("prompt_length", "generation_length", "queue", "prefill", "decode", "request_success",
                 "prefix_cache_hits", "prefix_cache_queries")  # fmt: skip
DEFAULT_PSI = 0.25
MIN_CHUNKS = 10
ALL_TENANTS = ""


@dataclass(slots=True)
class Population:
    """One signal of one group over some minutes: bins per histogram layout, or categories."""

    hist: dict[tuple[float, ...], list[float]] = field(default_factory=dict)  # de-cumulated counts
    cats: dict[str, float] = field(default_factory=dict)
    total: float = 0.0  # sum of observed values (histograms), for the exact mean
    events: float = 0.0  # requests behind it (the minimum-events gate)

    def add(self, other: Population) -> None:
        for bounds, counts in other.hist.items():
            add_counts(self.hist, bounds, counts)
        for k, v in other.cats.items():
            self.cats[k] = self.cats.get(k, 0.0) + v
        self.total += other.total
        self.events += other.events

    def count(self) -> float:
        return sum(sum(c) for c in self.hist.values()) if self.hist else sum(self.cats.values())


def merge_all(pops: Iterable[Population]) -> Population:
    out = Population()
    for p in pops:
        out.add(p)
    return out


Group = tuple[str, str]  # (business type, tenant or "" for the engine view of all traffic)
Minutes = dict[Group, dict[int, dict[str, Population]]]


SIGNAL_OF_METRIC = {metric: signal for signal, (metric, _unit) in HIST_SIGNALS.items()}


def engine_minutes(rows: Iterable[Row], place: Callable[[str, str], str | None]) -> Minutes:
    """Per business type and minute (hour cells count at their hour's start), each signal's
    population. Each row is added where it belongs without a Population of its own: a drift
    pass at a thousand targets reads ~30,000 rows (the settled minute and the two open ones)."""
    out: Minutes = defaultdict(lambda: defaultdict(dict))
    placed: dict[tuple[str, str], str | None] = {}
    reasons: dict[tuple[tuple[str, str], ...], str] = {}  # request_success's labels -> its reason
    for r in rows:
        ident, cell = r.cell.ident, r.cell.cell
        key = (r.cell.target, ident.key.model)
        if key not in placed:
            placed[key] = place(*key)
        bt = placed[key]
        if bt is None:
            continue
        signals = out[(bt, ALL_TENANTS)][r.start_unix]
        metric = ident.key.metric
        kind = ident.kind
        if kind is Kind.HISTOGRAM:
            signal = SIGNAL_OF_METRIC.get(metric)
            if signal is None or cell.buckets is None:
                continue
            pop = signals.get(signal)
            if pop is None:
                pop = signals[signal] = Population()
            add_counts(pop.hist, ident.bounds, decumulate(cell.buckets))
            pop.total += cell.sum
            pop.events += cell.value
        elif kind is Kind.COUNTER and cell.value > 0:
            value = cell.value
            if metric == "request_success":
                labels = ident.key.labels
                reason = reasons.get(labels)
                if reason is None:
                    reason = reasons[labels] = dict(labels).get("finished_reason", "unknown")
                for signal, category in (("finish_reason", reason), ("model_mix", ident.key.model)):
                    pop = signals.get(signal)
                    if pop is None:
                        pop = signals[signal] = Population()
                    pop.cats[category] = pop.cats.get(category, 0.0) + value
                    pop.events += value
            elif metric == "prefix_cache_hits" or metric == "prefix_cache_queries":
                pop = signals.get("prefix_cache")
                if pop is None:
                    pop = signals["prefix_cache"] = Population()
                category = "hit" if metric == "prefix_cache_hits" else "queried"
                pop.cats[category] = pop.cats.get(category, 0.0) + value
    prefix_cache_shares(out)
    return out


def prefix_cache_shares(minutes: Minutes) -> None:
    """Each minute's prefix-cache counts (hit and queried tokens) as hit and miss shares, with
    the minute's requests as its events (in place)."""
    for by_minute in minutes.values():
        for signals in by_minute.values():
            pc = signals.get("prefix_cache")
            if pc is not None:
                hit, queried = pc.cats.get("hit", 0.0), pc.cats.get("queried", 0.0)
                pc.cats = {"hit": min(hit, queried), "miss": max(0.0, queried - hit)}
                pc.events = signals["finish_reason"].events if "finish_reason" in signals else 0.0


def span_minutes(rows: Iterable[tuple[RequestKey, RequestCell]], tenants: set[str] | None = None) -> Minutes:
    """Per (business type, tenant) and minute, the span length histograms (power-of-two bins)."""
    out: Minutes = defaultdict(lambda: defaultdict(dict))
    bounds = LENGTH_BOUNDS
    for key, cell in rows:
        if tenants is not None and key.tenant not in tenants:
            continue
        signals = out[(key.business_type, key.tenant)][key.start_unix]
        for signal, lengths in (("prompt_length", cell.input_lengths), ("generation_length", cell.output_lengths)):
            tokens = cell.input_tokens if signal == "prompt_length" else cell.output_tokens
            signals.setdefault(signal, Population()).add(
                Population(hist={bounds: [float(x) for x in lengths]}, total=float(tokens), events=float(cell.total))
            )
        signals.setdefault("finish_reason", Population()).add(
            Population(cats={k: float(v) for k, v in cell.finish.items()}, events=float(cell.total))
        )
    return out


def aligned(ref: Population, cur: Population) -> tuple[list[float], list[float], tuple[float, ...] | None] | None:
    """Both populations on the same bins: histograms on the bounds every layout shares (never
    compared across layouts), categories on the union of their keys."""
    if ref.hist or cur.hist:
        layouts = list(ref.hist) + list(cur.hist)
        common = common_bounds(layouts)
        r = [0.0] * (len(common) + 1)
        c = [0.0] * (len(common) + 1)
        for bounds, counts in ref.hist.items():
            r = [a + b for a, b in zip(r, rebin(bounds, counts, common), strict=True)]
        for bounds, counts in cur.hist.items():
            c = [a + b for a, b in zip(c, rebin(bounds, counts, common), strict=True)]
        return r, c, common
    keys = sorted(set(ref.cats) | set(cur.cats))
    if not keys:
        return None
    return [ref.cats.get(k, 0.0) for k in keys], [cur.cats.get(k, 0.0) for k in keys], None


def compare(ref: Population, cur: Population) -> Distances | None:
    a = aligned(ref, cur)
    if a is None or sum(a[0]) <= 0 or sum(a[1]) <= 0:
        return None
    return distances(a[0], a[1], a[2])


@dataclass(frozen=True, slots=True)
class Threshold:
    psi: float
    calibrated: bool  # mean + 3 sigma over `chunks` reference chunks, else the fixed default
    chunks: int
    chunk_mean: float | None = None
    chunk_std: float | None = None


def calibrate(ref: Population, chunks: Sequence[Population], min_events: float) -> Threshold:
    values = []
    for chunk in chunks:
        if chunk.events < min_events:
            continue
        a = aligned(ref, chunk)  # only the PSI gates: the other distances are not computed here
        if a is not None and sum(a[0]) > 0 and sum(a[1]) > 0:
            values.append(psi(a[0], a[1]))
    if len(values) < MIN_CHUNKS:
        return Threshold(DEFAULT_PSI, False, len(values))
    mean, std = statistics.fmean(values), statistics.pstdev(values)
    return Threshold(mean + 3 * std, True, len(values), mean, std)


@dataclass(frozen=True, slots=True)
class Finding:
    business_type: str
    tenant: str  # "" = all traffic (engine)
    signal: str
    window_seconds: float
    events: float
    reference_events: float
    distances: Distances
    threshold: Threshold
    drifted: bool
    started_unix: int | None
    summary: str


@dataclass(slots=True)
class Reference:
    built_unix: float
    start: int
    end: int
    totals: dict[tuple[Group, str], Population]
    thresholds: dict[tuple[Group, str], Threshold]


def _quantile(pop: Population, q: float) -> float | None:
    best = None
    for bounds, counts in pop.hist.items():
        cum: list[float] = []
        running = 0.0
        for c in counts:
            running += c
            cum.append(running)
        est = histogram_quantile(q, bounds, cum)
        if est is not None:
            best = est.value if best is None else max(best, est.value)
    return best


def _share_above(pop: Population, level: float) -> float | None:
    """Share of observations in bins lying wholly above `level` (a bucket bound)."""
    above = total = 0.0
    for bounds, counts in pop.hist.items():
        for lower, c in zip([0.0, *bounds], counts, strict=True):
            total += c
            if lower >= level:
                above += c
    return above / total if total > 0 else None


def explain(group: Group, signal: str, ref: Population, cur: Population, d: Distances, t: Threshold,
            started: int | None) -> str:  # fmt: skip
    """One line a person reads: what moved, by how much, since when. `cur` is the shifted part
    (the minutes since the shift started, when dated), the statistics are the window's."""
    bt, tenant = group
    who = f"{bt}" + (f" tenant {tenant}" if tenant else "")
    words = signal.replace("_", " ")
    parts: list[str] = []
    if signal in HIST_SIGNALS:
        unit = HIST_SIGNALS[signal][1]
        r50, c50 = _quantile(ref, 0.5), _quantile(cur, 0.5)

        def fmt(x: float) -> str:
            return f"{x:,.0f} tokens" if unit == "tokens" else f"{x:.3g} s"

        if r50 is not None and c50 is not None:
            ratio = f" (×{c50 / r50:.1f})" if r50 > 0 else ""
            parts.append(f"p50 {fmt(r50)} → {fmt(c50)}{ratio}")
        if ref.events > 0 and cur.events > 0 and ref.total > 0:
            parts.append(f"mean {fmt(ref.total / ref.events)} → {fmt(cur.total / cur.events)}")
        r95 = _quantile(ref, 0.95)
        if r95:
            level = next((b for bounds in ref.hist for b in bounds if b >= r95), r95)
            share_now, share_before = _share_above(cur, level), _share_above(ref, level)
            if share_now is not None and share_before is not None and abs(share_now - share_before) >= 0.02:
                parts.append(f"{share_now:.0%} of requests now above {fmt(level)} (was {share_before:.0%})")
        if signal == "prompt_length":
            p95_ref, p95_cur = _quantile(ref, 0.95), _quantile(cur, 0.95)
            if p95_ref and p95_cur:
                parts.append(f"KV-cache need at p95 context ×{p95_cur / p95_ref:.1f}")
    else:
        r_total, c_total = sum(ref.cats.values()), sum(cur.cats.values())
        moves = []
        for k in sorted(set(ref.cats) | set(cur.cats)):
            before = ref.cats.get(k, 0.0) / r_total if r_total else 0.0
            now = cur.cats.get(k, 0.0) / c_total if c_total else 0.0
            if abs(now - before) >= 0.02:
                moves.append((abs(now - before), f"{k} {before:.0%} → {now:.0%}"))
        parts.extend(text for _, text in sorted(moves, reverse=True)[:3])
    limit = f"threshold {t.psi:.2g}" + (" (calibrated)" if t.calibrated else " (default)")
    parts.append(f"PSI {d.psi:.2f} vs {limit}, JS {d.js:.2f}")
    if started is not None:
        parts.append("started " + time.strftime("%H:%M UTC", time.gmtime(started)))
    return f"{who} {words} " + ", ".join(parts)


def window_sum(minutes: dict[int, dict[str, Population]], signal: str, start: int, end: int) -> Population:
    return merge_all(sigs[signal] for m, sigs in minutes.items() if start <= m < end and signal in sigs)


def build_reference(
    minutes: Minutes, ranges: Sequence[tuple[int, int]], window: int, min_events: float, now: float
) -> Reference:
    """The reference over `ranges` (one for a trailing reference, one per week for the same hour
    of week), and each (group, signal)'s threshold from its window-sized chunks."""
    totals: dict[tuple[Group, str], Population] = {}
    chunks: dict[tuple[Group, str], dict[tuple[int, int], Population]] = defaultdict(dict)
    for group, by_minute in minutes.items():
        for m, sigs in by_minute.items():
            for i, (lo, hi) in enumerate(ranges):
                if not lo <= m < hi:
                    continue
                chunk = (i, (m - lo) // window)
                complete = lo + (chunk[1] + 1) * window <= hi
                for signal, pop in sigs.items():
                    totals.setdefault((group, signal), Population()).add(pop)
                    if complete:
                        chunks[(group, signal)].setdefault(chunk, Population()).add(pop)
                break
    thresholds = {
        key: calibrate(total, list(chunks.get(key, {}).values()), min_events) for key, total in totals.items()
    }
    return Reference(now, ranges[0][0], ranges[-1][1], totals, thresholds)


def findings(
    reference: Reference,
    minutes: Minutes,
    start: int,
    end: int,
    min_events: float,
) -> list[Finding]:
    """Each (group, signal) of the current window [start, end) against the reference. `minutes`
    may reach further back than `start`: the extra minutes date the shift's start."""
    out = []
    for group, by_minute in minutes.items():
        signals = {s for m, sigs in by_minute.items() if start <= m < end for s in sigs}
        for signal in sorted(signals):
            ref = reference.totals.get((group, signal))
            if ref is None or ref.events < min_events:
                continue
            cur = window_sum(by_minute, signal, start, end)
            if cur.events < min_events:
                continue
            d = compare(ref, cur)
            if d is None:
                continue
            t = reference.thresholds[(group, signal)]
            drifted = d.psi > t.psi
            started = _started(ref, by_minute, signal, end, t.psi) if drifted else None
            shifted = window_sum(by_minute, signal, started, end) if started is not None else cur
            summary = explain(group, signal, ref, shifted, d, t, started)
            out.append(
                Finding(
                    group[0], group[1], signal, end - start, cur.events, ref.events, d, t, drifted, started, summary
                )
            )
    return out


def _started(
    ref: Population, by_minute: dict[int, dict[str, Population]], signal: str, end: int, psi: float
) -> int | None:
    """The first minute of the run of minutes, back from now, whose own distribution is beyond
    the threshold (minutes with too few events to say are skipped, not run-breaking)."""
    started = None
    for m in sorted((m for m in by_minute if m < end), reverse=True):
        pop = by_minute[m].get(signal)
        if pop is None or pop.events < 20:
            continue
        d = compare(ref, pop)
        if d is None or d.psi <= psi:
            break
        started = m
    return started


def current_bounds(now: float, window_seconds: float) -> tuple[int, int]:
    end = period_start(now) + MINUTE_SECONDS  # the running minute included: drift shows within it
    return end - int(window_seconds), end

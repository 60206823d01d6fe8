"""Distances between two binned distributions, reference and current
(shared/reference/genai-traces-gateways-cost-drift.md section 5.4).

The bins are given by the exporter (vLLM's 1-2-5 token buckets, its latency buckets, a finish
reason each): `counts` are per bin (de-cumulated), the last bin being +Inf for histograms.

- PSI = sum (p_cur - p_ref) ln(p_cur / p_ref), empty bins smoothed to 1e-4 as Evidently does.
  By hand: scipy has no PSI (it is KL(cur||ref) + KL(ref||cur), which `scipy.special.rel_entr`
  sums the same way, so the tests check it against that).
- Jensen-Shannon distance, base 2 (NannyML's and Evidently's): scipy.spatial.distance.jensenshannon.
- KS on bins = max |F_ref - F_cur| at the bucket edges: a lower bound on the exact KS (NannyML's
  "estimated" KS). By hand: scipy's ks_2samp needs the samples, and buckets have none.
- Wasserstein-1 on log values (token counts and latencies are log-spaced, so the tail would
  dominate a linear W1), each bin at its log midpoint (+Inf capped one bin width above the top
  bound), normalised by the reference's standard deviation (Evidently's "normed" W1):
  scipy.stats.wasserstein_distance with the counts as weights.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.spatial.distance import jensenshannon
from scipy.stats import wasserstein_distance

EPSILON = 1e-4


def decumulate(cumulative: Sequence[float]) -> list[float]:
    """Per-bucket counts from cumulative ones (the last is +Inf)."""
    return [cumulative[0], *(b - a for a, b in itertools.pairwise(cumulative))] if cumulative else []


def shares(counts: Sequence[float]) -> list[float]:
    """Counts to shares, empty bins filled with EPSILON (Evidently's smoothing), renormalised."""
    total = sum(counts)
    if total <= 0:
        raise ValueError("no observations")
    raw = [max(c / total, EPSILON) for c in counts]
    norm = sum(raw)
    return [r / norm for r in raw]


def psi(ref: Sequence[float], cur: Sequence[float]) -> float:
    p, q = shares(ref), shares(cur)
    return sum((b - a) * math.log(b / a) for a, b in zip(p, q, strict=True))


def js_distance(ref: Sequence[float], cur: Sequence[float]) -> float:
    # identical distributions can leave a rounding residue just below 0 under scipy's square
    # root (NaN and a RuntimeWarning): that is a distance of 0
    with np.errstate(invalid="ignore"):
        value = float(jensenshannon(list(ref), list(cur), base=2))
    return 0.0 if math.isnan(value) else value


def ks_binned(ref: Sequence[float], cur: Sequence[float]) -> float:
    tr, tc = sum(ref), sum(cur)
    fr = fc = 0.0
    best = 0.0
    for a, b in zip(ref, cur, strict=True):
        fr += a / tr
        fc += b / tc
        best = max(best, abs(fr - fc))
    return best


def log_midpoints(bounds: Sequence[float]) -> list[float]:
    """One log-space point per bin of a histogram with finite upper `bounds` (+ the +Inf bin)."""
    logs = [math.log(max(b, 1e-9)) for b in bounds]
    if not logs:
        return [0.0]
    first_width = logs[1] - logs[0] if len(logs) > 1 else 1.0
    points = [logs[0] - first_width / 2]  # the first bin: (0 or -inf, b0]
    points += [(lo + hi) / 2 for lo, hi in itertools.pairwise(logs)]
    last_width = logs[-1] - logs[-2] if len(logs) > 1 else 1.0
    points.append(logs[-1] + last_width / 2)  # +Inf: half a bin above the top bound
    return points


def wasserstein_log_normed(bounds: Sequence[float], ref: Sequence[float], cur: Sequence[float]) -> float:
    points = log_midpoints(bounds)
    w = float(wasserstein_distance(points, points, u_weights=list(ref), v_weights=list(cur)))
    total = sum(ref)
    mean = sum(x * c for x, c in zip(points, ref, strict=True)) / total
    std = math.sqrt(sum(c * (x - mean) ** 2 for x, c in zip(points, ref, strict=True)) / total)
    return w / max(std, 1e-3)


@dataclass(frozen=True, slots=True)
class Distances:
    psi: float
    js: float
    ks: float | None  # ordered bins only (histograms)
    wasserstein: float | None

    def get(self, name: str) -> float | None:
        value: float | None = getattr(self, name)
        return value


def distances(ref: Sequence[float], cur: Sequence[float], bounds: Sequence[float] | None) -> Distances:
    """All four for a histogram (`bounds` given), PSI and JS for categories (`bounds` None)."""
    if bounds is None:
        return Distances(psi(ref, cur), js_distance(ref, cur), None, None)
    return Distances(
        psi(ref, cur), js_distance(ref, cur), ks_binned(ref, cur), wasserstein_log_normed(bounds, ref, cur)
    )


def rebin(bounds: Sequence[float], counts: Sequence[float], common: Sequence[float]) -> list[float]:
    """Counts of a histogram with `bounds` on the coarser `common` bounds (a subset of them)."""
    out = [0.0] * (len(common) + 1)
    j = 0
    for bound, count in zip([*bounds, math.inf], counts, strict=True):
        while j < len(common) and bound > common[j]:
            j += 1
        out[j] += count
    return out


def common_bounds(layouts: Sequence[Sequence[float]]) -> tuple[float, ...]:
    """The bounds every layout shares: histograms of different layouts are compared only there."""
    if not layouts:
        return ()
    shared = set(layouts[0])
    for layout in layouts[1:]:
        shared &= set(layout)
    return tuple(sorted(shared))

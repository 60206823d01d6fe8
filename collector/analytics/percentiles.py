"""Quantiles from histogram buckets, by the method of PromQL's histogram_quantile.

Each estimate keeps the bucket bounds it fell between: a p95 of 2.2 s from vLLM's (1.0, 2.5]
TTFT bucket only says "between 1 s and 2.5 s", and alerts must not pretend otherwise.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import NamedTuple


class QuantileEstimate(NamedTuple):
    """A quantile and the bounds of the bucket it fell in (a named tuple: the fleet view makes
    tens of thousands of them per read, a frozen dataclass took three times as long to build)."""

    quantile: float
    value: float
    lower_bound: float
    upper_bound: float  # math.inf when the rank fell into the +Inf bucket
    above_top_bound: bool  # value is the highest finite bound; the true quantile is >= it
    below_first_bound: bool = False  # value is the first bound; the true quantile is <= it

    @property
    def text(self) -> str:
        """How a person should read it: '<= 0.3', '>= 60', or '2.2 (1-2.5)' (seconds or tokens)."""
        if self.below_first_bound:
            return f"<= {self.upper_bound:g}"
        if self.above_top_bound:
            return f">= {self.lower_bound:g}"
        return f"{self.value:.3g} ({self.lower_bound:g}-{self.upper_bound:g})"


def histogram_quantile(q: float, bounds: Sequence[float], cumulative: Sequence[float]) -> QuantileEstimate | None:
    """Linear interpolation inside the bucket holding rank q * total.

    `bounds` are the finite upper bounds (ascending); `cumulative` has one more entry, the +Inf
    bucket. Returns None when the histogram holds no observations.
    """
    found = histogram_quantiles((q,), bounds, cumulative)
    return found[0] if found else None


def histogram_quantiles(
    qs: Sequence[float], bounds: Sequence[float], cumulative: Sequence[float]
) -> tuple[QuantileEstimate, ...]:
    """`histogram_quantile` of each of `qs` (empty when the histogram holds no observations):
    the histogram checked once for all of them (a derive pass asks four of each of its
    thousands of histograms)."""
    for q in qs:
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be in [0, 1], got {q}")
    if len(cumulative) != len(bounds) + 1:
        raise ValueError("cumulative must have one entry per bound plus the +Inf bucket")
    total = cumulative[-1]
    if total <= 0 or math.isnan(total):
        return ()
    return tuple(_estimate(q, q * total, bounds, cumulative) for q in qs)


def _estimate(q: float, rank: float, bounds: Sequence[float], cumulative: Sequence[float]) -> QuantileEstimate:
    # the first bucket whose cumulative count reaches the rank (and holds something: for q = 0,
    # the first non-empty one); the counts never decrease, so a binary search finds it
    index = bisect.bisect_left(cumulative, rank) if rank > 0 else bisect.bisect_right(cumulative, 0.0)
    index = min(index, len(cumulative) - 1)
    if index == len(bounds):  # the +Inf bucket
        top = bounds[-1] if bounds else math.inf
        return QuantileEstimate(q, top, top, math.inf, True)
    upper = bounds[index]
    if index == 0:
        # Interpolating from 0 in the first bucket invents a value (a queue time of 20 us in
        # vLLM's (0, 0.3] bucket would read 0.15 s): all that is known is "at most the bound".
        return QuantileEstimate(q, upper, 0.0 if upper > 0 else upper, upper, False, below_first_bound=True)
    lower = bounds[index - 1]
    below = cumulative[index - 1]
    in_bucket = cumulative[index] - below
    if in_bucket <= 0:
        return QuantileEstimate(q, upper, lower, upper, False)
    value = lower + (upper - lower) * (rank - below) / in_bucket
    return QuantileEstimate(q, value, lower, upper, False)


def fraction_at_or_below(
    threshold: float, bounds: Sequence[float], cumulative: Sequence[float]
) -> tuple[float, bool] | None:
    """Share of observations <= threshold, and whether that share is exact (threshold is a bound).

    Off a bound the share is interpolated inside its bucket, like histogram_quantile.
    """
    total = cumulative[-1]
    if total <= 0:
        return None
    below_count = 0.0
    lower = 0.0
    for i, upper in enumerate(bounds):
        if threshold == upper:
            return cumulative[i] / total, True
        if threshold < upper:
            span = upper - lower
            frac = (threshold - lower) / span if span > 0 else 1.0
            inside = cumulative[i] - below_count
            return (below_count + inside * max(0.0, min(1.0, frac))) / total, False
        below_count = cumulative[i]
        lower = upper
    return below_count / total, False

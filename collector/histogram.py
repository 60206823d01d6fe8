"""A fixed-bounds histogram: per-bucket counts (+Inf last), sum and count, as Prometheus keeps them."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field


@dataclass(slots=True)
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket (not cumulative), +Inf last
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float, times: int = 1) -> None:
        if times <= 0:
            return
        self.counts[bisect.bisect_left(self.bounds, value)] += times
        self.total += value * times
        self.count += times

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it) for every bucket, +Inf (math.inf) last."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out

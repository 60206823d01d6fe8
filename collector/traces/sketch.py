"""A mergeable quantile sketch with bounded relative error (the DDSketch idea).

Values fall into logarithmic buckets of ratio gamma = (1 + a) / (1 - a); reporting a bucket's
midpoint 2 gamma^i / (gamma + 1) is within relative error `a` of every value in it. Merging adds
bucket counts, so minute sketches merge into any window exactly as if built at once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

RELATIVE_ACCURACY = 0.01
_GAMMA = (1 + RELATIVE_ACCURACY) / (1 - RELATIVE_ACCURACY)
_LOG_GAMMA = math.log(_GAMMA)
_INV_LOG_GAMMA = 1 / _LOG_GAMMA
_log, _ceil, _INF = math.log, math.ceil, math.inf
MIN_VALUE = 1e-9  # values at or below (zero latencies) are counted in a zero bucket


def upper_bound(index: int) -> float:
    """The largest value bucket `index` holds (it holds (gamma^(index-1), gamma^index])."""
    return float(_GAMMA**index)


@dataclass(slots=True)
class Sketch:
    buckets: dict[int, int] = field(default_factory=dict)
    zeros: int = 0
    count: int = 0
    total: float = 0.0

    def add(self, value: float) -> None:
        self.add_all((value,))

    def add_all(self, values: Iterable[float]) -> None:
        """Count each value (NaN, infinities and negatives are not latencies and are skipped).
        One loop over local names: the ingest path adds three values for every span."""
        buckets, get, log, ceil, scale = self.buckets, self.buckets.get, _log, _ceil, _INV_LOG_GAMMA
        count, total, zeros = self.count, self.total, self.zeros
        for value in values:
            if not value < _INF or value < 0:  # also false for NaN
                continue
            count += 1
            total += value
            if value <= MIN_VALUE:
                zeros += 1
                continue
            index = ceil(log(value) * scale)
            buckets[index] = get(index, 0) + 1
        self.count, self.total, self.zeros = count, total, zeros

    def merge(self, other: Sketch) -> None:
        for index, n in other.buckets.items():
            self.buckets[index] = self.buckets.get(index, 0) + n
        self.zeros += other.zeros
        self.count += other.count
        self.total += other.total

    def quantile(self, q: float) -> float | None:
        if self.count == 0:
            return None
        rank = q * (self.count - 1)
        seen = self.zeros
        if rank < seen:
            return 0.0
        for index in sorted(self.buckets):
            seen += self.buckets[index]
            if seen > rank:
                return 2 * _GAMMA**index / (_GAMMA + 1)
        return 2 * _GAMMA ** max(self.buckets) / (_GAMMA + 1)

    def to_json(self) -> dict[str, Any]:
        return {"b": {str(k): v for k, v in self.buckets.items()}, "z": self.zeros, "n": self.count, "s": self.total}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Sketch:
        buckets = {int(k): int(v) for k, v in (data.get("b") or {}).items()}
        return cls(buckets, int(data.get("z", 0)), int(data.get("n", 0)), float(data.get("s", 0.0)))

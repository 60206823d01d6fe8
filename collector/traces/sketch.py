"""A mergeable quantile sketch with bounded relative error (the DDSketch idea).

Values fall into logarithmic buckets of ratio gamma = (1 + a) / (1 - a); reporting a bucket's
midpoint 2 gamma^i / (gamma + 1) is within relative error `a` of every value in it. Merging adds
bucket counts, so minute sketches merge into any window exactly as if built at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

RELATIVE_ACCURACY = 0.01
_GAMMA = (1 + RELATIVE_ACCURACY) / (1 - RELATIVE_ACCURACY)
_LOG_GAMMA = math.log(_GAMMA)
_INV_LOG_GAMMA = 1 / _LOG_GAMMA
_log, _ceil = math.log, math.ceil  # module-level names: add() runs three times per request
MIN_VALUE = 1e-9  # values at or below (zero latencies) are counted in a zero bucket


@dataclass(slots=True)
class Sketch:
    buckets: dict[int, int] = field(default_factory=dict)
    zeros: int = 0
    count: int = 0
    total: float = 0.0

    def add(self, value: float) -> None:
        if not math.isfinite(value) or value < 0:
            return
        self.count += 1
        self.total += value
        if value <= MIN_VALUE:
            self.zeros += 1
            return
        index = _ceil(_log(value) * _INV_LOG_GAMMA)
        self.buckets[index] = self.buckets.get(index, 0) + 1

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

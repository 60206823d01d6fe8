"""Comparing derived reports reached by different paths (running sums, a merge of the stored
minutes, sums kept as scrapes commit): equal up to float rounding of the latency sums, which
are added in another order."""

from __future__ import annotations

import dataclasses
from typing import Any


def rounded(x: Any, digits: int = 6) -> Any:
    """`x` (dataclasses, dicts, sequences, floats) with every float rounded to `digits`."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return rounded(dataclasses.asdict(x), digits)
    if isinstance(x, float):
        return round(x, digits)
    if isinstance(x, dict):
        return {k: rounded(v, digits) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [rounded(v, digits) for v in x]
    return x

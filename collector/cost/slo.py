"""The cost-ceiling SLI: time slices (epoch-aligned, the objective's `slice`, a day by default)
in which a business type's cost per million tokens, on the allocation basis (busy cost plus its
share of the idle), stayed at or under the ceiling. A slice without tokens is no data. Both the
full re-read (collector/slo/evaluate.py) and the incremental ledger judge a slice from the same
sums (CostInputs), so they agree."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from collector.cost.allocation import CostInputs
from collector.rollup import Row

# (inputs of one slice, slice start, slice end) -> business type -> (USD, tokens)
CostOf = Callable[[CostInputs, int, int], dict[str, tuple[float, float]]]


def slice_inputs(rows: Iterable[Row], size: int) -> dict[int, CostInputs]:
    out: dict[int, CostInputs] = {}
    for r in rows:
        slot = r.start_unix - r.start_unix % size
        inputs = out.get(slot)
        if inputs is None:
            inputs = out[slot] = CostInputs()
        inputs.add(r.cell.target, r.cell.ident, r.cell.cell)
    return out


def judge(costs: dict[str, tuple[float, float]], business_type: str, ceiling: float) -> tuple[float, float] | None:
    """(good, total) of one slice for one business type; None when it had no tokens."""
    usd, tokens = costs.get(business_type, (0.0, 0.0))
    if tokens <= 0:
        return None
    return (1.0 if usd / tokens * 1e6 <= ceiling else 0.0), 1.0

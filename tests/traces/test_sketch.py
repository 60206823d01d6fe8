"""The quantile sketch keeps relative error <= 1 %, also after merging many minutes."""

from __future__ import annotations

import random

import numpy as np
import pytest

from collector.traces.sketch import Sketch

SHAPES = {
    "lognormal": lambda rng: rng.lognormvariate(-1.0, 1.0),
    "exponential": lambda rng: rng.expovariate(3.0),
    "uniform": lambda rng: rng.uniform(0.01, 2.0),
    "bimodal": lambda rng: abs(rng.gauss(0.1, 0.01)) if rng.random() < 0.7 else rng.gauss(3.0, 0.3),
    "heavy_tail": lambda rng: rng.paretovariate(1.5) * 0.05,
}
QS = (0.5, 0.9, 0.95, 0.99, 0.999)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_relative_error_on_100k_samples(shape: str) -> None:
    rng = random.Random(7)
    values = [SHAPES[shape](rng) for _ in range(100_000)]
    sketch = Sketch()
    for v in values:
        sketch.add(v)
    for q in QS:
        exact = float(np.quantile(values, q, method="lower"))
        est = sketch.quantile(q)
        assert est is not None and abs(est - exact) <= 0.01 * exact, (shape, q, est, exact)


@pytest.mark.parametrize("shape", ["lognormal", "bimodal"])
def test_merging_many_minute_sketches_keeps_the_bound(shape: str) -> None:
    rng = random.Random(11)
    minutes = []
    values = []
    for _ in range(500):  # 500 "minutes" of 200 values each
        s = Sketch()
        for _ in range(200):
            v = SHAPES[shape](rng)
            s.add(v)
            values.append(v)
        minutes.append(s)
    merged = Sketch()
    for s in minutes:
        merged.merge(Sketch.from_json(s.to_json()))  # through the stored form, as windows are built
    assert merged.count == len(values)
    for q in QS:
        exact = float(np.quantile(values, q, method="lower"))
        assert abs((merged.quantile(q) or 0) - exact) <= 0.01 * exact


def test_zeros_negative_and_empty() -> None:
    s = Sketch()
    assert s.quantile(0.5) is None
    for v in (0.0, 0.0, -1.0, float("nan"), 1.0):
        s.add(v)
    assert s.count == 3 and s.quantile(0.0) == 0.0 and s.quantile(1.0) == pytest.approx(1.0, rel=0.01)


def test_length_buckets_match_bisect_on_the_bounds() -> None:
    import bisect

    from collector.traces.rollup import LENGTH_BOUNDS, length_bucket

    for n in [*range(0, 5000), 2**20 - 1, 2**20, 2**20 + 1, 2**30]:
        assert length_bucket(n) == bisect.bisect_left(LENGTH_BOUNDS, n), n

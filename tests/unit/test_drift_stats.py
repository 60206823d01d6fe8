"""The drift statistics against scipy and exact values on the same data."""

from __future__ import annotations

import math
import random

import pytest
from scipy.special import rel_entr
from scipy.stats import ks_2samp, wasserstein_distance

from collector.drift.stats import (
    common_bounds,
    distances,
    js_distance,
    ks_binned,
    log_midpoints,
    psi,
    rebin,
    shares,
    wasserstein_log_normed,
)

REF = [5.0, 30.0, 40.0, 20.0, 5.0, 0.0]
CUR = [1.0, 10.0, 30.0, 35.0, 20.0, 4.0]


def test_psi_is_the_symmetric_kl_of_the_smoothed_shares() -> None:
    p, q = shares(REF), shares(CUR)
    assert psi(REF, CUR) == pytest.approx(sum(rel_entr(q, p)) + sum(rel_entr(p, q)))
    assert psi(REF, REF) == pytest.approx(0.0)
    # hand value on two bins: (0.8 - 0.2) ln(0.8/0.2) + (0.2 - 0.8) ln(0.2/0.8) = 1.2 ln 4
    assert psi([20, 80], [80, 20]) == pytest.approx(1.2 * math.log(4))


def test_js_distance_base_2() -> None:
    p = [x / sum(REF) for x in REF]
    q = [x / sum(CUR) for x in CUR]
    m = [(a + b) / 2 for a, b in zip(p, q, strict=True)]

    def kl(a: list[float], b: list[float]) -> float:
        return sum(x * math.log2(x / y) for x, y in zip(a, b, strict=True) if x > 0)

    assert js_distance(REF, CUR) == pytest.approx(math.sqrt((kl(p, m) + kl(q, m)) / 2))
    assert js_distance([1, 0], [0, 1]) == pytest.approx(1.0)  # disjoint: the maximum, base 2
    # the same shares from different counts: 0, never NaN from a rounding residue under the root
    same = [157.57969625462138, 12.3, 0.0, 3.1]
    assert js_distance(same, [x * 3.7 for x in same]) == pytest.approx(0.0, abs=1e-6)


def test_binned_ks_is_exact_when_the_samples_sit_on_the_bucket_bounds() -> None:
    rng = random.Random(1)
    a = [rng.choice([1, 2, 5, 10, 20, 50]) for _ in range(500)]
    b = [rng.choice([2, 5, 5, 10, 50, 50]) for _ in range(400)]
    bounds = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0]
    ca = [float(sum(1 for x in a if x == v)) for v in bounds] + [0.0]
    cb = [float(sum(1 for x in b if x == v)) for v in bounds] + [0.0]
    assert ks_binned(ca, cb) == pytest.approx(ks_2samp(a, b).statistic)


def test_log_wasserstein_matches_scipy_on_the_bin_points() -> None:
    bounds = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0]
    points = log_midpoints(bounds)
    assert len(points) == len(bounds) + 1
    ref = [1.0, 3.0, 5.0, 7.0, 3.0, 1.0, 0.0]
    cur = [0.0, 1.0, 2.0, 5.0, 8.0, 4.0, 2.0]
    u = [x for x, c in zip(points, ref, strict=True) for _ in range(int(c))]
    v = [x for x, c in zip(points, cur, strict=True) for _ in range(int(c))]
    mean = sum(u) / len(u)
    std = math.sqrt(sum((x - mean) ** 2 for x in u) / len(u))
    assert wasserstein_log_normed(bounds, ref, cur) == pytest.approx(wasserstein_distance(u, v) / std)
    assert wasserstein_log_normed(bounds, ref, ref) == pytest.approx(0.0)


def test_categories_have_no_ordered_statistics_and_layouts_rebin_to_shared_bounds() -> None:
    d = distances([10, 90], [50, 50], None)
    assert d.ks is None and d.wasserstein is None and d.psi > 0.25
    assert common_bounds([(1.0, 2.0, 5.0, 10.0), (1.0, 5.0, 10.0, 20.0)]) == (1.0, 5.0, 10.0)
    # (.., 1], (1, 2], (2, 5], (5, 10], (10, inf) onto (.., 1], (1, 5], (5, 10], (10, inf)
    assert rebin((1.0, 2.0, 5.0, 10.0), [1, 2, 3, 4, 5], (1.0, 5.0, 10.0)) == [1, 5, 4, 5]
    with pytest.raises(ValueError, match="no observations"):
        shares([0, 0])

from __future__ import annotations

import math

import pytest

from collector.analytics.percentiles import fraction_at_or_below, histogram_quantile, histogram_quantiles

BOUNDS = [0.02, 0.04, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0]
# 20 observations: 10 x 0.03, 6 x 0.3, 2 x 0.9, 1.8, 3.0
CUM = [0, 10, 10, 16, 16, 18, 19, 20, 20]


@pytest.mark.parametrize(
    ("q", "value", "lower", "upper"),
    [
        (0.5, 0.04, 0.02, 0.04),  # rank 10: all of (0.02, 0.04]
        (0.9, 1.0, 0.75, 1.0),  # rank 18: 16 below, 2 inside -> top of bucket
        (0.95, 2.5, 1.0, 2.5),  # rank 19
        (0.99, 4.5, 2.5, 5.0),  # rank 19.8: 0.8 of the way through (2.5, 5]
        (0.25, 0.03, 0.02, 0.04),  # rank 5: half way through (0.02, 0.04]
    ],
)
def test_quantiles_by_bucket_interpolation(q: float, value: float, lower: float, upper: float) -> None:
    est = histogram_quantile(q, BOUNDS, CUM)
    assert est is not None
    assert est.value == pytest.approx(value)
    assert (est.lower_bound, est.upper_bound) == (lower, upper)
    assert est.lower_bound <= est.value <= est.upper_bound
    assert not est.above_top_bound


def test_rank_in_the_inf_bucket_reports_the_top_bound_and_says_so() -> None:
    est = histogram_quantile(0.99, [0.3, 60.0], [0, 50, 100])
    assert est is not None
    assert est.value == 60.0 and est.above_top_bound and math.isinf(est.upper_bound)


def test_a_rank_in_the_first_bucket_reports_at_most_the_first_bound_and_says_so() -> None:
    # vLLM's queue time: every request in (0, 0.3]; the truth may be 20 us, so no 0.15 s is invented
    est = histogram_quantile(0.5, [0.3, 1.0], [4, 4, 4])
    assert est is not None and est.value == 0.3 and est.below_first_bound and est.lower_bound == 0.0
    assert est.text == "<= 0.3"
    high = histogram_quantile(0.99, [0.3, 60.0], [0, 50, 100])
    assert high is not None and high.text == ">= 60"
    inside = histogram_quantile(0.95, BOUNDS, CUM)
    assert inside is not None and inside.text == "2.5 (1-2.5)" and not inside.below_first_bound


def test_empty_histogram_is_no_data() -> None:
    assert histogram_quantile(0.5, BOUNDS, [0] * 9) is None


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        histogram_quantile(1.5, BOUNDS, CUM)
    with pytest.raises(ValueError):
        histogram_quantile(0.5, BOUNDS, CUM[:-1])


def test_fraction_at_a_bound_is_exact_and_off_a_bound_is_interpolated() -> None:
    assert fraction_at_or_below(1.0, BOUNDS, CUM) == (18 / 20, True)
    frac, exact = fraction_at_or_below(2.0, BOUNDS, CUM) or (0.0, True)
    assert not exact and frac == pytest.approx((18 + 1 * (1.0 / 1.5)) / 20)
    assert fraction_at_or_below(100.0, BOUNDS, CUM) == (1.0, False)
    assert fraction_at_or_below(1.0, BOUNDS, [0] * 9) is None


def _first_reaching_rank(q: float, cumulative: list[float]) -> int:
    """The definition, a linear scan: the first bucket whose count reaches rank q * total and
    holds something."""
    rank = q * cumulative[-1]
    for i, count in enumerate(cumulative):
        if count >= rank and count > 0:
            return i
    return len(cumulative) - 1


def test_the_binary_search_finds_the_bucket_the_definition_names() -> None:
    import random

    rng = random.Random(5)
    for _ in range(3000):
        n = rng.randint(1, 25)
        bounds = sorted(rng.sample(range(1, 1000), n))
        per_bucket = [rng.choice([0, 0, 0, 1, 2, 7, 1000]) for _ in range(n + 1)]
        cumulative = [float(sum(per_bucket[: i + 1])) for i in range(n + 1)]
        if cumulative[-1] == 0:
            continue
        for q in (0.0, 0.5, 0.9, 0.95, 0.99, 1.0, rng.random()):
            est = histogram_quantile(q, [float(b) for b in bounds], cumulative)
            assert est is not None
            i = _first_reaching_rank(q, cumulative)
            if i == n:
                assert est.upper_bound == float("inf")
            else:
                assert est.upper_bound == bounds[i], (q, bounds, cumulative)


def test_several_quantiles_at_once_are_each_one_asked_alone() -> None:
    qs = (0.0, 0.25, 0.5, 0.9, 0.95, 0.99, 1.0)
    assert histogram_quantiles(qs, BOUNDS, CUM) == tuple(histogram_quantile(q, BOUNDS, CUM) for q in qs)
    assert histogram_quantiles(qs, BOUNDS, [0] * len(CUM)) == ()  # no observations: no quantiles
    with pytest.raises(ValueError, match="quantile must be in"):
        histogram_quantiles((0.5, 1.5), BOUNDS, CUM)  # one bad quantile fails them all

"""A target's steady-state bodies read by position (collector/sources/vllm.py: _Plan) against the
full reading of the same body by a target seen for the first time: the same snapshot for every
vLLM naming family, the same error naming the same line for every value the full reading
refuses, and no plan where the reading folds several samples into one series (engines summed,
an older alias beside the newer name)."""

from __future__ import annotations

import re

import pytest

from collector.sources.expfmt import ExpositionError
from collector.sources.vllm import _Plan, new_cache, read_scrape
from tests.conftest import public_sample_section
from tests.vllm_fixtures import FAMILIES, render, workload

MODEL = "org/model-a"


def body(version: str, load: int, engines: tuple[str, ...] = ("0",), created: float = 1.7e9) -> str:
    return render(FAMILIES[version], {(MODEL, e): workload(load) for e in engines}, created=created)


def set_value(text: str, prefix: str, value: str) -> str:
    """`text` with the value of the first sample line starting with `prefix` replaced."""
    lines = text.split("\n")
    i = next(i for i, line in enumerate(lines) if line.startswith(prefix))
    lines[i] = lines[i].rsplit(" ", 1)[0] + " " + value
    return "\n".join(lines)


@pytest.mark.parametrize("version", sorted(FAMILIES))
def test_a_warm_targets_bodies_read_by_position_equal_a_cold_reading(version: str) -> None:
    cache = new_cache()
    for load in range(1, 8):
        text = body(version, load, created=1.7e9 + (load >= 5) * 600)  # a restart at load 5
        warm = read_scrape(text, cache=cache)
        assert warm == read_scrape(text), load
    fam = FAMILIES[version]
    # an older name beside the newer one (the transitional versions): folded by rank, no plan
    aliases = max(len(fam.kv_names), len(fam.prefix_names), len(fam.itl_names)) > 1
    assert isinstance(cache.plan, _Plan) != aliases, version
    if fam.created:
        assert warm.process_start_unix == 1.7e9 + 600  # the restart, read from the _created samples


def test_the_plan_is_used_for_a_current_body_and_not_where_samples_are_folded() -> None:
    cache = new_cache()
    read_scrape(body("0.33", 1), cache=cache)
    plan = cache.plan
    assert isinstance(plan, _Plan)
    read_scrape(body("0.33", 2), cache=cache)
    assert cache.plan is plan  # the same samples in the same order: read by position
    two = new_cache()
    for load in (1, 2, 3):
        got = read_scrape(body("0.33", load, engines=("0", "1")), cache=two)  # engines summed
        assert got == read_scrape(body("0.33", load, engines=("0", "1")))
    assert two.plan is None
    public = new_cache()
    text = public_sample_section(1)
    for _ in range(3):
        assert read_scrape(text, "text/plain; version=0.0.4", public) == read_scrape(text, "text/plain; version=0.0.4")


def test_a_new_series_makes_a_new_plan() -> None:
    cache = new_cache()
    read_scrape(body("0.33", 1), cache=cache)
    read_scrape(body("0.33", 2), cache=cache)
    first = cache.plan
    extra = body("0.33", 3).replace(
        "# TYPE vllm:num_requests_running gauge\n",
        '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0",model_name="org/b"} 2.0\n',
    )
    got = read_scrape(extra, cache=cache)
    assert got == read_scrape(extra)
    assert isinstance(cache.plan, _Plan) and cache.plan is not first
    assert read_scrape(body("0.33", 4), cache=cache) == read_scrape(body("0.33", 4))  # back again


COUNTER = 'vllm:prompt_tokens_total{engine="0",model_name="org/model-a"}'
BUCKET = 'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="org/model-a"}'
SUM = 'vllm:time_to_first_token_seconds_sum{engine="0",model_name="org/model-a"}'
COUNT = 'vllm:time_to_first_token_seconds_count{engine="0",model_name="org/model-a"}'
GAUGE = 'vllm:num_requests_running{engine="0",model_name="org/model-a"}'


@pytest.mark.parametrize(
    ("prefix", "value", "refused"),
    [
        (COUNTER, "NaN", "has value nan"),
        (COUNTER, "-1.0", "has value -1.0"),
        (COUNTER, "+Inf", "has value inf"),
        (BUCKET, "NaN", "has value nan"),
        (BUCKET, "1.0", "bucket counts decrease"),
        (BUCKET, "-3.0", "has value -3.0"),
        (COUNT, "+Inf", "has value inf"),
        (SUM, "+Inf", "has value inf"),
        (SUM, "-Inf", "has value -inf"),
        (SUM, "NaN", "has value nan"),
        (SUM, "-2.5", None),  # a negative sum is a histogram of negative observations: taken
        (COUNT, "999.0", None),  # a _count other than the +Inf bucket: the count is _count's
        (GAUGE, "NaN", None),  # gauges are not checked
        (GAUGE, "-1.0", None),
    ],
)
def test_a_value_the_full_reading_refuses_is_refused_from_a_plan_naming_the_line(
    prefix: str, value: str, refused: str | None
) -> None:
    cache = new_cache()
    for load in (1, 2, 3):
        read_scrape(body("0.33", load), cache=cache)
    assert isinstance(cache.plan, _Plan)
    text = set_value(body("0.33", 4), prefix, value)
    if refused is None:
        got = read_scrape(text, cache=cache)
        want = read_scrape(text)
        assert repr(got) == repr(want)  # repr: a NaN gauge equals nothing, not even itself
        return
    with pytest.raises(ExpositionError) as cold:
        read_scrape(text)
    with pytest.raises(ExpositionError) as warm:
        read_scrape(text, cache=cache)
    assert refused in str(warm.value) and str(warm.value) == str(cold.value)
    assert warm.value.line == cold.value.line and re.match(r"vllm:", text.split("\n")[warm.value.line - 1])
    # the refused body changed nothing: the next good body is read as a cold target reads it
    assert read_scrape(body("0.33", 5), cache=cache) == read_scrape(body("0.33", 5))

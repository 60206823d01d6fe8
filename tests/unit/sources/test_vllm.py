from __future__ import annotations

import pytest

from collector.sources.expfmt import ExpositionError
from collector.sources.vllm import SeriesKey, new_cache, read_scrape
from tests.conftest import public_sample_section
from tests.vllm_fixtures import FAMILIES, Observations, render, workload

MODEL = "org/model-a"


def scrape_of(version: str, obs: Observations | None = None, engines: tuple[str, ...] = ("0",)) -> str:
    obs = obs or workload()
    return render(FAMILIES[version], {(MODEL, e): obs for e in engines})


def test_public_sample_gives_the_numbers_in_it() -> None:
    snap = read_scrape(public_sample_section(1), "text/plain; version=0.0.4")
    model = "Qwen/Qwen3-0.6B"
    assert snap.counters[SeriesKey(model, "prompt_tokens")] == 66.0
    assert snap.counters[SeriesKey(model, "generation_tokens")] == 600.0
    assert snap.counters[SeriesKey(model, "request_success", (("finished_reason", "length"),))] == 2.0
    ttft = snap.histograms[SeriesKey(model, "ttft")]
    assert ttft.count == 2.0 and len(ttft.bounds) == 22 and ttft.bounds[-1] == 2560.0
    # _created gauges are not mistaken for anything
    assert all(not k.metric.endswith("created") for k in snap.gauges)


@pytest.mark.parametrize("version", sorted(FAMILIES))
def test_every_version_family_yields_the_same_logical_series(version: str) -> None:
    snap = read_scrape(scrape_of(version))
    c = snap.counters
    assert c[SeriesKey(MODEL, "prompt_tokens")] == 5000.0
    assert c[SeriesKey(MODEL, "generation_tokens")] == 200.0
    assert c[SeriesKey(MODEL, "preemptions")] == 1.0
    reasons = {dict(k.labels)["finished_reason"]: v for k, v in c.items() if k.metric == "request_success"}
    assert reasons["stop"] == 15.0 and reasons["length"] == 3.0 and reasons["abort"] == 2.0
    assert snap.gauges[SeriesKey(MODEL, "kv_cache_usage")] == 0.42
    assert snap.gauges[SeriesKey(MODEL, "requests_running")] == 3.0
    for metric in ("ttft", "itl", "e2e", "queue", "prefill", "decode", "prompt_length", "generation_length"):
        assert snap.histograms[SeriesKey(MODEL, metric)].count > 0, metric
    assert (SeriesKey(MODEL, "tpot") in snap.histograms) == FAMILIES[version].tpot


def test_bucket_layouts_are_read_from_the_scrape() -> None:
    old = read_scrape(scrape_of("0.6")).histograms[SeriesKey(MODEL, "ttft")]
    new = read_scrape(scrape_of("0.33")).histograms[SeriesKey(MODEL, "ttft")]
    assert old.bounds[-1] == 10.0 and len(old.bounds) == 16
    assert new.bounds[-1] == 2560.0 and len(new.bounds) == 22


@pytest.mark.parametrize(("version", "unit"), [("0.8", "blocks"), ("0.10", "tokens"), ("0.11", "tokens")])
def test_prefix_cache_unit_follows_the_version(version: str, unit: str) -> None:
    snap = read_scrape(scrape_of(version))
    key = SeriesKey(MODEL, "prefix_cache_queries")
    assert snap.counters[key] == 5000.0
    assert snap.units[key] == unit


def test_transitional_versions_use_only_the_newest_name() -> None:
    # 0.10 exposes both time_per_output_token_seconds and inter_token_latency_seconds, and both
    # prefix-cache spellings: counting both would double everything.
    obs = workload()
    text = scrape_of("0.10", obs).replace(
        'vllm:time_per_output_token_seconds_count{engine="0",model_name="org/model-a"} 180.0',
        'vllm:time_per_output_token_seconds_count{engine="0",model_name="org/model-a"} 999.0',
    )
    snap = read_scrape(text)
    assert snap.histograms[SeriesKey(MODEL, "itl")].count == 180.0
    assert snap.counters[SeriesKey(MODEL, "prefix_cache_hits")] == 2000.0


def test_v0_hit_rate_gauge_is_kept_when_no_counters_exist() -> None:
    snap = read_scrape(scrape_of("0.6"))
    assert snap.gauges[SeriesKey(MODEL, "prefix_cache_hit_rate_v0")] == pytest.approx(0.4)
    assert SeriesKey(MODEL, "prefix_cache_queries") not in snap.counters


def test_engines_are_summed_and_kv_usage_takes_the_max() -> None:
    a, b = workload(), workload(2)
    b.kv_usage = 0.9
    text = render(FAMILIES["0.33"], {(MODEL, "0"): a, (MODEL, "1"): b})
    snap = read_scrape(text)
    assert snap.counters[SeriesKey(MODEL, "prompt_tokens")] == 15000.0
    assert snap.histograms[SeriesKey(MODEL, "ttft")].count == 60.0
    assert snap.gauges[SeriesKey(MODEL, "kv_cache_usage")] == 0.9
    assert snap.gauges[SeriesKey(MODEL, "requests_running")] == 6.0


def test_several_models_per_target() -> None:
    text = render(FAMILIES["0.33"], {("base", "0"): workload(), ("base-lora", "0"): workload(3)})
    snap = read_scrape(text)
    assert snap.counters[SeriesKey("base", "generation_tokens")] == 200.0
    assert snap.counters[SeriesKey("base-lora", "generation_tokens")] == 600.0


def test_le_is_parsed_as_a_float() -> None:
    text = scrape_of("0.33")
    go_style = text.replace('le="1.0"', 'le="1"').replace('le="10.0"', 'le="10"')
    assert read_scrape(go_style).histograms == read_scrape(text).histograms


def test_llm_d_finish_reason_label_is_normalised() -> None:
    text = scrape_of("0.33").replace("finished_reason=", "finish_reason=")
    snap = read_scrape(text)
    assert snap.counters[SeriesKey(MODEL, "request_success", (("finished_reason", "stop"),))] == 15.0


def test_the_cache_does_not_change_results() -> None:
    cache = new_cache()
    first = read_scrape(scrape_of("0.33"), cache=cache)
    second = read_scrape(scrape_of("0.33", workload(2)), cache=cache)
    cold = read_scrape(scrape_of("0.33", workload(2)))
    assert second.counters == cold.counters and second.histograms == cold.histograms
    assert first.counters != second.counters


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (
            lambda t: t.replace(
                'vllm:prompt_tokens_total{engine="0",model_name="org/model-a"} 5000.0',
                'vllm:prompt_tokens_total{engine="0",model_name="org/model-a"} NaN',
            ),
            "counter vllm:prompt_tokens_total has value nan",
        ),
        (
            lambda t: t.replace(
                'vllm:prompt_tokens_total{engine="0",model_name="org/model-a"} 5000.0',
                'vllm:prompt_tokens_total{engine="0",model_name="org/model-a"} -1.0',
            ),
            "has value -1.0",
        ),
        (
            lambda t: t.replace("# TYPE vllm:time_to_first_token_seconds histogram\n", ""),
            "vllm:time_to_first_token_seconds_bucket has no # TYPE line",
        ),
        (
            lambda t: t.replace("# TYPE vllm:prompt_tokens_total counter", "# TYPE vllm:prompt_tokens_total gauge"),
            "declared gauge, expected counter",
        ),
        (
            lambda t: t.replace('le="0.5",model_name="org/model-a"} 16.0', 'le="0.5",model_name="org/model-a"} 1.0'),
            "bucket counts decrease",
        ),
        (lambda t: t.replace('le="0.5"', 'le="half"'), "is not a number"),
    ],
)
@pytest.mark.parametrize("warm", [False, True])
def test_unusable_values_are_errors_that_name_the_line(mutate, fragment: str, warm: bool) -> None:  # type: ignore[no-untyped-def]
    """Also from a target whose good bodies came before (`warm`): its series, comment lines,
    last layout and TYPE checks are remembered (collector/sources/_expscan.c), and the bad body
    is still refused, naming the same line."""
    text = mutate(scrape_of("0.33"))
    cache = new_cache()
    if warm:
        for load in (1, 2, 3):  # the Python scan, then the C scan line by line, then against the layout
            read_scrape(scrape_of("0.33", workload(load)), cache=cache)
    with pytest.raises(ExpositionError) as info:
        read_scrape(text, cache=cache)
    assert fragment in str(info.value)
    assert info.value.line is not None and info.value.line > 0
    assert text.split("\n")[info.value.line - 1].startswith(("vllm:", "# "))


def test_missing_type_on_unused_families_is_fine() -> None:
    text = scrape_of("0.33") + 'some_other_metric{x="1"} 3\n'
    assert read_scrape(text).counters


def test_router_series_with_a_server_label_are_not_engine_data() -> None:
    text = scrape_of("0.33").replace(
        "# TYPE vllm:num_requests_running gauge\n",
        '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{server="http://x"} 99.0\n',
    )
    snap = read_scrape(text)
    assert snap.gauges[SeriesKey(MODEL, "requests_running")] == 3.0

from __future__ import annotations

import math
import os

import pytest
from prometheus_client.parser import text_string_to_metric_families

from collector.sources.expfmt import ExpositionError, SeriesCache, detect_format, parse
from tests.conftest import public_sample_section


def test_public_vllm_sample_parses_to_the_same_samples_as_prometheus_client() -> None:
    text = public_sample_section(1)
    ours = {(s.name, s.labels): s.value for s in parse(text).samples}
    theirs = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            theirs[(s.name, tuple(sorted(s.labels.items())))] = s.value
    assert ours == theirs
    assert len(ours) == 252


def test_labels_are_unescaped_and_sorted() -> None:
    expo = parse('m{b="x\\"y",a="1\\\\2\\nz"} 3\n')
    assert expo.samples[0].labels == (("a", "1\\2\nz"), ("b", 'x"y'))


def test_special_values_and_timestamps() -> None:
    expo = parse("a NaN\nb +Inf\nc -Inf 1700000000000\nd 1.5e3\n")
    values = [s.value for s in expo.samples]
    assert math.isnan(values[0]) and values[1] == math.inf and values[2] == -math.inf and values[3] == 1500.0


def test_cached_fast_path_gives_the_same_result_as_a_cold_parse() -> None:
    text = public_sample_section(1)
    cache: SeriesCache[tuple[str, tuple[tuple[str, str], ...]] | None] = SeriesCache()
    first = parse(text, cache=cache)
    second = parse(text.replace(" 66.0", " 67.0"), cache=cache)
    assert len(cache.entries) == 252
    assert [(s.name, s.labels) for s in first.samples] == [(s.name, s.labels) for s in second.samples]
    assert [s.value for s in second.samples].count(67.0) == [s.value for s in first.samples].count(66.0) > 0


def test_cache_is_bounded() -> None:
    cache: SeriesCache[tuple[str, tuple[tuple[str, str], ...]] | None] = SeriesCache(max_entries=3)
    parse("a 1\nb 1\nc 1\nd 1\n", cache=cache)
    assert len(cache.entries) <= 3


def test_openmetrics_with_exemplars_and_eof() -> None:
    body = (
        "# TYPE req counter\n"
        'req_total{a="1"} 5 # {trace_id="abc"} 1.0 1700000000.0\n'
        'req_created{a="1"} 1700000000.0\n'
        "# EOF\n"
    )
    expo = parse(body, "application/openmetrics-text; version=1.0.0; charset=utf-8")
    assert [(s.name, s.value) for s in expo.samples] == [("req_total", 5.0), ("req_created", 1.7e9)]
    assert expo.types == {"req": "counter"}


def test_openmetrics_without_eof_is_rejected() -> None:
    with pytest.raises(ExpositionError, match="EOF"):
        parse("# TYPE a gauge\na 1\n", "application/openmetrics-text")


@pytest.mark.parametrize(
    ("body", "line", "fragment"),
    [
        ("a 1\nb{x=1} 2\n", 2, "malformed label set"),
        ("a 1\na 2\n", 2, "duplicate series a (first on line 1)"),
        ('a{x="1"} 1\na{x="1"} 2\n', 2, "duplicate series"),
        ("a one\n", 1, "invalid sample value 'one'"),
        ("a 1_000\n", 1, "invalid sample value"),
        ("a\n", 1, "missing value"),
        ("a 1 2 3\n", 1, "unexpected text"),
        ("# TYPE a gauge\n# TYPE a counter\n", 2, "second TYPE line"),
        ("# TYPE a sometype\n", 1, "malformed TYPE line"),
        ('1a{x="y"} 1\n', 1, "expected a metric name"),
        ('a{x="1",x="2"} 1\n', 1, "duplicate label"),
    ],
)
def test_malformed_lines_are_reported_with_their_line_number(body: str, line: int, fragment: str) -> None:
    with pytest.raises(ExpositionError) as info:
        parse(body)
    assert info.value.line == line
    assert fragment in str(info.value)
    assert str(info.value).startswith(f"line {line}:")


def test_non_utf8_bytes_name_the_line() -> None:
    with pytest.raises(ExpositionError) as info:
        parse(b"a 1\nb 2\nc\xff 3\n")
    assert info.value.reason == "encoding"
    assert info.value.line == 3
    assert "0xff" in str(info.value)


@pytest.mark.parametrize("ctype", ["text/html", "application/json", "application/octet-stream"])
def test_wrong_content_type_is_refused(ctype: str) -> None:
    with pytest.raises(ExpositionError) as info:
        detect_format(ctype)
    assert info.value.reason == "content_type"
    assert ctype in str(info.value)


def test_missing_content_type_means_text_format() -> None:
    assert detect_format(None) == "text"
    assert detect_format("text/plain; version=0.0.4; charset=utf-8") == "text"


def _c_scanner() -> None:
    from collector.sources import expfmt

    if not expfmt.SCANNER_BUILT:
        if os.environ.get("CI") == "true":
            raise AssertionError("the C scanner was not built (a C compiler is needed at install)")
        pytest.skip("the C scanner is not built here (no C compiler at install)")


def test_a_targets_comment_lines_are_checked_once_then_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The steady-state C scan takes the HELP and TYPE lines a target sent before from its cache
    instead of calling the Python parser for each (~90 lines a vLLM scrape); a changed line is
    checked again, and the TYPE declarations come out the same."""
    from collector.sources import expfmt

    _c_scanner()
    checked: list[str] = []
    real = expfmt._parse_comment

    def counting(line: str, lineno: int, types: dict[str, str]) -> tuple[str, str] | None:
        checked.append(line)
        return real(line, lineno, types)

    monkeypatch.setattr(expfmt, "_parse_comment", counting)
    text = public_sample_section(1)
    comment_lines = [line for line in text.split("\n") if line.startswith("#")]
    cache: SeriesCache[tuple[str, tuple[tuple[str, str], ...]] | None] = SeriesCache()
    cold = parse(text, cache=cache)  # the pure-Python scan: new series
    assert parse(text, cache=cache).types == cold.types  # the C scan: each comment line checked once
    assert sorted(checked) == sorted(comment_lines + comment_lines)
    checked.clear()
    warm = parse(text.replace(" 66.0", " 67.0"), cache=cache)
    assert checked == [] and warm.types == cold.types and len(cold.types) > 10
    assert set(cache.comments) == set(comment_lines)
    help_line = next(line for line in comment_lines if line.startswith("# HELP"))
    changed = text.replace(help_line, help_line + " (reworded)")
    assert parse(changed, cache=cache).types == cold.types
    assert checked == [help_line + " (reworded)"]


def test_a_remembered_type_line_sent_twice_is_still_an_error_naming_its_line() -> None:
    _c_scanner()
    body = "# HELP a_total A.\n# TYPE a_total counter\na_total 1\n"
    cache: SeriesCache[tuple[str, tuple[tuple[str, str], ...]] | None] = SeriesCache()
    parse(body, cache=cache)
    parse(body, cache=cache)  # remembered
    assert "# TYPE a_total counter" in cache.comments
    with pytest.raises(ExpositionError) as err:
        parse(body + "# TYPE a_total counter\n", cache=cache)
    assert err.value.line == 4 and "second TYPE line for a_total" in str(err.value)
    with pytest.raises(ExpositionError) as bad:  # a malformed line is never remembered
        parse(body + "# TYPE b_total sideways\n", cache=cache)
    assert bad.value.line == 4 and "malformed TYPE line" in str(bad.value)
    assert "# TYPE b_total sideways" not in cache.comments
    assert parse(body, cache=cache).types == {"a_total": "counter"}  # the cache still serves


def test_a_body_that_follows_the_last_ones_layout_is_read_against_it() -> None:
    """Scrape after scrape a server sends the same lines with new values: the C scan reads such a
    body against the layout of the last one (no prefix lookups: it answers even with the series
    cache emptied) and gives what the Python scanner gives; any other body is scanned line by line
    again (a new line, a duplicate, a timestamp, a value with '_', lines in another order)."""
    from collector.sources import _expscan  # type: ignore[attr-defined]

    _c_scanner()
    text = public_sample_section(1)
    cache: SeriesCache[tuple[str, tuple[tuple[str, str], ...]] | None] = SeriesCache()
    parse(text, cache=cache)  # new series: the Python scanner
    assert cache.layout == []
    parse(text, cache=cache)  # the C scan: it keeps the layout
    lines = [line for line in text.split("\n") if line]
    heads = [line if line[0] == "#" else line.rsplit(" ", 1)[0] for line in lines]
    assert [entry[0] for entry in cache.layout] == heads
    assert len(cache.layout) == len(lines)
    moved = text.replace(" 66.0", " 67.0")
    want = parse(moved)  # a cold parse by the Python scanner

    def c_scan(body: str, limit: int = 0) -> tuple[object, dict[str, str]]:
        types: dict[str, str] = {}
        out = _expscan.scan(body, {}, limit, lambda line, n: None, {}, types, list(cache.layout))
        return out, types

    out, types = c_scan(moved)  # no series cache at all: only the layout can answer
    assert out is not None and types == want.types
    got = parse(moved, cache=cache)
    assert [(s.name, s.labels, s.value, s.line) for s in got.samples] == [
        (s.name, s.labels, s.value, s.line) for s in want.samples
    ]
    sample = next(line for line in lines if not line.startswith("#"))
    prefix = sample.rsplit(" ", 1)[0]
    for changed in (
        text + sample + "\n",  # a duplicate series
        text.replace(sample, f"{sample} 1700000000000"),  # a timestamp
        text.replace(sample, f"{prefix} 1_0"),  # float() takes 1_0, exposition does not
        "\n".join(reversed(text.split("\n"))),  # the same lines in another order
    ):
        assert c_scan(changed)[0] is None, changed[:80]  # scanned line by line: no cache, no answer
    assert c_scan(moved, limit=10)[0] is None  # more samples than the limit
    with pytest.raises(ExpositionError) as err:
        parse(text + sample + "\n", cache=cache)
    assert "duplicate series" in str(err.value)
    assert cache.layout == []  # the C scan gave up on that body: no layout until the next one it reads
    parse(text, cache=cache)
    assert len(cache.layout) == len(lines)

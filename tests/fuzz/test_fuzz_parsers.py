"""Property-based fuzzing of the two parsers that read what strangers send, against their
references: the exposition parser against prometheus_client's, the OTLP decoder and span
normaliser against protobuf's decoder. No exception other than the documented rejections.

The default suite runs a small share (FUZZ_EXAMPLES, 300 each); the benchmark-style run is
`LLMSLO_FUZZ_EXAMPLES=100000 .venv/bin/python -m pytest tests/fuzz -s`."""

from __future__ import annotations

import contextlib
import math
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client.parser import text_string_to_metric_families

from collector.sources.expfmt import ExpositionError, parse
from collector.sources.vllm import read_scrape
from collector.traces import otlp
from collector.traces.normalize import Rejected, is_llm_span, normalize, wanted_attributes

EXAMPLES = int(os.environ.get("LLMSLO_FUZZ_EXAMPLES", "300"))
FUZZ = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=EXAMPLES <= 300
)

NAMES = st.sampled_from(
    [
        "vllm:num_requests_running",
        "vllm:prompt_tokens_total",
        "vllm:request_success_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:time_to_first_token_seconds_count",
        "vllm:time_to_first_token_seconds_sum",
        "process_start_time_seconds",
        "http_requests_total",
        "x",
    ]
)
LABEL_NAMES = st.sampled_from(["model_name", "engine", "le", "finished_reason", "finish_reason", "server", "a_b"])
LABEL_VALUES = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=12)
VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**12), max_value=10**12),
    st.sampled_from(["NaN", "+Inf", "-Inf", "1e3", "0x10", "1_0", "", "abc"]),
)


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def exposition(draw: st.DrawFn) -> str:
    lines = []
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["sample", "sample", "sample", "type", "help", "comment", "garbage", "blank"]))
        name = draw(NAMES)
        if kind == "sample":
            labels = draw(st.dictionaries(LABEL_NAMES, LABEL_VALUES, max_size=3))
            body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            value = draw(VALUES)
            text = repr(float(value)) if isinstance(value, float) else str(value)
            ts = draw(st.sampled_from(["", " 1700000000000", " -1", " x"]))
            lines.append(f"{name}{{{body}}} {text}{ts}" if labels or draw(st.booleans()) else f"{name} {text}{ts}")
        elif kind == "type":
            family = name.removesuffix("_total").removesuffix("_bucket").removesuffix("_count").removesuffix("_sum")
            kind_name = draw(st.sampled_from(["counter", "gauge", "histogram", "summary", "untyped", "bogus"]))
            lines.append(f"# TYPE {family} {kind_name}")
        elif kind == "help":
            lines.append(f"# HELP {name} {draw(LABEL_VALUES)}")
        elif kind == "comment":
            lines.append("# " + draw(LABEL_VALUES))
        elif kind == "garbage":
            lines.append(draw(st.text(max_size=30)))
        else:
            lines.append("")
    return "\n".join(lines) + "\n"


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


@FUZZ
@given(exposition())
def test_the_exposition_parser_agrees_with_prometheus_client_or_rejects_with_a_line(text: str) -> None:
    try:
        ours = parse(text)
    except ExpositionError as exc:
        assert exc.reason in ("parse", "encoding")
        assert exc.line is None or exc.line >= 1
        ours = None
    try:
        theirs = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
        }
    except Exception:  # the reference refuses it: llmslo may accept or refuse
        theirs = None
    if ours is not None and theirs is not None:
        # prometheus_client names a counter's samples `<family>_total` whatever the line said
        theirs = {(name.removesuffix("_total"), labels): v for (name, labels), v in theirs.items()}
        mine = {(s.name.removesuffix("_total"), s.labels): s.value for s in ours.samples}
        assert mine.keys() <= theirs.keys() | {k for k in mine if k[0].endswith("_created")}
        for key, value in mine.items():
            if key in theirs:
                assert _same(value, theirs[key]), (key, value, theirs[key])
    # and the vLLM layer on top never raises anything but the documented rejection
    with contextlib.suppress(ExpositionError):
        read_scrape(text, sample_limit=1000, model_limit=8)


def _scan_both(first: str, second: str) -> tuple[object, object]:
    """`second` scanned with the cache `first` filled, by the C fast path (when it takes it) and
    by the pure-Python scanner: (result or error) of each."""
    from collector.sources import expfmt

    def run(text: str, cache: expfmt.SeriesCache[object]) -> object:
        try:
            out, types = expfmt.scan(text, expfmt.TEXT_FORMAT, cache, lambda name, labels, line: (name, labels), 5)
            return [(hit, repr(v), line, key) for hit, v, line, key in out], types
        except ExpositionError as exc:
            return ("error", exc.reason, exc.line, str(exc))

    cache: expfmt.SeriesCache[object] = expfmt.SeriesCache()
    run(first, cache)
    run(first, cache)  # the C scan of a known body: `second` is then read against its layout
    warm = dict(cache.entries)
    fast = run(second, cache)
    built, expfmt._expscan = expfmt._expscan, None  # type: ignore[assignment]
    try:
        plain = run(second, expfmt.SeriesCache(entries=warm))
    finally:
        expfmt._expscan = built
    return fast, plain


@FUZZ
@given(exposition(), exposition(), st.booleans())
def test_the_c_scan_of_a_known_target_gives_what_the_python_scan_gives(first: str, other: str, same: bool) -> None:
    """A target's second scrape: the same lines with other values (the steady state the C path
    takes), or another body (new series, bad lines: it must hand those to the Python scanner)."""
    second = first if same else other
    if same:  # every value changed: what a scrape 15 s later looks like
        second = "\n".join(
            line.rsplit(" ", 1)[0] + " 7.5" if line and not line.startswith("#") and " " in line else line
            for line in first.split("\n")
        )
    fast, plain = _scan_both(first, second)
    assert fast == plain


def _read_or_error(text: str, cache: object = None) -> object:
    try:
        return repr(read_scrape(text, cache=cache))  # type: ignore[arg-type]
    except ExpositionError as e:
        # the reason and the line (a known series' line with no value is "invalid sample value ''"
        # from the warm scan and "missing value" from a first reading: both name the line)
        return (e.reason, e.line)


@FUZZ
@given(
    st.sampled_from(["0.6", "0.8", "0.10", "0.11", "0.33"]),
    st.lists(st.tuples(st.integers(0, 400), VALUES), max_size=6),
)
def test_a_warm_vllm_target_reads_any_values_as_a_cold_one(version: str, changes: list[tuple[int, object]]) -> None:
    """A target whose plan was made (collector/sources/vllm.py: _Plan) gets its body with some
    sample values replaced by anything (NaN, infinities, negatives, huge, not numbers): the same
    snapshot, or the same error on the same line, as a target reading that body first."""
    from tests.vllm_fixtures import FAMILIES, render, workload

    def body(load: int) -> str:
        return render(FAMILIES[version], {("m", "0"): workload(load)})

    from collector.sources.vllm import new_cache

    cache = new_cache()
    for load in (1, 2, 3):
        read_scrape(body(load), cache=cache)
    lines = body(4).split("\n")
    samples = [i for i, line in enumerate(lines) if line and not line.startswith("#")]
    for pick, value in changes:
        i = samples[pick % len(samples)]
        lines[i] = lines[i].rsplit(" ", 1)[0] + " " + str(value)
    text = "\n".join(lines)
    assert _read_or_error(text, cache) == _read_or_error(text)
    assert _read_or_error(body(5), cache) == _read_or_error(body(5))  # and nothing changed after it


def test_the_c_scan_takes_a_steady_vllm_scrape_and_hands_over_a_new_series() -> None:
    from collector.sources import expfmt
    from tests.vllm_fixtures import FAMILIES, render, workload

    if not expfmt.SCANNER_BUILT:
        if os.environ.get("CI") == "true":
            raise AssertionError("the C scanner was not built (a C compiler is needed at install)")
        return
    body = render(FAMILIES["0.33"], {("m", "0"): workload(3)})
    cache: expfmt.SeriesCache[object] = expfmt.SeriesCache()
    expfmt.scan(body, expfmt.TEXT_FORMAT, cache, lambda name, labels, line: name)
    steady = expfmt._expscan.scan(body, cache.entries, 0, lambda line, n: None, {}, {}, [])
    assert steady is not None  # the steady state
    grown = body + 'vllm:num_requests_running{model_name="new"} 1\n'
    assert expfmt._expscan.scan(grown, cache.entries, 0, lambda line, n: None, {}, {}, []) is None  # a new series
    fast, plain = _scan_both(body, grown)
    assert fast == plain


ATTR_KEYS = st.sampled_from(
    [
        "gen_ai.operation.name",
        "gen_ai.request.model",
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
        "gen_ai.usage.cache_read.input_tokens",
        "gen_ai.latency.e2e",
        "gen_ai.latency.time_to_first_token",
        "gen_ai.response.finish_reasons",
        "llmslo.tenant",
        "llmslo.business_type",
        "error.type",
        "service.name",
        "other.key",
    ]
)


@st.composite
def export_request(draw: st.DrawFn) -> bytes:
    req = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(0, 3))):
        rs = req.resource_spans.add()
        for key in draw(st.lists(ATTR_KEYS, max_size=2)):
            kv = rs.resource.attributes.add()
            kv.key, kv.value.string_value = key, draw(LABEL_VALUES)
        spans = rs.scope_spans.add()
        for _ in range(draw(st.integers(0, 4))):
            s = spans.spans.add()
            s.trace_id = draw(st.binary(min_size=16, max_size=16))
            s.span_id = draw(st.binary(min_size=8, max_size=8))
            s.name = draw(st.sampled_from(["llm_request", "chat m", "litellm_request", "GET /"]))
            s.start_time_unix_nano = draw(st.integers(0, 2**63))
            s.end_time_unix_nano = draw(st.integers(0, 2**63))
            for key in draw(st.lists(ATTR_KEYS, max_size=6)):
                kv = s.attributes.add()
                kv.key = key
                choice = draw(st.integers(0, 4))
                if choice == 0:
                    kv.value.string_value = draw(LABEL_VALUES)
                elif choice == 1:
                    kv.value.int_value = draw(st.integers(-(2**63), 2**63 - 1))
                elif choice == 2:
                    kv.value.double_value = draw(st.floats(allow_nan=True, allow_infinity=True))
                elif choice == 3:
                    kv.value.bool_value = draw(st.booleans())
                else:
                    kv.value.array_value.values.add().string_value = draw(LABEL_VALUES)
    return req.SerializeToString()


WANTED = wanted_attributes()


@FUZZ
@given(export_request(), st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=4))
def test_the_otlp_decoder_agrees_with_protobuf_and_normalisation_only_rejects(
    body: bytes, flips: list[tuple[int, int]]
) -> None:
    mutated = bytearray(body)
    for at, byte in flips:
        if mutated:
            mutated[at % len(mutated)] = byte
    for payload in (body, bytes(mutated)):
        try:
            ours = otlp.decode(payload, otlp.PROTOBUF, WANTED)
        except otlp.OtlpError as exc:
            assert exc.status == 400
            continue
        reference = otlp.spans_of(otlp.parse_request(payload, otlp.PROTOBUF), WANTED)
        # repr: NaN attribute values compare equal to themselves
        assert repr([(s.trace_id, s.span_id, s.attributes, s.resource) for s in ours]) == repr(
            [(s.trace_id, s.span_id, s.attributes, s.resource) for s in reference]
        )
        for span in ours:
            if is_llm_span(span):
                with contextlib.suppress(Rejected):
                    normalize(span, now_unix=1_800_000_000.0)

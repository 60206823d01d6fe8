"""Prometheus text exposition (0.0.4) and OpenMetrics text parser: bytes in, samples out.

A pure function of its input. It is strict where a monitor must be (every problem names its
line), and fast where a fleet needs it: a per-target `SeriesCache` remembers the parsed
`name{labels}` prefix of each line, so that a steady-state scrape costs one dict lookup and one
float() per sample instead of a full label parse.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, NamedTuple, TypeVar

try:  # the steady-state scan in C (collector/sources/_expscan.c), when it was built
    from collector.sources import _expscan
except ImportError:  # pragma: no cover - built wherever a C compiler was found at install
    _expscan = None  # type: ignore[assignment]
SCANNER_BUILT = _expscan is not None

Labels = tuple[tuple[str, str], ...]

TEXT_FORMAT = "text"
OPENMETRICS_FORMAT = "openmetrics"

_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_RE = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"[ \t]*(,|\})')
_VALID_TYPES = frozenset(
    {"counter", "gauge", "histogram", "summary", "untyped", "unknown", "info", "stateset", "gaugehistogram"}
)
# Suffixes a sample may add to its family name (text format and OpenMetrics).
_SAMPLE_SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created", "_gcount", "_gsum", "_info")


class ExpositionError(Exception):
    """The body is not valid exposition. `reason` is a short machine label, `line` is 1-based."""

    def __init__(self, reason: str, message: str, line: int | None = None) -> None:
        self.reason = reason
        self.line = line
        self.message = message
        super().__init__(f"line {line}: {message}" if line is not None else message)


class Sample(NamedTuple):
    """One exposed sample. `key` is the canonical `name{labels}` text it was parsed from."""

    name: str
    labels: Labels
    value: float
    line: int
    key: str


@dataclass(frozen=True, slots=True)
class Exposition:
    """The parsed body of one scrape."""

    format: str
    samples: list[Sample]
    types: dict[str, str]  # family name -> declared TYPE


T = TypeVar("T")


@dataclass(slots=True)
class SeriesCache(Generic[T]):
    """Per-target memo: the `name{labels}` prefix of a sample line -> what it resolved to.

    Bounded: once it holds `max_entries` it is cleared and refilled, which only costs speed.
    """

    max_entries: int = 100_000
    entries: dict[str, T] = field(default_factory=dict)
    # comment lines accepted before: None (HELP, UNIT, plain), or the (family, type) of a TYPE line
    comments: dict[str, tuple[str, str] | None] = field(default_factory=dict)
    # the lines of the last body the C scan read, for the next one to be read against (_expscan.c)
    layout: list[tuple[str, object]] = field(default_factory=list)
    # the sample names whose declared TYPE a reader checked, and the TYPE lines it checked them
    # against: a body with the same TYPE lines needs no check again (collector/sources/vllm.py)
    checked: set[str] = field(default_factory=set)
    checked_types: dict[str, str] = field(default_factory=dict)
    # what a reader made of the last body's samples, to apply to a body with the same samples in
    # the same order (collector/sources/vllm.py: _Plan); None: no such plan
    plan: object | None = None

    def put(self, key: str, value: T) -> None:
        if len(self.entries) >= self.max_entries:
            self.entries.clear()
        self.entries[key] = value


def detect_format(content_type: str | None) -> str:
    """Choose the parser from the Content-Type header; refuse types that are not exposition."""
    if not content_type:
        return TEXT_FORMAT
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "application/openmetrics-text":
        return OPENMETRICS_FORMAT
    if media == "text/plain":
        return TEXT_FORMAT
    raise ExpositionError(
        "content_type",
        f"unexpected Content-Type {content_type!r}: want 'text/plain; version=0.0.4' or 'application/openmetrics-text'",
    )


def decode_body(body: bytes) -> str:
    """UTF-8 decode, naming the line of the first invalid byte."""
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = body.count(b"\n", 0, exc.start) + 1
        raise ExpositionError(
            "encoding", f"invalid UTF-8 byte 0x{body[exc.start]:02x} at byte offset {exc.start}", line
        ) from None


def family_of(sample_name: str, types: dict[str, str]) -> str | None:
    """The declared family a sample belongs to, or None when no TYPE line covers it."""
    if sample_name in types:
        return sample_name
    for suffix in _SAMPLE_SUFFIXES:
        if sample_name.endswith(suffix):
            base = sample_name[: -len(suffix)]
            if base in types:
                return base
    return None


def parse(
    body: bytes | str,
    content_type: str | None = None,
    cache: SeriesCache[tuple[str, Labels] | None] | None = None,
) -> Exposition:
    """Parse one scrape body into samples. Raises ExpositionError naming the first bad line."""
    fmt = detect_format(content_type)
    text = decode_body(body) if isinstance(body, bytes) else body
    resolved, types = scan(text, fmt, cache if cache is not None else SeriesCache(), _name_labels)
    samples = [Sample(nl[0], nl[1], value, line, key) for nl, value, line, key in resolved]
    return Exposition(fmt, samples, types)


def _name_labels(name: str, labels: Labels, line: int) -> tuple[str, Labels]:
    return (name, labels)


def scan(
    text: str,
    fmt: str,
    cache: SeriesCache[T | None],
    resolve: Callable[[str, Labels, int], T | None],
    sample_limit: int = 0,
) -> tuple[list[tuple[T, float, int, str]], dict[str, str]]:
    """Tokenize exposition text; each series is resolved once (then memoised in `cache`).

    Samples whose series resolves to None are validated but not returned: callers use this to
    skip families they do not need at the cost of one dict lookup per line.
    Returns (resolved, value, line, key) tuples and the TYPE declarations. More than
    `sample_limit` samples (0: no limit) is an error, raised as soon as the limit is passed.
    """
    entries = cache.entries
    if _expscan is not None and fmt == TEXT_FORMAT and entries:
        # the steady state in C: every sample line a series already in the cache (None: not so,
        # or a problem; the loop below then parses the new series or names the bad line)
        known: dict[str, str] = {}
        comments = cache.comments

        def comment(line: str, n: int) -> None:
            declared = _parse_comment(line, n, known)  # raises for a bad line: nothing remembered
            if len(comments) >= cache.max_entries:
                comments.clear()
            comments[line] = declared

        fast = _expscan.scan(text, entries, sample_limit, comment, comments, known, cache.layout)
        if fast is not None:
            return fast, known
    out: list[tuple[T, float, int, str]] = []
    append = out.append
    types: dict[str, str] = {}
    seen: dict[str, int] = {}
    saw_eof = False
    openmetrics = fmt == OPENMETRICS_FORMAT
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    lineno = 0
    for line in lines:
        lineno += 1
        if saw_eof:
            raise ExpositionError("parse", "content after '# EOF'", lineno)
        if not line:
            if openmetrics:
                raise ExpositionError("parse", "empty line is not allowed in OpenMetrics", lineno)
            continue
        if line[0] == "#":
            if openmetrics and line == "# EOF":
                saw_eof = True
            else:
                _parse_comment(line, lineno, types)
            continue
        # Fast path: `prefix value`, where prefix was fully parsed in an earlier scrape.
        cut = line.rfind(" ")
        key = line[:cut]
        if key in entries:
            raw = line[cut + 1 :]
            if "_" in raw:
                raise ExpositionError("parse", f"invalid sample value {raw!r}", lineno)
            try:
                value = float(raw)
            except ValueError:
                raise ExpositionError("parse", f"invalid sample value {raw!r}", lineno) from None
            hit = entries[key]
        else:
            name, labels, key, value = _parse_sample_line(line, lineno, openmetrics)
            if key in entries:
                hit = entries[key]
            else:
                hit = resolve(name, labels, lineno)
                cache.put(sys.intern(key), hit)  # interned: the C scan's layout shares the string
        if key in seen:
            raise ExpositionError("parse", f"duplicate series {key} (first on line {seen[key]})", lineno)
        seen[key] = lineno
        if sample_limit and len(seen) > sample_limit:
            raise ExpositionError(
                "sample_limit", f"more than {sample_limit} samples (scrape.sample_limit); nothing stored", lineno
            )
        if hit is not None:
            append((hit, value, lineno, key))
    if openmetrics and not saw_eof:
        raise ExpositionError("parse", "OpenMetrics body does not end with '# EOF'", len(lines))
    return out, types


def _parse_value(raw: str, lineno: int) -> float:
    if "_" in raw:
        raise ExpositionError("parse", f"invalid sample value {raw!r}", lineno)
    try:
        return float(raw)
    except ValueError:
        raise ExpositionError("parse", f"invalid sample value {raw!r}", lineno) from None


def _parse_comment(line: str, lineno: int, types: dict[str, str]) -> tuple[str, str] | None:
    """Check one comment line; a TYPE line's (family, type) is set in `types` and returned."""
    parts = line.split(None, 3)
    if len(parts) < 2 or parts[1] not in ("TYPE", "HELP", "UNIT"):
        return None  # a plain comment
    if parts[1] == "HELP" and len(parts) >= 3 and _NAME_RE.fullmatch(parts[2]):
        return None
    if len(parts) < 3 or not _NAME_RE.fullmatch(parts[2]):
        raise ExpositionError("parse", f"malformed {parts[1]} line: {line[:120]!r}", lineno)
    if parts[1] != "TYPE":
        return None
    if len(parts) != 4 or parts[3].strip() not in _VALID_TYPES:
        raise ExpositionError("parse", f"malformed TYPE line: {line[:120]!r}", lineno)
    name = parts[2]
    if name in types:
        raise ExpositionError("parse", f"second TYPE line for {name}", lineno)
    types[name] = kind = parts[3].strip()
    return name, kind


def _parse_sample_line(line: str, lineno: int, openmetrics: bool) -> tuple[str, Labels, str, float]:
    m = _NAME_RE.match(line)
    if m is None:
        raise ExpositionError("parse", f"expected a metric name at the start of {line[:120]!r}", lineno)
    name = m.group(0)
    pos = m.end()
    labels: list[tuple[str, str]] = []
    if pos < len(line) and line[pos] == "{":
        pos += 1
        names: set[str] = set()
        while True:
            while pos < len(line) and line[pos] in " \t":
                pos += 1
            if pos < len(line) and line[pos] == "}":
                pos += 1
                break
            lm = _LABEL_RE.match(line, pos)
            if lm is None:
                raise ExpositionError("parse", f"malformed label set at column {pos + 1} in {line[:120]!r}", lineno)
            label, raw_value, closer = lm.group(1), lm.group(2), lm.group(3)
            if label in names:
                raise ExpositionError("parse", f"duplicate label {label!r} in {name}", lineno)
            names.add(label)
            labels.append((label, _unescape(raw_value) if "\\" in raw_value else raw_value))
            pos = lm.end()
            if closer == "}":
                break
    labels.sort()
    rest = line[pos:]
    if rest and rest[0] not in " \t":
        raise ExpositionError("parse", f"expected a space after the series in {line[:120]!r}", lineno)
    if openmetrics and " # " in rest:
        rest = rest.split(" # ", 1)[0]  # drop the exemplar
    tokens = rest.split()
    if not tokens:
        raise ExpositionError("parse", f"missing value for {name}", lineno)
    if len(tokens) > 2:
        raise ExpositionError("parse", f"unexpected text after the value in {line[:120]!r}", lineno)
    value = _parse_value(tokens[0], lineno)
    if len(tokens) == 2:
        _parse_value(tokens[1], lineno)  # a timestamp: validated, not used (we stamp on receipt)
    key = line[:pos]
    canonical = tuple(labels)
    return name, canonical, key, value


def _unescape(raw: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(raw):
        ch = raw[i]
        if ch == "\\" and i + 1 < len(raw):
            nxt = raw[i + 1]
            out.append("\n" if nxt == "n" else nxt)
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)

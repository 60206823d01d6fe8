"""Per-minute request rollups from trace records: mergeable counts, tokens, sketches, lengths."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from collector.rollup import MINUTE_SECONDS
from collector.traces.normalize import RequestRecord
from collector.traces.sketch import Sketch

# token-length histogram bounds, log-spaced (for drift): 1, 2, 4, ... 2^20
LENGTH_BOUNDS = tuple(float(2**i) for i in range(21))
LATENCIES = ("ttft", "tpot", "e2e", "queue")
FIELD_OF = {name: f"{name}_seconds" for name in LATENCIES}  # latency -> RequestRecord field


def length_bucket(tokens: int) -> int:
    """Index of the first LENGTH_BOUNDS bound >= tokens (bisect_left), by bit arithmetic:
    the bounds are powers of two, and this runs twice for every request."""
    return min((tokens - 1).bit_length(), len(LENGTH_BOUNDS)) if tokens > 0 else 0


@dataclass(frozen=True, slots=True)
class LatencyTarget:
    """One latency objective a request is judged against (from the SLO rules)."""

    slo: str
    metric: str  # ttft | tpot | e2e | queue
    threshold_seconds: float


class RequestKey(NamedTuple):
    start_unix: int
    business_type: str
    model: str
    tenant: str
    measured_at: str
    track: str = ""  # the deployment track (canary comparison); "" when no span said


@dataclass(slots=True)
class RequestCell:
    total: int = 0
    errors: int = 0
    finish: dict[str, int] = field(default_factory=dict)
    error_types: dict[str, int] = field(default_factory=dict)
    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    # input tokens of the requests whose source reports cached tokens: the hit ratio's denominator
    # (vLLM's own spans report none: their ratio is "not reported", never 0)
    cache_reported_input_tokens: int = 0
    good: dict[str, int] = field(default_factory=dict)  # slo -> requests under its threshold (and not failed)
    jointly_good: int = 0  # requests meeting every latency objective of their business type at once
    sketches: dict[str, Sketch] = field(default_factory=dict)
    input_lengths: list[int] = field(default_factory=lambda: [0] * (len(LENGTH_BOUNDS) + 1))
    output_lengths: list[int] = field(default_factory=lambda: [0] * (len(LENGTH_BOUNDS) + 1))

    def add_all(self, records: Sequence[RequestRecord], targets: Sequence[LatencyTarget]) -> None:
        """Count a cell's records. One loop over local names: this runs for every span ingested."""
        finish, error_types, good = self.finish, self.error_types, self.good
        checks = [(t.slo, FIELD_OF[t.metric], t.threshold_seconds, t.metric == "tpot") for t in targets]
        ttft: list[float] = []
        tpot: list[float] = []
        e2e: list[float] = []
        queue: list[float] = []
        in_len, out_len = self.input_lengths, self.output_lengths
        errors = input_tokens = cached = cache_reported = output_tokens = joint_good = 0
        for r in records:
            finish[r.finish_reason] = finish.get(r.finish_reason, 0) + 1
            failed = bool(r.error_type)
            if failed:
                errors += 1
                error_types[r.error_type] = error_types.get(r.error_type, 0) + 1
            input_tokens += r.input_tokens
            if r.cached_input_tokens is not None:
                cached += r.cached_input_tokens
                cache_reported += r.input_tokens
            output_tokens += r.output_tokens
            if r.ttft_seconds is not None:
                ttft.append(r.ttft_seconds)
            if r.tpot_seconds is not None:
                tpot.append(r.tpot_seconds)
            e2e.append(r.e2e_seconds)
            if r.queue_seconds is not None:
                queue.append(r.queue_seconds)
            if checks:
                joint = not failed
                for slo, field_name, threshold, is_tpot in checks:
                    v = getattr(r, field_name)
                    # TPOT is undefined for one-token outputs: such a request cannot miss a TPOT objective
                    if not failed and (v <= threshold if v is not None else is_tpot):
                        good[slo] = good.get(slo, 0) + 1
                    else:
                        joint = False
                joint_good += joint
            in_len[length_bucket(r.input_tokens)] += 1
            out_len[length_bucket(r.output_tokens)] += 1
        self.total += len(records)
        self.errors += errors
        self.input_tokens += input_tokens
        self.cached_input_tokens += cached
        self.cache_reported_input_tokens += cache_reported
        self.output_tokens += output_tokens
        self.jointly_good += joint_good
        for name, values in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e), ("queue", queue)):
            if values:
                sketch = self.sketches.get(name)
                if sketch is None:
                    sketch = self.sketches[name] = Sketch()
                sketch.add_all(values)

    def merge(self, o: RequestCell) -> None:
        self.total += o.total
        self.errors += o.errors
        for mine, theirs in ((self.finish, o.finish), (self.error_types, o.error_types), (self.good, o.good)):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0) + v
        self.input_tokens += o.input_tokens
        self.cached_input_tokens += o.cached_input_tokens
        self.cache_reported_input_tokens += o.cache_reported_input_tokens
        self.output_tokens += o.output_tokens
        self.jointly_good += o.jointly_good
        for name, sk in o.sketches.items():
            self.sketches.setdefault(name, Sketch()).merge(sk)
        self.input_lengths = [a + b for a, b in zip(self.input_lengths, o.input_lengths, strict=True)]
        self.output_lengths = [a + b for a, b in zip(self.output_lengths, o.output_lengths, strict=True)]

    def to_json(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "errors": self.errors,
            "finish": self.finish,
            "error_types": self.error_types,
            "in": self.input_tokens,
            "cached": self.cached_input_tokens,
            "cached_of": self.cache_reported_input_tokens,
            "out": self.output_tokens,
            "good": self.good,
            "joint": self.jointly_good,
            "sketches": {k: v.to_json() for k, v in self.sketches.items()},
            "in_len": self.input_lengths,
            "out_len": self.output_lengths,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RequestCell:
        return cls(
            total=d["total"],
            errors=d["errors"],
            finish=dict(d["finish"]),
            error_types=dict(d["error_types"]),
            input_tokens=d["in"],
            cached_input_tokens=d["cached"],
            output_tokens=d["out"],
            cache_reported_input_tokens=d.get("cached_of", d["in"]),  # earlier rows counted every request
            good=dict(d["good"]),
            jointly_good=d["joint"],
            sketches={k: Sketch.from_json(v) for k, v in d["sketches"].items()},
            input_lengths=list(d["in_len"]),
            output_lengths=list(d["out_len"]),
        )


def aggregate(
    records: Iterable[RequestRecord], targets_of: dict[str, list[LatencyTarget]]
) -> dict[RequestKey, RequestCell]:
    """Records -> minute cells keyed by (minute of the request's end, business type, model, tenant, clock)."""
    groups: dict[RequestKey, list[RequestRecord]] = {}
    for r in records:
        minute = int(r.end_unix // MINUTE_SECONDS) * MINUTE_SECONDS  # rollup.period_start, inlined
        key = RequestKey(minute, r.business_type, r.model, r.tenant, r.measured_at, r.track)
        group = groups.get(key)
        if group is None:
            groups[key] = [r]
        else:
            group.append(r)
    cells: dict[RequestKey, RequestCell] = {}
    for key, group in groups.items():
        cell = cells[key] = RequestCell()
        cell.add_all(group, targets_of.get(key.business_type, ()))
    return cells

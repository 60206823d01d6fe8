"""Which fleet views a derive pass encodes ahead of their readers (collector/api/readahead.py),
on a simulated clock: derive passes every 15 s (each ending 1.5 s after it starts), readers
polling at a dashboard's or a script's period, a body accepted by a read when at most 3 passes +
5 s old (as /api/v1/serving does), otherwise encoded on request (the slow read the read-ahead is
for)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest

from collector.api.readahead import ReadAhead, late_for

PASS = 15.0
MAX_AGE = 3 * PASS + 5  # what /api/v1/serving accepts of a held body


@dataclass
class Run:
    encodes: list[float] = field(default_factory=list)  # when a pass encoded the view ahead
    waited: list[float] = field(default_factory=list)  # reads that found no recent body
    ages: list[float] = field(default_factory=list)  # the body's age at each read that found one


def simulate(reads: list[float], until: float) -> Run:
    ahead: ReadAhead[str] = ReadAhead(PASS)
    held: float | None = None  # when the held body's pass computed it
    run = Run()
    pending = sorted(reads)
    t = 0.0
    while t < until:
        computed, ends = t, t + 1.5
        while pending and pending[0] < ends:  # reads during the pass get the last pass's body
            now = pending.pop(0)
            ahead.read("view", now)
            last_pass = computed - PASS
            if held is None or now - held > MAX_AGE:
                run.waited.append(now)
                held = last_pass  # encoded on request from the last pass's snapshot
            else:
                run.ages.append(now - held)
        age = None if held is None else computed - held
        for key in ahead.due(ends, lambda _k, age=age: age):  # type: ignore[misc]
            assert key == "view"
            held = computed
            run.encodes.append(ends)
        t += PASS
    return run


def per_poll(run: Run, reads: list[float]) -> list[int]:
    """Encodes between each read and the next."""
    return [sum(1 for e in run.encodes if a <= e < b) for a, b in itertools.pairwise(reads)]


@pytest.mark.parametrize("period", [60.0, 300.0, 900.0])
def test_a_slow_poller_gets_a_fresh_body_for_one_encode_per_poll(period: float) -> None:
    reads = [7.0 + period * i for i in range(12)]
    run = simulate(reads, reads[-1] + 1)
    # the first read waits (nothing known yet); once the period is known, none does
    assert run.waited == [reads[0]] or run.waited == reads[:2]
    assert all(n == 1 for n in per_poll(run, reads)[2:]), per_poll(run, reads)
    # and the body is from the last pass or two before the read
    assert max(run.ages[-8:]) <= 2 * PASS + 2, run.ages


def test_a_fast_poller_is_kept_fresh_at_most_once_a_pass() -> None:
    reads = [3.0 + 26.0 * i for i in range(40)]
    run = simulate(reads, reads[-1] + 1)
    assert run.waited == [reads[0]]
    assert max(run.ages) <= MAX_AGE
    assert len(run.encodes) <= len(reads) + 2  # one per poll, not one per pass


def test_a_reader_that_stops_costs_nothing_after_it_is_late() -> None:
    period = 300.0
    reads = [7.0 + period * i for i in range(4)]
    run = simulate(reads, reads[-1] + 4 * period)
    gone = reads[-1] + period + late_for(period)
    assert not [e for e in run.encodes if e > gone + PASS]
    # while merely late it was renewed, at most every two passes
    late = [e for e in run.encodes if reads[-1] + period < e <= gone]
    assert 1 <= len(late) <= late_for(period) / (2 * PASS) + 1


def test_a_single_read_is_followed_for_two_minutes_then_dropped() -> None:
    run = simulate([10.0], 1200.0)
    assert run.waited == [10.0]
    assert run.encodes and max(run.encodes) <= 10.0 + 120.0 + PASS
    assert len(run.encodes) <= 120.0 / (2 * PASS) + 2  # kept at most two passes old, not encoded every pass


def test_reads_a_moment_apart_are_one_read() -> None:
    ahead: ReadAhead[str] = ReadAhead(PASS)
    ahead.read("v", 100.0)
    ahead.read("v", 100.4)  # a second panel of the same dashboard
    ahead.read("v", 400.0)
    assert ahead.period["v"] == 300.0


def test_the_views_remembered_are_bounded() -> None:
    ahead: ReadAhead[str] = ReadAhead(PASS)
    for i in range(1000):  # a client asking for a new window each time
        ahead.read(f"{i}m", float(i))
    assert len(ahead.last) == 256 and "999m" in ahead.last and "0m" not in ahead.last

from __future__ import annotations

import pytest

from collector.rollup import Cell, DeltaTracker, SeriesIdent, period_start
from collector.sources.vllm import EngineSnapshot, Kind, SeriesKey, read_scrape
from tests.vllm_fixtures import FAMILIES, Observations, render, workload

MODEL = "m"
PROMPT = SeriesIdent(SeriesKey(MODEL, "prompt_tokens"), Kind.COUNTER)


def snap(obs: Observations, version: str = "0.33"):  # type: ignore[no-untyped-def]
    return read_scrape(render(FAMILIES[version], {(MODEL, "0"): obs}))


def ttft_ident(version: str = "0.33") -> SeriesIdent:
    return SeriesIdent(SeriesKey(MODEL, "ttft"), Kind.HISTOGRAM, tuple(FAMILIES[version].ttft_bounds))


def started_at(obs: Observations, process_start: float) -> EngineSnapshot:
    text = render(FAMILIES["0.33"], {(MODEL, "0"): obs})
    text += f"# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {process_start!r}\n"
    return read_scrape(text)


def test_first_scrape_is_a_baseline_with_zero_deltas() -> None:
    tracker = DeltaTracker()
    deltas = tracker.observe(snap(workload()), 1000.0)
    assert deltas.cells[PROMPT].value == 0.0
    assert deltas.cells[PROMPT].observed_seconds == 0.0
    assert deltas.cells[ttft_ident()].buckets == [0.0] * 23


def test_consecutive_scrapes_give_exact_deltas_and_observed_time() -> None:
    tracker = DeltaTracker()
    tracker.commit(tracker.observe(snap(workload(1)), 1000.0), 1000.0)
    deltas = tracker.observe(snap(workload(3)), 1015.0)
    assert deltas.cells[PROMPT].value == 10000.0
    assert deltas.cells[PROMPT].observed_seconds == 15.0
    ttft = deltas.cells[ttft_ident()]
    assert ttft.value == 40.0
    assert ttft.buckets is not None and ttft.buckets[-1] == 40.0
    assert ttft.sum == pytest.approx(2 * sum(workload().ttft))
    assert deltas.minute == 960


def test_a_restarted_server_gives_the_new_value_never_a_negative_delta() -> None:
    tracker = DeltaTracker()
    tracker.commit(tracker.observe(snap(workload(5)), 1000.0), 1000.0)
    deltas = tracker.observe(snap(workload(1)), 1015.0)
    assert deltas.cells[PROMPT].value == 5000.0
    assert deltas.cells[ttft_ident()].value == 20.0
    assert all(b >= 0 for b in deltas.cells[ttft_ident()].buckets or [])
    assert deltas.resets >= 2


def test_a_histogram_whose_count_holds_but_a_bucket_went_down_was_reset() -> None:
    """A restart between scrapes that saw as many requests again, but faster ones: the count is
    back where it was, one bucket lower. Its delta is the new histogram, never a negative bucket."""
    tracker = DeltaTracker()
    first = snap(workload(1))
    tracker.commit(tracker.observe(first, 1000.0), 1000.0)
    second = snap(workload(1))
    point = second.histograms[ttft_ident().key]
    low = next(i for i, c in enumerate(point.cumulative) if c > 0)
    point.cumulative[low] -= 1  # one request moved up a bucket: the count holds
    deltas = tracker.observe(second, 1015.0)
    ttft = deltas.cells[ttft_ident()]
    assert ttft.buckets == point.cumulative and ttft.value == point.count
    assert deltas.resets >= 1


def test_observe_does_not_change_state_until_commit() -> None:
    tracker = DeltaTracker()
    tracker.commit(tracker.observe(snap(workload(1)), 1000.0), 1000.0)
    tracker.observe(snap(workload(4)), 1015.0)  # e.g. the store write failed
    deltas = tracker.observe(snap(workload(2)), 1030.0)
    assert deltas.cells[PROMPT].value == 5000.0
    assert deltas.cells[PROMPT].observed_seconds == 30.0


def test_a_new_bucket_layout_is_a_new_series() -> None:
    tracker = DeltaTracker()
    tracker.commit(tracker.observe(snap(workload(1), "0.6"), 1000.0), 1000.0)
    deltas = tracker.observe(snap(workload(1), "0.33"), 1015.0)  # upgraded and restarted
    assert ttft_ident("0.6") not in deltas.cells
    new = deltas.cells[ttft_ident("0.33")]
    assert new.value == 20.0  # counted since the restart, not dropped


def test_a_series_appearing_later_counts_from_zero() -> None:
    tracker = DeltaTracker()
    tracker.commit(tracker.observe(read_scrape(render(FAMILIES["0.33"], {("a", "0"): workload()})), 1000.0), 1000.0)
    text = render(FAMILIES["0.33"], {("a", "0"): workload(), ("lora-b", "0"): workload()})
    deltas = tracker.observe(read_scrape(text), 1015.0)
    assert deltas.cells[SeriesIdent(SeriesKey("lora-b", "prompt_tokens"), Kind.COUNTER)].value == 5000.0
    assert deltas.cells[SeriesIdent(SeriesKey("a", "prompt_tokens"), Kind.COUNTER)].value == 0.0


def test_gauge_cells_merge_min_max_last_and_mean() -> None:
    a = Cell(Kind.GAUGE, sum=0.5, gmin=0.5, gmax=0.5, glast=0.5, n=1, last_unix=10)
    b = Cell(Kind.GAUGE, sum=0.9, gmin=0.9, gmax=0.9, glast=0.9, n=1, last_unix=20)
    c = Cell(Kind.GAUGE, sum=0.1, gmin=0.1, gmax=0.1, glast=0.1, n=1, last_unix=15)
    a.merge(b)
    a.merge(c)
    assert (a.gmin, a.gmax, a.glast, a.n) == (0.1, 0.9, 0.9, 3)
    assert a.sum / a.n == pytest.approx(0.5)


def test_cell_merge_is_associative() -> None:
    cells = [Cell(Kind.HISTOGRAM, value=i, sum=i * 0.5, buckets=[i, 2 * i], observed_seconds=15) for i in range(1, 5)]
    left = cells[0].copy()
    for c in cells[1:]:
        left.merge(c)
    pairs = [cells[0].copy(), cells[2].copy()]
    pairs[0].merge(cells[1])
    pairs[1].merge(cells[3])
    pairs[0].merge(pairs[1])
    assert (left.value, left.sum, left.buckets, left.observed_seconds) == (
        pairs[0].value,
        pairs[0].sum,
        pairs[0].buckets,
        pairs[0].observed_seconds,
    )


def test_period_start() -> None:
    assert period_start(119.9) == 60 and period_start(120.0) == 120 and period_start(7199, 3600) == 3600


def test_a_restart_is_detected_by_process_start_even_when_counters_are_back_at_their_old_values() -> None:
    tracker = DeltaTracker()
    tracker.commit(tracker.observe(started_at(workload(1), 100.0), 1000.0), 1000.0)
    same_server = tracker.observe(started_at(workload(1), 100.0), 1015.0)
    assert same_server.cells[PROMPT].value == 0.0
    # restarted, and served exactly as much again: the counters equal their old values
    restarted = tracker.observe(started_at(workload(1), 1010.0), 1015.0)
    assert restarted.cells[PROMPT].value == 5000.0
    assert restarted.cells[ttft_ident()].value == 20.0
    assert restarted.resets > 0
    # multiprocess vLLM exposes neither process series nor _created: decreasing counters still
    # detect restarts, and a first scrape is a baseline
    text = render(FAMILIES["0.33"], {(MODEL, "0"): workload(1)})
    multiprocess = "\n".join(line for line in text.splitlines() if "_created" not in line) + "\n"
    assert read_scrape(multiprocess).process_start_unix is None


def test_a_server_that_started_within_the_lookback_is_counted_from_zero_on_the_first_scrape() -> None:
    deltas = DeltaTracker().observe(started_at(workload(2), 1000.0), 1040.0, startup_lookback_seconds=600)
    assert deltas.cells[PROMPT].value == 10000.0  # everything since the process started
    assert deltas.cells[PROMPT].observed_seconds == 40.0
    assert deltas.cells[ttft_ident()].value == 40.0
    assert deltas.from_process_start and not deltas.restarted


def test_a_server_running_longer_than_the_lookback_is_a_baseline() -> None:
    deltas = DeltaTracker().observe(started_at(workload(2), 1000.0), 2000.0, startup_lookback_seconds=600)
    assert deltas.cells[PROMPT].value == 0.0
    assert not deltas.from_process_start


def test_a_process_start_far_in_the_future_is_not_believed() -> None:
    deltas = DeltaTracker().observe(started_at(workload(2), 9000.0), 1000.0, startup_lookback_seconds=600)
    assert deltas.cells[PROMPT].value == 0.0


def test_created_samples_give_the_process_start_when_process_metrics_are_missing() -> None:
    text = render(FAMILIES["0.33"], {(MODEL, "0"): workload()}, created=1234.5)
    assert "process_start_time_seconds" not in text
    snapshot = read_scrape(text)
    assert snapshot.process_start_unix == 1234.5
    # the _created samples are metadata, not samples llmslo uses
    without = "\n".join(line for line in text.splitlines() if "_created" not in line) + "\n"
    assert snapshot.samples == read_scrape(without).samples


def test_a_restart_after_a_gap_covers_only_the_time_since_the_process_started() -> None:
    tracker = DeltaTracker()
    tracker.commit(tracker.observe(started_at(workload(5), 900.0), 1000.0), 1000.0)
    # down from 1000 to 1060; the new process started at 1050 and was scraped at 1065
    deltas = tracker.observe(started_at(workload(1), 1050.0), 1065.0)
    assert deltas.restarted
    assert deltas.cells[PROMPT].value == 5000.0
    assert deltas.cells[PROMPT].observed_seconds == 15.0  # not the whole 65 s gap
    assert deltas.cells[ttft_ident()].observed_seconds == 15.0


def test_a_restart_is_one_restart_however_many_series_reset() -> None:
    tracker = DeltaTracker()
    tracker.commit(tracker.observe(snap(workload(5)), 1000.0), 1000.0)
    deltas = tracker.observe(snap(workload(1)), 1015.0)
    assert deltas.restarted
    assert deltas.resets > 10
    quiet = DeltaTracker()
    quiet.commit(quiet.observe(snap(workload(1)), 1000.0), 1000.0)
    assert not quiet.observe(snap(workload(2)), 1015.0).restarted


def test_a_restart_whose_start_time_reads_after_the_scrape_is_still_one_restart_counted_in_full() -> None:
    # process_start_time_seconds adds the boot time in whole seconds to the process's start in
    # clock ticks, so a process scraped right after it started can claim to have started up to
    # 1 s in the future: the restart is still seen and every new count kept
    tracker = DeltaTracker()
    tracker.commit(tracker.observe(started_at(workload(5), 900.0), 1000.0), 1000.0)
    deltas = tracker.observe(started_at(workload(1), 1015.6), 1015.1)
    assert deltas.restarted and deltas.resets > 0
    assert deltas.cells[PROMPT].value == 5000.0
    assert deltas.cells[PROMPT].observed_seconds == 0.0  # no time before the claimed start
    tracker.commit(deltas, 1015.1)
    after = tracker.observe(started_at(workload(2), 1015.6), 1016.1)
    assert not after.restarted and after.cells[PROMPT].value == 5000.0

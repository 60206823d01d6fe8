"""A derive pass's business types from histogram sums kept as scrapes commit
(collector/analytics/histsums.py) against a merge of every series, at every pass of a timeline a
real fleet has: traffic changing, two vLLM versions with different bucket layouts in one business
type, a model no configuration names, a target appearing late, a vLLM restart, an outage longer
than the window, passes inside a minute's grace, a DCGM exporter (in no business type) that
gains a GPU, and a collector restart in the middle of a minute (whose open minute the sums did
not count: that pass merges the series instead). The pass's counters and gauges are reduced per
business type without a merged cell per series (collector/windowcells.py: reduce_window,
reduce_sliding); the groups' number is known before they are derived."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.analytics.histsums import FoldedSums, Layouts, LayoutSums, OpenHistograms
from collector.analytics.serving import build_report
from collector.config import Settings
from collector.rollup import Cell
from collector.runtime import Runtime, window_bounds
from collector.sim.exposition import EngineMetrics, render
from collector.sources.vllm import Kind
from collector.store.repository import Store
from tests.rounding import rounded

T0 = 1_800_000_000


class Server:
    def __init__(self, rng: random.Random, created: float, version: str, model: str, max_model_len: int) -> None:
        self.rng = rng
        self.version = version
        self.model = model
        self.m = EngineMetrics(max_model_len=max_model_len, created_unix=created)

    def step(self, load: int) -> str:
        m = self.m
        for _ in range(load):
            m.prompt_tokens += self.rng.randint(50, 3000)
            m.generation_tokens += self.rng.randint(10, 200)
            m.finished["stop"] = m.finished.get("stop", 0) + 1
            m.hist["time_to_first_token_seconds"].observe(self.rng.uniform(0.01, 3.0))
            m.hist["e2e_request_latency_seconds"].observe(self.rng.uniform(0.5, 20.0))
        m.waiting = self.rng.randint(0, 3)
        m.running = load
        m.kv_usage = self.rng.random()
        return render(self.version, self.model, m)


def settings_for(tmp_path: Path) -> Settings:
    return Settings.model_validate(
        {
            "data_dir": str(tmp_path),
            "windows": ["1m", "5m", "20m"],
            "targets": [
                {"name": "a", "url": "http://127.0.0.1:1/a", "business_type": "chat"},
                {"name": "old", "url": "http://127.0.0.1:1/old", "business_type": "chat"},
                {"name": "b", "url": "http://127.0.0.1:1/b", "business_type": "batch"},
                {"name": "nobody", "url": "http://127.0.0.1:1/n"},  # its model is in no rule
                {"name": "gpu", "url": "http://127.0.0.1:1/g", "kind": "dcgm"},  # in no business type
            ],
        }
    )


def dcgm_body(step: int) -> str:
    """A DCGM exporter's scrape: a gauge and an energy counter that moves every scrape; a
    second GPU shows up at step 120 (minute 30)."""
    gpus = ("0", "1") if step >= 120 else ("0",)
    util = "".join(f'DCGM_FI_DEV_GPU_UTIL{{gpu="{g}",modelName="NVIDIA L40S"}} {step % 100}\n' for g in gpus)
    energy = "".join(
        f'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{gpu="{g}",modelName="NVIDIA L40S"}} {1_000_000 + 5_000 * step}\n'
        for g in gpus
    )
    return f"# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n{util}# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n{energy}"


def business_types(report: Any) -> Any:
    return rounded([dataclasses.asdict(b) for b in report.business_types])


def test_business_types_from_the_sums_equal_a_merge_of_every_series(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    rt = Runtime(settings)
    rng = random.Random(5)

    def fleet() -> dict[str, Server]:
        return {
            "a": Server(rng, T0 - 10, "current", "llama", 4096),
            "old": Server(rng, T0 - 10, "0.6", "llama", 8192),  # other bucket layouts, same business type
            "b": Server(rng, T0 - 10, "current", "mixtral", 4096),
            "nobody": Server(rng, T0 - 10, "current", "who-knows", 4096),
        }

    servers = fleet()
    compared = {60.0: 0, 300.0: 0, 1200.0: 0}
    fallbacks = 0
    t = T0
    while t < T0 + 2 * 3600:
        minute = (t - T0) // 60
        if 40 <= minute < 65:
            t += 15  # every target down for 25 minutes: longer than the 20m window
            continue
        if minute == 90 and t % 60 == 30:
            # the collector restarts in the middle of a minute: a new process on the same database
            rt.store.close()
            rt = Runtime(settings, Store(settings.resolved_database_url))
        for name, server in servers.items():
            if name == "b" and minute < 12:
                continue  # b appears late
            if name == "a" and minute == 100 and t % 60 == 0:
                servers["a"] = server = Server(rng, float(t - 3), "current", "llama", 4096)  # vLLM restart
            assert rt.scrapers[name].ingest(server.step(rng.randint(0, 8)), "text/plain", float(t))
        assert rt.scrapers["gpu"].ingest(dcgm_body((t - T0) // 15), "text/plain", float(t))
        now = t + 3.0  # passes at seconds 3, 18, 33, 48: the first is inside the previous minute's grace
        if minute % 5 == 0 or 11 <= minute <= 13 or 25 <= minute <= 35 or 64 <= minute <= 67 or 88 <= minute <= 93:
            rt.refresh_snapshot(now)
            for w in compared:
                got = rt.report_from_sums(w, now)
                if got is None:
                    fallbacks += 1
                    assert 90 <= minute <= 91, (minute, w)  # only the restarted collector's first minutes
                    continue
                if w <= settings.sliding_horizon:
                    want = build_report(rt.sliding_cells(now, w), w, 0, 0, rt.business_type_of)
                else:
                    start, end = window_bounds(now, w)
                    want = build_report(rt.store.read_window(start, end), w, start, end, rt.business_type_of)
                assert business_types(got) == business_types(want), (minute, w)
                # the groups' number is known before they are derived (DCGM series are in none)
                assert len(got.groups) == len(want.groups), (minute, w)
                assert {b.business_type for b in got.business_types} >= {"chat", "unassigned"}
                # the groups, derived when read, are those of every series
                assert rounded([dataclasses.asdict(g) for g in got.groups]) == rounded(
                    [dataclasses.asdict(g) for g in want.groups]
                ), (minute, w)
                compared[w] += 1
        t += 15
    assert all(n > 100 for n in compared.values()), compared
    assert fallbacks > 0  # the collector restart's open minute was merged from the series
    chat = next(b for b in rt.snapshot.reports[300.0].business_types if b.business_type == "chat")
    assert chat.stats.latencies["ttft"].mixed_bucket_layouts  # 0.6 and current in one business type


def test_a_sum_is_gone_when_its_last_series_is_and_counts_add_back_exactly() -> None:
    key = ("chat", "ttft", (0.1, 1.0))
    sums = FoldedSums()
    a = Cell(Kind.HISTOGRAM, value=3, sum=1.5, buckets=[1, 2, 3])
    b = Cell(Kind.HISTOGRAM, value=2, sum=0.25, buckets=[2, 2, 2])
    sums.add(key, a)
    sums.add(key, b)
    assert sums.cells[key].buckets == [3, 4, 5] and sums.members[key] == 2
    sums.subtract(key, a)
    assert sums.cells[key].buckets == [2, 2, 2] and sums.cells[key].value == 2
    copy = sums.copy()
    sums.subtract(key, b)
    assert key not in sums.cells  # no series left: absent, not a zero histogram
    assert copy.cells[key].buckets == [2, 2, 2]  # copies do not share their lists


def test_a_passs_groups_read_minutes_later_are_those_of_its_moment_without_reading_the_store(
    tmp_path: Path,
) -> None:
    """The fleet view derives a pass's (target, model) groups when first read, which may be after
    later passes moved the running windows on by a minute: the pass kept what it saw."""
    # a fleet larger than /metrics shows (metrics_target_limit): the groups wait for a reader
    settings = settings_for(tmp_path).model_copy(
        update={"server": settings_for(tmp_path).server.model_copy(update={"metrics_target_limit": 1})}
    )
    rt = Runtime(settings)
    rng = random.Random(7)
    servers = {
        "a": Server(rng, T0 - 10, "current", "llama", 4096),
        "b": Server(rng, T0 - 10, "current", "mixtral", 4096),
    }
    kept: list[tuple[float, Any, Any]] = []
    t = T0
    while t < T0 + 40 * 60:
        for name, server in servers.items():
            assert rt.scrapers[name].ingest(server.step(rng.randint(1, 8)), "text/plain", float(t))
        now = t + 3.0
        snap = rt.refresh_snapshot(now)
        if (t - T0) // 60 in (25, 30) and t % 60 in (0, 15):  # in and out of a minute's grace
            for w, report in snap.reports.items():
                want = rt.report(w, now)  # every series, at the pass's moment
                kept.append((w, report, want))
        t += 15
    assert len(kept) == 4 * 3
    reads = rt.store.read_window

    def no_store_reads(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a kept pass read the store")

    rt.store.read_window = no_store_reads  # type: ignore[method-assign]
    for w, report, want in kept:
        assert "not derived yet" in repr(report.groups)
        got = [dataclasses.asdict(g) for g in report.groups]  # derived now, ten minutes later
        assert rounded(got) == rounded([dataclasses.asdict(g) for g in want.groups]), w
        assert len(got) == 2
    rt.store.read_window = reads  # type: ignore[method-assign]


def test_open_minutes_are_forgotten_without_a_pass_and_an_incomplete_one_is_not_answered() -> None:
    key = ("chat", "ttft", (0.1, 1.0))
    cell = Cell(Kind.HISTOGRAM, value=1, sum=0.5, buckets=[1, 1, 1])
    sums = OpenHistograms()
    flat = Layouts().flat("t", [(key, cell)])
    for minute in range(0, 3600 * 24, 60):  # a day of commits, no derive pass asking
        sums.add(minute, flat, read_stored=minute == 600)
    assert len(sums.minutes) <= 6 and not sums.incomplete
    sums.add(3600 * 24, flat, read_stored=True)  # a minute read back from the store
    assert sums.since(3600 * 24) is None  # merged from the series instead
    got = sums.since(3600 * 24 - 120)
    assert got is None
    sums.add(3600 * 24 + 60, flat, read_stored=False)
    later = sums.since(3600 * 24 + 60)
    assert later is not None and later.cells[key].buckets == [1, 1, 1]


KEYS = [("chat", "ttft", (0.1, 1.0)), ("chat", "e2e", (1.0, 5.0, 10.0)), ("batch", "ttft", (0.1, 1.0))]
NO_BUCKETS = ("batch", "queue", (0.5,))  # a cell without buckets (never mixed with some under one key)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]),  # the target
            st.lists(
                st.sampled_from(range(len(KEYS) + 1)), min_size=0, max_size=4
            ),  # its cells' sums (repeats: two models)
            st.integers(0, 5),  # the counts
            st.booleans(),  # taken out again later
        ),
        max_size=30,
    )
)
def test_layout_sums_are_the_sums_of_every_cell(scrapes: list[tuple[str, list[int], int, bool]]) -> None:
    """Scrapes summed as one list per layout (`LayoutSums`, what the sliding window and the open
    minutes keep) give, per FoldKey, what adding and taking out every cell gives (`FoldedSums`):
    targets whose layout changes, two cells of one scrape joining one sum, cells without buckets,
    a layout whose last scrape leaves (absent, as a key whose last series left)."""
    layouts, flat_sums, want = Layouts(), LayoutSums(), FoldedSums()
    kept = []
    for target, picks, count, leaves in scrapes:
        folded = []
        for i in picks:
            key = KEYS[i] if i < len(KEYS) else NO_BUCKETS
            buckets = None if key is NO_BUCKETS else [float(count * (j + 1)) for j in range(len(key[2]) + 1)]
            folded.append((key, Cell(Kind.HISTOGRAM, value=float(count), sum=count * 0.5, buckets=buckets)))
        flat = layouts.flat(target, folded)
        flat_sums.add(flat)
        for key, cell in folded:
            want.add(key, cell)
        if leaves:
            kept.append((flat, folded))
    for flat, folded in kept:
        flat_sums.subtract(flat)
        if not flat.layout.entries:
            continue
        for key, cell in folded:
            want.subtract(key, cell)
    got = flat_sums.folded()
    assert got.members == want.members
    assert {k: (c.value, c.buckets) for k, c in got.cells.items()} == {
        k: (c.value, c.buckets) for k, c in want.cells.items()
    }
    for k, c in got.cells.items():
        assert c.sum == pytest.approx(want.cells[k].sum)
    again = LayoutSums()
    again.plus(flat_sums)
    assert again.folded().members == got.members  # a copy with its counts

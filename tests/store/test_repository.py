"""The store on both backends: atomic scrape commits, windows, restart resume, compaction."""

from __future__ import annotations

import itertools
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collector.analytics.serving import derive
from collector.rollup import HOUR_SECONDS, MINUTE_SECONDS, SeriesIdent
from collector.sources.vllm import Kind, SeriesKey, read_scrape
from collector.store.repository import Store
from tests.vllm_fixtures import FAMILIES, Observations, render, workload

MODEL = "m"
PROMPT = SeriesIdent(SeriesKey(MODEL, "prompt_tokens"), Kind.COUNTER)


def scrape(obs: Observations, version: str = "0.33"):  # type: ignore[no-untyped-def]
    return read_scrape(render(FAMILIES[version], {(MODEL, "0"): obs}))


class Collector:
    """What TargetScraper does, without HTTP: observe, commit to the store, adopt the state."""

    def __init__(self, store: Store, name: str = "t1") -> None:
        self.store = store
        self.target_id = store.ensure_target(name, f"http://127.0.0.1:1/{name}")
        self.tracker, self.ids = store.load_tracker(self.target_id)

    def scrape(self, obs: Observations, now: float, version: str = "0.33") -> None:
        snap = scrape(obs, version)
        deltas = self.tracker.observe(snap, now)
        self.store.commit_scrape(self.target_id, deltas, snap.units, self.ids, now)
        self.tracker.commit(deltas, now)


def totals(store: Store, start: int, end: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for sc in store.read_window(start, end):
        if sc.ident.kind is not Kind.GAUGE:
            out[sc.ident.key.metric] = out.get(sc.ident.key.metric, 0.0) + sc.cell.value
    return out


def test_scrapes_accumulate_into_minute_rows(store: Store) -> None:
    c = Collector(store)
    c.scrape(workload(1), 6000.0)
    c.scrape(workload(2), 6015.0)  # same minute
    c.scrape(workload(3), 6075.0)  # next minute
    rows = {(sc.ident.key.metric): sc for sc in store.read_window(6000, 6060)}
    assert rows["prompt_tokens"].cell.value == 5000.0
    assert rows["prompt_tokens"].cell.observed_seconds == 15.0
    assert totals(store, 6000, 6120)["prompt_tokens"] == 10000.0
    assert totals(store, 6060, 6120)["request_success"] == 20.0
    ttft = next(sc for sc in store.read_window(6000, 6120) if sc.ident.key.metric == "ttft")
    assert ttft.ident.bounds == tuple(FAMILIES["0.33"].ttft_bounds)
    assert ttft.cell.buckets is not None and ttft.cell.buckets[-1] == 40.0


def test_a_collector_restart_resumes_deltas_and_loses_nothing(db_url: str) -> None:
    first = Store(db_url)
    c = Collector(first)
    c.scrape(workload(1), 6000.0)
    c.scrape(workload(2), 6015.0)
    first.close()

    second = Store(db_url)  # a new process: state comes from the database
    c2 = Collector(second)
    assert c2.tracker.baseline_unix == 6015.0
    c2.scrape(workload(4), 6030.0)
    assert totals(second, 6000, 6060)["prompt_tokens"] == 15000.0  # 5000 + 10000, none lost or doubled
    gen = next(sc for sc in second.read_window(6000, 6060) if sc.ident == PROMPT)
    assert gen.cell.observed_seconds == 30.0
    second.close()


def test_only_changed_series_store_their_state_and_a_restart_still_resumes_exactly(db_url: str) -> None:
    """An idle server's scrape writes its minute cells but no series state (nothing changed): the
    stored state is still the truth a restarted collector resumes from."""
    first = Store(db_url)
    c = Collector(first)
    c.scrape(workload(1), 6000.0)
    c.scrape(workload(2), 6015.0)
    snap = scrape(workload(2))  # no request since the last scrape
    deltas = c.tracker.observe(snap, 6030.0)
    assert deltas.state == {} and deltas.cells
    first.commit_scrape(c.target_id, deltas, snap.units, c.ids, 6030.0)
    c.tracker.commit(deltas, 6030.0)
    changed = c.tracker.observe(scrape(workload(3)), 6040.0)
    assert PROMPT in changed.state and changed.state[PROMPT].value == 15000.0
    first.close()

    second = Store(db_url)  # a new process: state comes from the database
    c2 = Collector(second)
    assert c2.tracker.state == c.tracker.state and c2.tracker.baseline_unix == 6030.0
    c2.scrape(workload(3), 6045.0)
    assert totals(second, 6000, 6060)["prompt_tokens"] == 10000.0  # from workload 1 to 3, once
    rows = {sc.ident: sc.cell for sc in second.read_window(6000, 6060)}
    assert rows[PROMPT].observed_seconds == 45.0  # the idle scrape's 15 s are covered too
    second.close()


def test_a_vllm_restart_mid_window_gives_no_negative_delta(store: Store) -> None:
    c = Collector(store)
    c.scrape(workload(1), 6000.0)
    c.scrape(workload(3), 6015.0)
    c.scrape(workload(1), 6030.0)  # vLLM restarted: counters back to one workload
    c.scrape(workload(2), 6045.0)
    t = totals(store, 6000, 6060)
    assert t["prompt_tokens"] == 5000.0 * (2 + 1 + 1)
    assert all(sc.cell.value >= 0 for sc in store.read_window(6000, 6060))


def test_commit_is_atomic_and_failed_writes_change_nothing(store: Store) -> None:
    c = Collector(store)
    c.scrape(workload(1), 6000.0)
    c.scrape(workload(2), 6015.0)
    before = totals(store, 6000, 6060)
    snap = scrape(workload(3))
    deltas = c.tracker.observe(snap, 6030.0)
    bad_ids = dict(c.ids)
    bad_ids[PROMPT] = 10**9  # a series id that violates the foreign key: the transaction must roll back
    with pytest.raises(Exception):  # noqa: B017 - any database error
        store.commit_scrape(c.target_id, deltas, snap.units, bad_ids, 6030.0)
    assert totals(store, 6000, 6060) == before
    reloaded, _ = store.load_tracker(c.target_id)
    assert reloaded.baseline_unix == 6015.0


def test_window_reads_filter_by_target_and_model(store: Store) -> None:
    a, b = Collector(store, "a"), Collector(store, "b")
    for col in (a, b):
        col.scrape(workload(1), 6000.0)
        col.scrape(workload(2), 6015.0)
    assert {sc.target for sc in store.read_window(6000, 6060, target="a")} == {"a"}
    assert store.read_window(6000, 6060, model="nope") == []
    assert store.target_names() == ["a", "b"]


def test_a_reader_learns_the_series_another_collector_creates_after_its_first_read(db_url: str) -> None:
    """Reads take each series' target, identity and unit from memory, learnt once per series:
    series that another collector on the same database (a shard) or this one creates later,
    and a new bucket layout, are read with their own target, identity and unit; every filter
    keeps exactly the rows that an unfiltered read holds for it."""
    reader, writer = Store(db_url), Store(db_url)
    a = Collector(reader, "a")
    a.scrape(workload(1), 6000.0)
    a.scrape(workload(2), 6015.0)
    first = reader.read_rows(6000, 6060)
    assert {r.cell.target for r in first} == {"a"}
    b = Collector(writer, "b")  # created by the other store: unknown to the reader so far
    b.scrape(workload(1), 6020.0, version="0.6")
    b.scrape(workload(3), 6035.0, version="0.6")
    a.scrape(workload(3), 6030.0, version="0.6")  # a restart with another bucket layout: new series
    rows = reader.read_rows(6000, 6060)
    assert {r.cell.target for r in rows} == {"a", "b"}
    stored = {(r.cell.target, r.cell.ident): r.cell for r in writer.read_rows(6000, 6060)}
    assert {(r.cell.target, r.cell.ident): r.cell for r in rows}.keys() == stored.keys()
    for r in rows:
        want = stored[(r.cell.target, r.cell.ident)]
        assert r.cell.unit == want.unit and r.cell.cell.value == want.cell.value
        assert r.cell.cell.buckets == want.cell.buckets
        assert (r.start_unix, r.period_seconds) == (6000, MINUTE_SECONDS)
    ttft_b = [r.cell for r in rows if r.cell.target == "b" and r.cell.ident.key.metric == "ttft"]
    assert [len(sc.ident.bounds) for sc in ttft_b] == [len(FAMILIES["0.6"].ttft_bounds)]
    assert ttft_b[0].cell.value == 40.0  # workload 3 less workload 1 (the first scrape is the baseline)

    def keys(got: list) -> set:  # type: ignore[type-arg]
        return {(r.cell.target, r.cell.ident) for r in got}

    everything = keys(rows)
    for chosen, want_rows in (
        (reader.read_rows(6000, 6060, target="b"), {k for k in everything if k[0] == "b"}),
        (reader.read_rows(6000, 6060, targets_in=["b"]), {k for k in everything if k[0] == "b"}),
        (reader.read_rows(6000, 6060, metrics=["ttft", "prompt_tokens"]),
         {k for k in everything if k[1].key.metric in ("ttft", "prompt_tokens")}),
        (reader.read_rows(6000, 6060, model=MODEL, target="a"), {k for k in everything if k[0] == "a"}),
        (reader.read_rows(6000, 6060, model="nope"), set()),
    ):  # fmt: skip
        assert keys(chosen) == want_rows
    assert {(sc.target, sc.ident) for sc in reader.read_minute(6000, targets_in=["a"])} == {
        k for k in everything if k[0] == "a"
    }
    assert reader.read_minute(6060) == []
    reader.close()
    writer.close()


def test_compaction_merges_whole_old_hours_and_keeps_totals(store: Store) -> None:
    c = Collector(store)
    c.scrape(workload(1), 0.0)
    for i in range(1, 130):  # 129 scrapes a minute apart: just over two hours
        c.scrape(workload(1 + i), i * 60.0)
    end = 130 * 60
    before = derive(store.read_window(0, end), end)
    minutes, expired = store.compact(
        now_unix=end + 3600.0, minute_retention_seconds=3600.0, hour_retention_seconds=30 * 86400.0
    )
    assert minutes == 120 * 23 and expired == 0  # hours 0 and 1 compacted; 23 series (with the busy gauge)
    assert store.count_rollups(HOUR_SECONDS) == 2 * 23
    after = derive(store.read_window(0, end), end)
    assert after.requests == before.requests == 129 * 20
    assert after.prompt_tokens_per_second == pytest.approx(before.prompt_tokens_per_second)
    assert after.latencies["ttft"].quantiles == before.latencies["ttft"].quantiles
    # hour rows count only when wholly inside the window: [1800, 7800) holds hour 3600 and
    # the ten minutes from 7200, not hour 0
    assert totals(store, 1800, end)["request_success"] == 20.0 * (60 + 10)
    store.compact(now_unix=40 * 86400.0, minute_retention_seconds=3600.0, hour_retention_seconds=30 * 86400.0)
    assert store.count_rollups(HOUR_SECONDS) == 0
    assert store.count_rollups(MINUTE_SECONDS) == 0


def test_a_new_bucket_layout_gets_its_own_stored_series(store: Store) -> None:
    c = Collector(store)
    c.scrape(workload(1), 6000.0, version="0.6")
    c.scrape(workload(2), 6015.0, version="0.6")
    c.scrape(workload(1), 6030.0, version="0.33")  # upgraded: restarted with new buckets
    ttft = [sc for sc in store.read_window(6000, 6060) if sc.ident.key.metric == "ttft"]
    assert sorted(len(sc.ident.bounds) for sc in ttft) == [16, 22]
    assert sum(sc.cell.value for sc in ttft) == 40.0


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**52), 2**52), max_size=40))
def test_bucket_text_is_what_json_writes_and_reads_back(values: list[float]) -> None:
    """The commit path's float-list encoding writes exactly json.dumps' text (rows written before
    it and after it are one format) and reads back to the same numbers (orjson's parse, or
    float() of each item where strict JSON has no spelling: NaN, infinities)."""
    from collector.store.repository import _decode_floats, _encode_floats

    text = _encode_floats(values)
    assert text == json.dumps(values)
    back = _decode_floats(text)
    assert back is not None and len(back) == len(values)
    assert all(type(a) is float for a in back)  # an older writer's integers read back as floats
    for a, b in zip(back, values, strict=True):
        assert (math.isnan(a) and math.isnan(b)) or a == b
    assert _encode_floats(None) is None


def test_time_range_reads_search_the_window_index_instead_of_scanning_every_row(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The running windows read each closed minute, drift and the reports read ranges: with 48 h
    of minute rows at fleet size a full scan per read is tens of millions of rows. SQLite's own
    query plan for every statement these reads send must search the window index."""
    from sqlalchemy import event

    store = Store(f"sqlite:///{tmp_path / 'plan.db'}")
    c = Collector(store)
    for i, now in enumerate((6000.0, 6015.0, 6075.0, 9700.0)):
        c.scrape(workload(i + 1), now)
    store.compact(10_800.0, 3600.0, 90 * 86400.0)  # minutes before 7200 become the hour row of 3600
    sent: list[tuple[str, object]] = []

    def record(_conn, _cursor, statement, parameters, _context, _many) -> None:  # type: ignore[no-untyped-def]
        if "llmslo_rollups" in statement:
            sent.append((statement, parameters))

    event.listen(store.engine, "before_cursor_execute", record)
    rows = store.read_rows(0, 20_000, metrics=["prompt_tokens"])
    assert {r.period_seconds for r in rows} == {MINUTE_SECONDS, HOUR_SECONDS}  # both periods still read
    assert totals(store, 3600, 10_800)["prompt_tokens"] == 5000.0 * 3  # the first scrape is the baseline
    assert store.coverage(0, 20_000)
    assert store.first_unix() == 3600
    event.remove(store.engine, "before_cursor_execute", record)
    assert len(sent) >= 4
    with store.engine.connect() as conn:
        for statement, parameters in sent:
            plan = " / ".join(str(r[-1]) for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters))
            assert "SCAN llmslo_rollups" not in plan, (statement, plan)
    store.close()


def test_long_reads_take_minutes_of_a_large_fleet_and_hours_of_compacted_history(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`Runtime.read_spans`: the pieces the report, cost and capacity read a long period in cover
    it exactly, once; where minutes are kept (the retention to now) a piece holds about
    READ_CELLS cells of the fleet's series, before it an hour (compacted: one cell per series)."""
    import time

    from collector.config import Settings
    from collector.rollup import READ_CELLS, read_step
    from collector.runtime import Runtime

    assert [read_step(n) for n in (0, 1_600, 1_700, 24_000, 100_000, 10**7)] == [3600, 3600, 1800, 240, 60, 60]
    rt = Runtime(Settings(targets=[]), Store("sqlite://"))
    monkeypatch.setattr(rt.store, "series_count", lambda: 24_000)  # 1,000 targets of 24 series
    now = int(time.time())
    start, end = now - now % 3600 - 7 * 86400 + 1234, now - now % 60
    spans = list(rt.read_spans(start, end, start - 86400))
    assert spans[0][0] == start and spans[-1][1] == end
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))  # no gap, no overlap
    old = [b - a for a, b in spans if b <= now - 48 * 3600 - 2 * 3600]
    recent = [b - a for a, b in spans if a >= now - 48 * 3600]
    assert old and max(old) == 3600 and recent and max(recent) == 240 and READ_CELLS >= 240 * 24_000 / 60
    assert list(rt.read_spans(start, end, None)) == []  # nothing stored: nothing read
    assert next(iter(rt.read_spans(0, end, end - 600)))[0] == end - 600 - (end - 600) % 3600  # not from 1970
    rt.store.close()

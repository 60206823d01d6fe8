"""The incremental SLO ledger against the full re-read of the stored rollups: the same statuses
(events per window and period, budgets, burn rates, firing pairs) on one committed history with
traffic on every business type, an error burst, slow requests, a vLLM restart, gateway spans, a
throughput objective, a collector restart (backfill) and minutes compacted into hours."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from collector.config import Settings
from collector.runtime import Runtime
from collector.sim.exposition import EngineMetrics, render
from collector.slo.evaluate import SloStatus
from collector.slo.ledger import Ring
from collector.traces.normalize import RequestRecord
from collector.traces.store import ingest
from tests.reads import record_reads

RULES = """\
version: v1
min_events: 5
business_types:
  chat:
    objectives:
      - {name: ttft, sli: latency, metric: ttft, threshold: 1s, objective: 0.95}
      - {name: ttft_between, sli: latency, metric: ttft, threshold: 0.7s, objective: 0.9}
      - {name: errors, sli: error_ratio, objective: 0.99}
      - {name: goodput, sli: goodput, objective: 0.9}
      - {name: gw_ttft, sli: latency, source: traces, metric: ttft, threshold: 800ms, objective: 0.9}
  batch:
    objectives:
      - {name: throughput, sli: throughput, min_tokens_per_second: 40, slice: 5m, objective: 0.9}
      - {name: errors, sli: error_ratio, objective: 0.99}
      - {name: cost, sli: cost_ceiling, max_usd_per_million_tokens: 0.5, objective: 0.95, slice: 30m}
"""
T0 = 1_800_000_000  # a whole hour


def settings(tmp_path: Path, db_url: str) -> Settings:
    (tmp_path / "rules.yaml").write_text(RULES)
    return Settings.model_validate(
        {
            "data_dir": str(tmp_path),
            "database_url": db_url,
            "rules": str(tmp_path / "rules.yaml"),
            # short minute retention so that compaction into hours happens within the test
            "retention": {"minute_rollups": "3h"},
            "targets": [
                {"name": "chat-0", "url": "http://127.0.0.1:1/a", "business_type": "chat"},
                {"name": "chat-1", "url": "http://127.0.0.1:1/b", "business_type": "chat"},
                {"name": "batch-0", "url": "http://127.0.0.1:1/c", "business_type": "batch"},
            ],
            # priced so that the batch cost per million tokens straddles the 0.5 USD ceiling
            "deployments": [{"name": "batch", "targets": ["batch-0"], "gpu": "L4", "replicas": 1, "gpu_hour_usd": 0.1}],
        }
    )


class Server:
    def __init__(self, rng: random.Random, created: float) -> None:
        self.rng = rng
        self.m = EngineMetrics(max_model_len=8192, created_unix=created)

    def traffic(self, n: int, slow: float, errors: float) -> None:
        m, rng = self.m, self.rng
        for _ in range(n):
            out = rng.randint(20, 400)
            m.generation_tokens += out
            m.prompt_tokens += 200
            reason = "error" if rng.random() < errors else "stop"
            m.finished[reason] = m.finished.get(reason, 0) + 1
            ttft = rng.uniform(1.2, 4.0) if rng.random() < slow else rng.uniform(0.01, 0.9)
            m.hist["time_to_first_token_seconds"].observe(ttft)
            m.hist["request_time_per_output_token_seconds"].observe(0.03)

    def body(self) -> str:
        return render("current", "some-model", self.m)


def spans(rng: random.Random, start: float, n: int, first_id: int) -> list[RequestRecord]:
    out = []
    for i in range(n):
        t = start + rng.uniform(0, 14)
        err = "timeout" if rng.random() < 0.02 else ""
        ttft = rng.uniform(0.1, 1.5)
        out.append(
            RequestRecord(
                (first_id + i).to_bytes(16, "big"), (first_id + i).to_bytes(8, "big"), t - 2, t, "gateway",
                "some-model", "chat", "tenant-a", 100, 0, 50, ttft, 0.02, 2.0, None, "stop", err,
            )
        )  # fmt: skip
    return out


def comparable(statuses: list[SloStatus]) -> dict[str, object]:
    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 6)

    return {
        s.objective.slo: (
            {w: (r(v.events.good), r(v.events.total), v.events.exact) for w, v in s.windows.items()},
            (r(s.period.events.good), r(s.period.events.total)),
            r(s.budget_remaining),
            tuple((p.firing, r(p.long_burn), r(p.short_burn)) for p in s.pairs),
            s.no_data_reason,
        )
        for s in statuses
    }


def run_history(rt: Runtime, rng: random.Random, servers: dict[str, Server], t_from: int, t_to: int) -> None:
    span_id = t_from
    for t in range(t_from, t_to, 15):
        minute = (t - T0) // 60
        incident = 200 <= minute < 230  # errors and slow requests on chat for half an hour
        for name, server in servers.items():
            if name == "batch-0":
                server.traffic(rng.randint(0, 3) if minute % 37 else 0, 0.0, 0.001)
            else:
                server.traffic(rng.randint(2, 6), 0.5 if incident else 0.02, 0.2 if incident else 0.002)
            rt.scrapers[name].ingest(server.body(), "text/plain", float(t))
        if minute == 150 and t % 60 == 0:
            servers["chat-1"] = Server(rng, float(t - 5))  # vLLM restarted: counters from zero
        records = spans(rng, t, rng.randint(0, 4), span_id * 10)
        span_id += 1
        ingest(rt.store, records, rt.traces.targets_of(), rt.ledger.add_requests if rt.ledger else None)


@pytest.mark.parametrize("minute_read", [None, 300])
def test_ledger_matches_the_full_re_read(
    tmp_path: Path, db_url: str, minute_read: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger filled from the store and then counting live equals a full re-read. With
    `minute_read`, the fill reads the stored minutes that many seconds at a time, as it does for
    a large fleet (`rollup.read_step`), cutting the throughput and cost slices across reads
    (before the minute retention, where no minutes are stored, an hour at a time)."""
    rng = random.Random(11)
    rt = Runtime(settings(tmp_path, db_url))
    servers = {name: Server(rng, T0 - 30) for name in rt.scrapers}
    # part of the history happened before this collector process started: it is backfilled
    run_history(rt, rng, servers, T0, T0 + 3 * 3600)
    rt.compact(T0 + 5 * 3600)  # minutes older than 3 h before that became hours
    rt.store.close()
    rt = Runtime(settings(tmp_path, db_url))
    assert rt.ledger is not None
    minute_reads: list[int] = []
    if minute_read is not None:
        import collector.runtime as runtime_module

        monkeypatch.setattr(runtime_module, "read_step", lambda series: minute_read)
        minute_reads = record_reads(monkeypatch, rt.store, period=60, nonempty=True)
    rt.ledger.live_since = T0 + 3 * 3600  # the "restart": live from here, the rest is backfilled
    checked = 0
    start = T0 + 3 * 3600
    for now in (T0 + 3 * 3600 + 300, T0 + 4 * 3600 + 100, T0 + 6 * 3600 + 600):
        run_history(rt, rng, servers, start, now)  # evaluation runs at the newest time, as served
        start = now
        assert rt.rules is not None
        want, _ = rt._evaluate_from_store(rt.rules, now - 1.0)
        got = rt.evaluate_slos(now - 1.0)
        assert comparable(got) == comparable(want)
        checked += sum(1 for s in want if s.period.events.total > 0)
    assert checked >= 10  # the comparison covered real events, not empty windows
    statuses = {s.objective.slo: s for s in got}
    assert statuses["chat-ttft"].period.events.bad > 0
    assert not statuses["chat-ttft-between"].exact  # 0.7 s is not a bucket bound: flagged, both ways
    assert statuses["batch-throughput"].period.events.total > 0
    assert statuses["chat-gw-ttft"].period.events.total > 0
    cost = statuses["batch-cost"].period.events
    assert cost.total >= 8 and 0 < cost.good < cost.total  # half-hour slices, some over the ceiling
    if minute_read is not None:
        assert minute_reads and max(minute_reads) == minute_read
    rt.store.close()


def test_ring_keeps_a_fixed_span_and_sums_whole_slots() -> None:
    ring = Ring(60, 10)
    for minute in range(25):
        ring.add(minute * 60 + 7, 1.0, 2.0)  # any second inside the minute lands in its slot
    assert ring.sum(0, 25 * 60) == (10.0, 20.0)  # only the last 10 minutes are held
    assert ring.sum(20 * 60, 22 * 60) == (2.0, 4.0)
    assert ring.sum(20 * 60 + 1, 22 * 60) == (1.0, 2.0)  # a slot partly outside is not counted
    ring.add(100 * 60, 1.0, 1.0)  # a jump forward clears what the ring reused
    assert ring.sum(0, 101 * 60) == (1.0, 1.0)
    ring.add(3 * 60, 5.0, 5.0)  # older than the ring reaches: ignored
    assert ring.sum(0, 101 * 60) == (1.0, 1.0)


pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.mark.parametrize("offset", [15, 30, 45])
def test_a_restart_mid_minute_counts_that_minute_once_and_whole(tmp_path: Path, offset: int) -> None:
    """The collector restarts `offset` seconds into a minute: what the earlier process stored of
    that minute is counted (backfilled) and what the new one commits is counted live, once each."""
    rng = random.Random(offset)
    db_url = f"sqlite:///{tmp_path / 'llmslo.db'}"
    rt = Runtime(settings(tmp_path, db_url))
    servers = {name: Server(rng, T0 - 30) for name in rt.scrapers}
    restart = T0 + 40 * 60 + offset
    run_history(rt, rng, servers, T0, restart)
    rt.store.close()
    rt = Runtime(settings(tmp_path, db_url))
    assert rt.ledger is not None
    rt.begin_live_counting(restart)  # as `start` does, then each target's counters resumed
    for scraper in rt.scrapers.values():
        asyncio.run(scraper.load())
    run_history(rt, rng, servers, restart, restart + 600)
    assert rt.rules is not None
    now = restart + 600 - 1.0
    want, _ = rt._evaluate_from_store(rt.rules, now)
    got = rt.evaluate_slos(now)
    assert comparable(got) == comparable(want)
    errors = {s.objective.slo: s for s in got}["chat-errors"].windows
    assert max(w.events.total for w in errors.values()) > 0
    rt.store.close()

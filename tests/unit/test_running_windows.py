"""Long serving windows as running sums (collector/analytics/running.py) against a merge of the
stored minutes: the same report at every pass of a realistic timeline (traffic changing, a gauge
spiking and leaving the window, a vLLM restart, a target appearing late, a pause longer than the
window, passes inside a minute's grace)."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from collector.analytics.running import ClosedView
from collector.analytics.serving import build_report
from collector.config import Settings
from collector.runtime import Runtime, window_bounds
from collector.sim.exposition import EngineMetrics, render
from tests.rounding import rounded

T0 = 1_800_000_000


class Server:
    def __init__(self, rng: random.Random, created: float) -> None:
        self.rng = rng
        self.m = EngineMetrics(max_model_len=4096, created_unix=created)

    def step(self, load: int, waiting: int) -> str:
        m = self.m
        for _ in range(load):
            m.prompt_tokens += 300
            m.generation_tokens += self.rng.randint(10, 200)
            m.finished["stop"] = m.finished.get("stop", 0) + 1
            m.hist["time_to_first_token_seconds"].observe(self.rng.uniform(0.01, 3.0))
            m.hist["e2e_request_latency_seconds"].observe(self.rng.uniform(0.5, 20.0))
        m.waiting = waiting
        m.running = load
        m.kv_usage = self.rng.random()
        return render("current", "m", m)


def as_text(view: ClosedView) -> list[str]:
    """A view's cells and the ones its readers derive, as text (NaN equals NaN)."""
    return sorted(repr(sc) for sc in [*view.cells.values(), *view.copies(), *view.scalars().values()])


@pytest.mark.parametrize("serving", [False, True])
def test_running_windows_match_a_re_read_of_the_store(tmp_path: Path, serving: bool) -> None:
    """`serving`: as `llmslo serve` runs, the minute that just closed is taken from the scrapers'
    memory (Runtime._closed_minutes) when every scraper still keeps it; else from the store."""
    settings = Settings.model_validate(
        {
            "data_dir": str(tmp_path),
            "windows": ["1m", "5m", "20m"],
            "targets": [
                {"name": "a", "url": "http://127.0.0.1:1/a", "business_type": "chat"},
                {"name": "b", "url": "http://127.0.0.1:1/b", "business_type": "batch"},
            ],
        }
    )
    rt = Runtime(settings)
    rt.started = serving
    rng = random.Random(3)
    servers = {"a": Server(rng, T0 - 10), "b": Server(rng, T0 - 10)}
    compared = 0
    held: list[tuple[ClosedView, list[str]]] = []
    t = T0
    while t < T0 + 3 * 3600:
        minute = (t - T0) // 60
        if 70 <= minute < 95:
            t += 15  # both targets down for 25 minutes: longer than the 20m window
            continue
        for name, server in servers.items():
            if name == "b" and (minute < 12 or 40 <= minute < 43):
                continue  # b appears late, and is down for three minutes (its series leave the 5m window)
            if name == "a" and minute == 130 and t % 60 == 0:
                servers["a"] = server = Server(rng, float(t - 3))  # vLLM restart
            waiting = 40 if minute == 30 else rng.randint(0, 3)  # a spike that later leaves the window
            rt.scrapers[name].ingest(server.step(rng.randint(0, 8), waiting), "text/plain", float(t))
        now = t + 3.0  # passes at seconds 3, 18, 33, 48: the first is inside the previous minute's grace
        if minute % 7 == 0 or 29 <= minute <= 55:
            rt.refresh_snapshot(now)
            # a view keeps the window as it was when taken (a pass's groups are derived from it
            # later): the advance changes the windows' series copy-on-write, never a view's cells
            for view, before in held:
                assert as_text(view) == before, minute
            held = [(v, as_text(v)) for w in (300.0, 1200.0) if (v := rt.running.view(w, now)) is not None]
            for w in (300.0, 1200.0):
                got = rt.report(w, now)
                assert rt.running.closed(w, now) is not None  # the running path answered
                start, end = window_bounds(now, w)
                want = build_report(rt.store.read_window(start, end), w, start, end, rt.business_type_of)
                assert rounded(dataclasses.asdict(got)) == rounded(dataclasses.asdict(want)), (minute, w)
                compared += 1
        t += 15
    assert compared > 200
    assert rt.running.rebuilds == 2  # the first pass and after the outage; otherwise minute by minute
    # serving, the minute that closed came from memory on each pass a minute after the previous one
    # (44 here; passes 7 minutes apart read the older minutes from the store, as before b's first scrape)
    assert (rt.closed_from_memory > 30) if serving else rt.closed_from_memory == 0
    # and the store was read minute by minute, not the whole window per pass
    assert rt.running.minutes_read < 3 * 3 * 180

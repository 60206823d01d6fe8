"""The sliding windows' counters and gauges merged column by column (collector/windowcells.py,
`RecentScrape.layout`) against `Cell.merge` of every scrape's cells, exactly, at every scrape of a
timeline a real fleet has: a finished reason appearing mid-window (a new series: the layout
changes), a vLLM restart, a target down longer than the window, gauges going up and down, a
V0 server (other series) beside a current one, and a second model appearing on one target."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

from collector.config import Settings
from collector.rollup import SeriesCell, SeriesIdent
from collector.runtime import Runtime
from collector.sim.exposition import EngineMetrics, render
from collector.windowcells import Recent, recent_of, sliding_cells

T0 = 1_800_000_000


def merged_by_cells(recent: Recent, now: float, window: float) -> list[SeriesCell]:
    """The reference: each target's scalar cells of the scrapes in (now - window, now], merged."""
    out: list[SeriesCell] = []
    for name, scrapes in recent:
        merged: dict[SeriesIdent, SeriesCell] = {}
        for scrape in scrapes:
            if not now - window < scrape.unix <= now:
                continue
            for ident, cell in scrape.scalars:
                have = merged.get(ident)
                if have is None:
                    merged[ident] = SeriesCell(name, ident, scrape.units.get(ident.key, ""), cell.copy())
                else:
                    have.cell.merge(cell)
        out.extend(merged.values())
    return out


def one_body(bodies: list[str]) -> str:
    """Several models' expositions as one server's: each family's HELP and TYPE once, then the
    samples of every model (a series without a model label, such as the cache config, once)."""
    families: dict[str, list[str]] = {}
    seen: set[str] = set()
    for body in bodies:
        name = ""
        for line in body.splitlines():
            if line.startswith("# HELP "):
                name = line.split()[2]
                if name in families:
                    continue
                families[name] = [line]
            elif line.startswith("# TYPE "):
                if len(families[name]) == 1:
                    families[name].append(line)
            elif line.rsplit(" ", 1)[0] not in seen:
                seen.add(line.rsplit(" ", 1)[0])
                families[name].append(line)
    return "".join(line + "\n" for lines in families.values() for line in lines)


def exact(cells: list[SeriesCell]) -> list[Any]:
    """Every field of every cell, NaN as None (NaN equals nothing, not even itself)."""

    def plain(v: Any) -> Any:
        return None if isinstance(v, float) and math.isnan(v) else v

    return [
        (sc.target, sc.ident, sc.unit, *(plain(getattr(sc.cell, f)) for f in sc.cell.__dataclass_fields__))
        for sc in cells
    ]


def test_column_merges_equal_cell_merges_exactly(tmp_path: Path) -> None:
    settings = Settings.model_validate(
        {
            "data_dir": str(tmp_path),
            "windows": ["1m", "5m", "1h"],
            "targets": [
                {"name": "a", "url": "http://127.0.0.1:1/a", "business_type": "chat"},
                {"name": "old", "url": "http://127.0.0.1:1/old", "business_type": "chat"},
                {"name": "two", "url": "http://127.0.0.1:1/two", "business_type": "batch"},
            ],
        }
    )
    rt = Runtime(settings)
    rng = random.Random(11)
    servers: dict[str, list[tuple[str, str, EngineMetrics]]] = {
        "a": [("current", "llama", EngineMetrics(4096, T0 - 5))],
        "old": [("0.6", "llama", EngineMetrics(8192, T0 - 5))],
        "two": [("current", "mixtral", EngineMetrics(4096, T0 - 5))],
    }
    by_columns = by_cells = 0
    t = T0
    while t < T0 + 40 * 60:
        minute = (t - T0) // 60
        if 20 <= minute < 27 and t % 60 == 0:
            t += 15  # "two" and "a" miss some scrapes; below, "old" is down for 7 minutes
        for name, engines in servers.items():
            if name == "old" and 20 <= minute < 27:
                continue
            if name == "a" and minute == 12 and t % 60 == 30:
                engines[0] = ("current", "llama", EngineMetrics(4096, float(t - 4)))  # vLLM restarts
            if name == "two" and minute == 30 and t % 60 == 0:
                engines.append(("current", "qwen", EngineMetrics(4096, float(t - 2))))  # a second model
            bodies = []
            for version, model, m in engines:
                load = rng.randint(0, 6)
                m.prompt_tokens += 100 * load
                m.generation_tokens += rng.randint(0, 50) * load
                m.finished["stop"] = m.finished.get("stop", 0) + load
                if minute >= 8 and rng.random() < 0.2:  # a reason not seen before: a new series
                    m.finished["length"] = m.finished.get("length", 0) + 1
                m.running, m.waiting, m.kv_usage = load, rng.randint(0, 4), rng.random()
                bodies.append(render(version, model, m))
            assert rt.scrapers[name].ingest(one_body(bodies), "text/plain", float(t))
        now = t + 2.0
        recent = recent_of(rt.scrapers)
        for w in (60.0, 300.0):
            got = sliding_cells(recent, now, w, histograms=False)
            assert exact(got) == exact(merged_by_cells(recent, now, w)), (minute, t % 60, w)
            for _, scrapes in recent:
                inside = [s for s in scrapes if now - w < s.unix <= now]
                if inside and all(s.layout is inside[0].layout is not None for s in inside):
                    by_columns += 1
                else:
                    by_cells += 1
        t += 15
    # most windows are merged by columns; a new reason, a restart, a new model each merge by cells
    assert by_columns > 10 * by_cells > 0, (by_columns, by_cells)


def test_a_scrape_not_as_observe_makes_it_has_no_layout(tmp_path: Path) -> None:
    """A cell that is not one scrape's fresh delta or sample (say, a merged one) is not taken
    as a column: its window is merged cell by cell."""
    from collector.rollup import Cell
    from collector.sources.scrape import RecentScrape
    from collector.sources.vllm import Kind, SeriesKey

    counter = SeriesIdent(SeriesKey("m", "prompt_tokens"), Kind.COUNTER)
    gauge = SeriesIdent(SeriesKey("m", "requests_running"), Kind.GAUGE)
    fresh = {
        counter: Cell(Kind.COUNTER, value=3.0, observed_seconds=15.0, last_unix=T0),
        gauge: Cell(Kind.GAUGE, sum=2.0, gmin=2.0, gmax=2.0, glast=2.0, n=1, observed_seconds=15.0, last_unix=T0),
    }
    one = RecentScrape.of(T0, fresh, {})
    assert one.layout is not None and one.values == (3.0, 2.0) and one.layout.gauges == (1,)
    again = RecentScrape.of(T0 + 15, dict(fresh), {}, one)
    assert again.layout is one.layout  # shared while the series stay the same
    two_samples = dict(fresh)
    two_samples[gauge] = Cell(Kind.GAUGE, sum=5.0, gmin=2.0, gmax=3.0, glast=3.0, n=2, observed_seconds=15.0)
    assert RecentScrape.of(T0, two_samples, {}).layout is None
    other_time = dict(fresh)
    other_time[counter] = Cell(Kind.COUNTER, value=3.0, observed_seconds=14.0, last_unix=T0)
    assert RecentScrape.of(T0, other_time, {}).layout is None

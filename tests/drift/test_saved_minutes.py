"""The drift reference's engine minutes saved in the store (collector/drift/saved.py): a new process
loads them instead of reading every target's rollups of the reference again, and its references
and findings are those of a monitor that reads the whole reference from the rollups."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from collector.config import DriftConfig, TargetConfig
from collector.drift.engine import Population
from collector.drift.monitor import DriftMonitor
from collector.drift.saved import SavedMinutes, decode, encode, mapping_fingerprint
from collector.runtime import Runtime
from collector.slo.spec import load_rules
from collector.store.repository import Store
from collector.store.tables import drift_minutes
from collector.traces.store import read_requests, request_volumes
from tests.drift.test_drift_on_the_simulator import SHIFT_AT, run, same_reference, whole_reader

ROOT = Path(__file__).resolve().parents[2]
SHIFT = f"{{kind: prompt_drift, start: {SHIFT_AT}s, duration: 10m, target: chat, factor: 3.6}}"


def monitor(rt: Runtime, config: DriftConfig, saved: SavedMinutes | None) -> DriftMonitor:
    """A new process's drift monitor (nothing held) on `rt`'s stored rollups."""
    return DriftMonitor(
        config,
        lambda lo, hi, metrics: rt.store.read_rows(lo, hi, metrics=metrics),
        lambda lo, hi, tenants: read_requests(rt.store, lo, hi, tenants=tenants),
        lambda lo, hi: request_volumes(rt.store, lo, hi),
        rt.business_type_of,
        saved=saved,
    )


def saved_rows(store: Store) -> list[tuple[int, str, str]]:
    t = drift_minutes
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(select(t.c.start_unix, t.c.business_type, t.c.fingerprint))]


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> tuple[Runtime, float]:
    """45 simulated minutes with a prompt-length shift of chat at minute 30 (and gateway spans)."""
    rt, t0, _ = run(tmp_path_factory.mktemp("drift-saved"), SHIFT, 45, every=1e9, spans=True)
    return rt, t0


def test_a_restart_loads_the_saved_minutes_and_judges_as_a_whole_re_read(
    history: tuple[Runtime, float], db_url: str
) -> None:
    """A process saves its reference's settled minutes as it reads them; the next one (stopped for
    a few minutes in between) loads them, reads from the rollups only the minutes it was not
    there for, and its references and findings equal a monitor's that reads everything."""
    rt, t0 = history
    config = rt.settings.drift.model_copy(update={"refresh": 120.0, "tenants": True, "min_events": 50})
    fingerprint = mapping_fingerprint(rt.settings.targets, rt.rules)
    saves = Store(db_url)  # the saved minutes on each backend (the rollups stay where the simulator wrote them)
    try:
        first = monitor(rt, config, SavedMinutes(saves, "", fingerprint))
        start = int(t0) + 26 * 60 + 30
        for now in range(start, start + 300, 150):
            first.evaluate(float(now))
        # a first start reads the 25-minute reference from the rollups and saves it; later
        # rebuilds read (and save) only the minutes that entered it
        assert first.minutes_read["saved"] == 0 and first.minutes_read["rollups"] >= 25
        rows = saved_rows(saves)
        markers = sorted(m for m, bt, _ in rows if bt == "")
        assert len(markers) >= 25 and {fp for _, _, fp in rows} == {fingerprint}
        assert {bt for _, bt, _ in rows} > {"", "chat"}  # a row per business type with traffic

        # down for 5 minutes, then a new process
        restart = start + 300 + 300
        second = monitor(rt, config, SavedMinutes(saves, "", fingerprint))
        for i, now in enumerate(range(restart, int(t0) + 45 * 60, 150)):
            second.evaluate(float(now))
            fresh = whole_reader(rt, config)
            fresh.evaluate(float(now))
            same_reference(second, fresh)
            if i == 0:
                # its first rebuild: the minutes saved before the stop loaded, only those of the
                # stop read from the rollups
                assert second.reference is not None
                lo, hi = second.reference.start, second.reference.end
                kept = [m for m in markers if lo <= m < hi]
                assert len(kept) >= 17
                assert second.minutes_read == {"saved": len(kept), "rollups": (hi - lo) // 60 - len(kept)}
        assert any(f.drifted for f in second.latest), "the shift is judged from the loaded reference too"
        # the minutes that left the reference are deleted as it moves on
        oldest = min(m for m, _, _ in saved_rows(saves))
        assert second.reference is not None and oldest >= second.reference.start
    finally:
        saves.close()


def test_another_business_type_mapping_reads_the_rollups_and_replaces_the_saved_minutes(
    history: tuple[Runtime, float], tmp_path: Path
) -> None:
    """A saved minute places each target where the mapping of its time did: a process whose
    targets or rules place them otherwise (another fingerprint) loads none of it."""
    rt, t0 = history
    config = rt.settings.drift.model_copy(update={"refresh": 120.0, "tenants": False, "min_events": 50})
    targets = list(rt.settings.targets)
    fingerprint = mapping_fingerprint(targets, rt.rules)
    moved = [t.model_copy(update={"business_type": "batch"}) if t.name == targets[0].name else t for t in targets]
    other = mapping_fingerprint(moved, rt.rules)
    assert other != fingerprint
    renamed_url = [t.model_copy(update={"url": "http://127.0.0.1:1/metrics"}) for t in targets]
    assert mapping_fingerprint(renamed_url, rt.rules) == fingerprint  # what does not place a model
    added = [*targets, TargetConfig(name="new-0", url="http://127.0.0.1:1/metrics", business_type="chat")]
    assert mapping_fingerprint(added, rt.rules) != fingerprint
    shipped = load_rules(ROOT / "rules").rules  # the rules' model patterns count
    assert mapping_fingerprint(targets, shipped) != fingerprint
    edited = dataclasses.replace(shipped, business_types=shipped.business_types[1:])
    assert mapping_fingerprint(targets, edited) != mapping_fingerprint(targets, shipped)

    saves = Store(f"sqlite:///{tmp_path / 'saves.db'}")
    try:
        now = float(int(t0) + 30 * 60)
        monitor(rt, config, SavedMinutes(saves, "", fingerprint)).evaluate(now)
        assert {fp for _, _, fp in saved_rows(saves)} == {fingerprint}
        again = monitor(rt, config, SavedMinutes(saves, "", other))
        again.evaluate(now)
        assert again.minutes_read["saved"] == 0 and again.minutes_read["rollups"] >= 25
        assert {fp for _, _, fp in saved_rows(saves)} == {other}  # the old mapping's rows are gone
        # another collector's saves (sharded: its own name) are its own
        mine = monitor(rt, config, SavedMinutes(saves, "shard-b", other))
        mine.evaluate(now)
        assert mine.minutes_read["saved"] == 0
    finally:
        saves.close()


def test_a_failing_store_falls_back_to_the_rollups(
    history: tuple[Runtime, float], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The saved minutes' table gone (a database restored without it, a revoked grant): the
    monitor logs it, reads the rollups, and judges as before."""
    rt, t0 = history
    config = rt.settings.drift.model_copy(update={"refresh": 120.0, "tenants": True, "min_events": 50})
    saves = Store(f"sqlite:///{tmp_path / 'saves.db'}")
    try:
        with saves.engine.begin() as conn:
            conn.execute(text("DROP TABLE llmslo_drift_minutes"))
        broken = monitor(rt, config, SavedMinutes(saves, "", "x"))
        now = float(int(t0) + 32 * 60)
        broken.evaluate(now)
        fresh = whole_reader(rt, config)
        fresh.evaluate(now)
        same_reference(broken, fresh)
        assert broken.minutes_read["rollups"] >= 25
        assert "could not load the saved reference minutes" in caplog.text
        assert "could not save the reference minutes" in caplog.text
    finally:
        saves.close()


def test_a_saved_population_reads_back_as_it_was_written() -> None:
    signals = {
        "prompt_length": Population({(10.0, 100.0): [1.0, 2.0, 0.0]}, {}, 250.5, 3.0),
        "finish_reason": Population({}, {"stop": 5.0, "length": 1.0}, 0.0, 6.0),
    }
    assert decode(encode(signals)) == signals


def test_the_collector_saves_its_trailing_reference(history: tuple[Runtime, float]) -> None:
    """`serve`'s runtime saves with the trailing reference (the default), on its own store."""
    rt, t0 = history
    assert rt.drift is not None and rt.drift.saved is not None
    rt.drift.evaluate(float(int(t0) + 40 * 60))
    with rt.store.engine.connect() as conn:
        count = conn.execute(select(func.count()).select_from(drift_minutes)).scalar_one()
    assert count >= 25
    assert rt.drift.minutes_read["rollups"] >= 25

"""Alert episodes outlive the instance's latest state: a re-fire is a second episode, a firing
one has no end, and a restarted collector keeps closing the episode it opened."""

from __future__ import annotations

from pathlib import Path

from collector.slo.alerts import AlertBook
from collector.slo.spec import load_rules
from collector.store.repository import Store

ROOT = Path(__file__).resolve().parents[2]


def test_each_firing_is_one_episode(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'a.db'}")
    rules = load_rules(str(ROOT / "rules"))
    labels = {"alertname": "LLMSLOTargetDown", "business_type": "chat", "severity": "ticket", "target": "chat-0"}
    wanted = {"fp": (labels, {"summary": "chat-0 is down"})}
    book = AlertBook(store)
    book.apply(rules, [], 1000.0, incidents=wanted)  # fires at once (no `for`)
    book.apply(rules, [], 1060.0, incidents=wanted)  # still firing: no new episode
    book.apply(rules, [], 1300.0, incidents={})  # resolved
    again = AlertBook(store)  # a restarted collector
    again.load()
    again.apply(rules, [], 2000.0, incidents=wanted)
    episodes = again.episodes(0, 3000)
    assert [(e.starts_unix, e.ends_unix) for e in episodes] == [(1000.0, 1300.0), (2000.0, None)]
    assert episodes[0].summary == "chat-0 is down" and episodes[0].severity == "ticket"
    assert episodes[0].business_type == "chat" and episodes[0].labels["target"] == "chat-0"
    again.apply(rules, [], 2500.0, incidents={})
    assert [(e.starts_unix, e.ends_unix) for e in again.episodes(0, 3000)][1] == (2000.0, 2500.0)
    # overlap: an episode counts in a period it overlaps, not only where it started
    assert [e.starts_unix for e in again.episodes(1200, 1250)] == [1000.0]
    assert again.episodes(1301, 1999) == []
    store.close()

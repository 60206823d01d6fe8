"""Pinned drift baselines: a reference (its totals and calibrated thresholds) frozen by
`llmslo drift pin` and stored in the database, for `drift.reference: pinned`."""

from __future__ import annotations

import json
import time
from typing import Any

from sqlalchemy import delete, insert, select

from collector.drift.engine import Population, Reference, Threshold
from collector.store.repository import Store
from collector.store.tables import drift_baselines


def dump(ref: Reference) -> str:
    entries = []
    for (group, signal), pop in ref.totals.items():
        t = ref.thresholds[(group, signal)]
        entries.append(
            {
                "business_type": group[0],
                "tenant": group[1],
                "signal": signal,
                "hist": [[list(bounds), counts] for bounds, counts in pop.hist.items()],
                "cats": pop.cats,
                "total": pop.total,
                "events": pop.events,
                "threshold": [t.psi, t.calibrated, t.chunks, t.chunk_mean, t.chunk_std],
            }
        )
    return json.dumps(entries)


def load(text: str, built_unix: float, start: int, end: int) -> Reference:
    totals: dict[tuple[tuple[str, str], str], Population] = {}
    thresholds: dict[tuple[tuple[str, str], str], Threshold] = {}
    for e in json.loads(text):
        key = ((e["business_type"], e["tenant"]), e["signal"])
        totals[key] = Population(
            hist={tuple(b): list(c) for b, c in e["hist"]}, cats=dict(e["cats"]), total=e["total"], events=e["events"]
        )
        thresholds[key] = Threshold(*e["threshold"])
    return Reference(built_unix, start, end, totals, thresholds)


def save(store: Store, name: str, ref: Reference, window_seconds: int) -> None:
    with store.engine.begin() as conn:
        conn.execute(delete(drift_baselines).where(drift_baselines.c.name == name))
        conn.execute(
            insert(drift_baselines).values(
                name=name,
                created_unix=time.time(),
                start_unix=ref.start,
                end_unix=ref.end,
                window_seconds=window_seconds,
                data=dump(ref),
            )
        )


def fetch(store: Store, name: str) -> tuple[Reference, int] | None:
    """The pinned reference named `name` and the window it was calibrated for, or None."""
    with store.engine.connect() as conn:
        row: Any = conn.execute(select(drift_baselines).where(drift_baselines.c.name == name)).first()
    if row is None:
        return None
    return load(row.data, row.created_unix, int(row.start_unix), int(row.end_unix)), int(row.window_seconds)

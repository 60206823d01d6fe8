"""The drift reference's engine minutes saved in the store, so that a restart does not read a day of
every target's rollups again.

The drift monitor (collector/drift/monitor.py) keeps its reference's minutes: per business type and
minute, each signal's population (a few histograms and category counts), reduced from every
target's rows of that minute. A rebuild reads only the minutes that entered the reference since
the last one. A new process held none, so its first rebuild read the whole reference from the
rollups: at a thousand targets a day of them is ~16 million rows, 63 s of a worker thread while
the collector had no drift findings (measured, session 28's restart benchmark).

Now each minute read from the rollups once settled (every scrape of it committed) is saved as the
monitor reduced it: one row per business type with traffic, and a marker row (business type "")
saying the minute is saved whole, quiet or not. A new process loads the saved minutes of its
reference and reads from the rollups only the minutes not saved (those of the time it was down).
Rows older than the reference are deleted as it moves on.

A saved minute holds each (target, model) where the business-type mapping placed it when it was
read. Each row carries a fingerprint of that mapping (the targets' `business_type` and `models`,
the rules' model patterns); a process with another mapping ignores the saved rows and reads the
rollups, as before, so a moved target is judged against a reference that places it where its
current window does. Only the `trailing` reference saves: `hour_of_week` reads a few hours of
each past week (compacted hours), and `pinned` reads nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence

import orjson
from sqlalchemy import delete, select

from collector.config import TargetConfig
from collector.drift.engine import ALL_TENANTS, Minutes, Population
from collector.rollup import MINUTE_SECONDS
from collector.slo.spec import SloRules
from collector.store.repository import Store, upsert
from collector.store.tables import drift_minutes

log = logging.getLogger(__name__)

MARKER = ""  # the business type of the row that marks a minute as saved whole
# of `data` and of what a minute holds: part of the fingerprint, so that a saved minute is never
# misread. Bump it when engine_minutes (collector/drift/engine.py) changes what it reduces.
FORMAT = 1


def mapping_fingerprint(targets: Sequence[TargetConfig], rules: SloRules | None) -> str:
    """A digest of what places a (target, model) in a business type (collector/fleetmap.py)."""
    mapping = {
        "format": FORMAT,
        "targets": sorted(
            (t.name, t.business_type or "", sorted(t.models.items())) for t in targets if t.kind == "vllm"
        ),
        "rules": sorted((bt.name, list(bt.model_patterns)) for bt in rules.business_types) if rules else [],
    }
    return hashlib.sha256(json.dumps(mapping, sort_keys=True).encode()).hexdigest()[:32]


def encode(signals: dict[str, Population]) -> str:
    """A business type's populations of one minute, as JSON (every number a float)."""
    return orjson.dumps(
        {
            name: {
                "hist": [[bounds, [float(c) for c in counts]] for bounds, counts in pop.hist.items()],
                "cats": {k: float(v) for k, v in pop.cats.items()},
                "total": float(pop.total),
                "events": float(pop.events),
            }
            for name, pop in signals.items()
        }
    ).decode()


def decode(text: str) -> dict[str, Population]:
    """`encode`'s populations back (a restart decodes a day of them: orjson, and the floats as
    they come: a day of 13 business types' minutes took 5.5 s with the standard decoder)."""
    return {
        name: Population({tuple(bounds): counts for bounds, counts in d["hist"]}, d["cats"], d["total"], d["events"])
        for name, d in orjson.loads(text).items()
    }


class SavedMinutes:
    """One collector's saved engine minutes in `store` (its `owner`: "" unsharded, else its name),
    for the business-type mapping `fingerprint`."""

    def __init__(self, store: Store, owner: str, fingerprint: str) -> None:
        self.store = store
        self.owner = owner
        self.fingerprint = fingerprint

    def load(self, lo: int, hi: int) -> tuple[Minutes, set[int]]:
        """The saved minutes starting in [lo, hi) for this mapping, and which minutes they cover
        (saved whole: a minute without traffic has its marker only)."""
        t = drift_minutes
        query = select(t.c.start_unix, t.c.business_type, t.c.data).where(
            t.c.owner == self.owner,
            t.c.start_unix >= lo,
            t.c.start_unix < hi,
            t.c.fingerprint == self.fingerprint,
        )
        minutes: Minutes = {}
        covered: set[int] = set()
        with self.store.engine.connect() as conn:
            for start, btype, data in conn.execute(query):
                if btype == MARKER:
                    covered.add(int(start))
                else:
                    minutes.setdefault((btype, ALL_TENANTS), {})[int(start)] = decode(data)
        for group in list(minutes):  # a data row without its marker (never written so) is not used
            by_minute = {m: s for m, s in minutes[group].items() if m in covered}
            if by_minute:
                minutes[group] = by_minute
            else:
                del minutes[group]
        return minutes, covered

    def save(self, minutes: Minutes, covered: Sequence[int], forget_before: int) -> None:
        """Save the engine `minutes` of the minute starts `covered` (each saved whole: a marker
        row, and a row per business type with traffic), and delete this owner's rows of the
        minutes before `forget_before` (they left the reference) or of another mapping."""
        wanted = set(covered)
        rows = [
            {"owner": self.owner, "start_unix": m, "business_type": MARKER, "fingerprint": self.fingerprint,
             "data": "{}"}
            for m in sorted(wanted)
        ]  # fmt: skip
        for (btype, tenant), by_minute in minutes.items():
            if tenant != ALL_TENANTS:
                continue
            for m, signals in by_minute.items():
                if m in wanted:
                    rows.append({"owner": self.owner, "start_unix": m, "business_type": btype,
                                 "fingerprint": self.fingerprint, "data": encode(signals)})  # fmt: skip
        t = drift_minutes
        with self.store.engine.begin() as conn:
            conn.execute(
                delete(t).where(
                    t.c.owner == self.owner,
                    (t.c.start_unix < forget_before) | (t.c.fingerprint != self.fingerprint),
                )
            )
            upsert(conn, t, rows, ["owner", "start_unix", "business_type"], ["fingerprint", "data"])


def minute_starts(lo: int, hi: int, settled: int) -> list[int]:
    """The minutes starting in [lo, hi) that ended by `settled`: a read of [lo, hi) has every row
    of these (a minute's rows all start at its start)."""
    first = lo + (-lo) % MINUTE_SECONDS
    return [m for m in range(first, hi, MINUTE_SECONDS) if m + MINUTE_SECONDS <= settled]

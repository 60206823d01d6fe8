"""The SLO ledger's counts saved in the store, so that a restart does not count the whole SLO period
again from the stored rollups.

The ledger (collector/slo/ledger.py) counts every objective's good and total events per minute
and per hour as scrapes and spans commit. Before, a new process filled it by reading every stored
rollup of the SLO series for the period (28 days by default): a read that grew with the fleet and
its history (59 s for 200 targets and a day; minutes at a thousand targets), during which the
collector had no SLO status and no burn-rate alert.

Now each evaluation pass saves the minute and hour slots that closed since the last pass
(`llmslo_slo_counts`, one row per objective and slot: ~100 rows a minute for 100 objectives,
whatever the fleet's size), with each key's fingerprint and how far the save goes
(`llmslo_slo_count_keys`), and the throughput and cost slices still open as the minutes before
the save's end left them (`slice:<slo>`, `cost:<seconds>` rows; the ledger records per minute what
the live commits add to them, so that the later minutes' part can be taken out), with where the
judged slices ended then. A new process reads those rows back and counts from the stored rollups
only what came after: the minutes from the save's end to the minute it started in. A slice is
thus judged on all its traffic, and once: a slice the earlier process judged is not judged again
from the part of it the rollups give. Without the open slices (sharded collectors, or a save older
than the minutes kept), the rollups are counted from the start of the longest slice running.

What a saved count means is fixed when it is counted, as a Prometheus recording rule's output is:
- an objective whose definition changed (its SLI, metric, threshold, source, slice, minimum rate,
  cost ceiling, or its business type's model patterns or the GPU prices) has a new fingerprint;
  then, as for a new objective, its counts are made again from the stored rollups of the whole
  period, after the first pass and apart from it (`Runtime.recount`), while the other objectives
  resume from their saved counts; until then it is not saved (`save`'s `skip`), and then its
  rows are replaced (`replace_keys`);
- a target added to the configuration, removed, or moved to another business type counts where
  it is from then on; its earlier events stay where they were counted.

Sharded collectors (collector/cluster.py) each save their own ledger under their name: each holds
the whole fleet's counts (its own and what the others published), and saves a minute only once
the others' part of it is in (`cluster.settle` after it). Rules whose windows are scaled below a
minute (tests, the demo's compressed clock) save nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from sqlalchemy import delete, insert, select

from collector.rollup import HOUR_SECONDS, MINUTE_SECONDS
from collector.slo.ledger import Published, SloLedger
from collector.slo.spec import SloRules
from collector.store.repository import Store, upsert
from collector.store.tables import slo_count_keys, slo_counts

log = logging.getLogger(__name__)

SavedRow = tuple[str, int, int, float, float]  # (key, period seconds, start unix, good, total)
# what an objective's counts depend on (not its target ratio, name or description)
COUNTED_FIELDS = (
    "business_type",
    "sli",
    "metric",
    "threshold_seconds",
    "source",
    "min_tokens_per_second",
    "slice_seconds",
    "max_usd_per_million_tokens",
)


def fingerprints(rules: SloRules, prices: object = None) -> dict[str, str]:
    """Per saved key, a digest of what its counts depend on: the objective's counted fields and
    its business type's model patterns (the cache counts: the patterns); a cost ceiling's also
    the GPU prices (`prices`: anything with a stable repr, the cost inventory)."""
    patterns = {bt.name: list(bt.model_patterns) for bt in rules.business_types}
    out = {}
    for bt in rules.business_types:
        for o in bt.objectives:
            counted = {f: getattr(o, f) for f in COUNTED_FIELDS}
            counted["models"] = patterns[bt.name]
            if o.sli == "cost_ceiling":
                counted["prices"] = repr(prices)
            out[o.slo] = _digest(counted)
        out["cache:" + bt.name] = _digest({"models": patterns[bt.name]})
    return out


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:32]


SLICES = "slices"  # the key row of the open slices' parts (slice:<slo>, cost:<seconds> rows)
JUDGED = "judged"  # its through_unix: the slices ending by then were judged when the parts were saved


@dataclass
class Saved:
    """What the store holds: each key's fingerprint, exactness and the end of its save, the
    counts' rows, and the open slices' parts as of `through[SLICES]`."""

    fingerprint: dict[str, str] = field(default_factory=dict)
    exact: dict[str, bool] = field(default_factory=dict)
    through: dict[str, int] = field(default_factory=dict)
    rows: list[SavedRow] = field(default_factory=list)
    slices: list[Published] = field(default_factory=list)


def load(store: Store, owner: str = "") -> Saved:
    """What `owner` saved ("" unsharded, else the collector's name)."""
    saved = Saved()
    k, c = slo_count_keys.c, slo_counts.c
    with store.engine.connect() as conn:
        for key, fp, exact, through in conn.execute(
            select(k.key, k.fingerprint, k.exact, k.through_unix).where(k.owner == owner)
        ):
            saved.through[key] = int(through)
            if key not in (SLICES, JUDGED):
                saved.fingerprint[key], saved.exact[key] = fp, bool(exact)
        found = conn.execute(
            select(c.key, c.period_seconds, c.start_unix, c.good, c.total, c.data).where(c.owner == owner)
        )
        for key, p, s, g, t, data in found:
            if key.startswith(("slice:", "cost:")):
                work = None if data is None else {(v[0], v[1]): [float(x) for x in v[2:]] for v in json.loads(data)}
                saved.slices.append(Published(key, int(s), float(g), float(t), True, work))
            else:
                saved.rows.append((key, int(p), int(s), float(g), float(t)))
    return saved


def changed(saved: Saved, wanted: dict[str, str]) -> set[str]:
    """The keys whose saved counts cannot be used: none saved, or counted for another definition."""
    return {k for k, fp in wanted.items() if saved.fingerprint.get(k) != fp}


def resume_from(
    saved: Saved, wanted: dict[str, str], until: int, align: int, minute_retention: int
) -> tuple[int, bool] | None:
    """Where the stored rollups must be counted again after the saved counts are restored, and
    whether the saved open slices' parts are restored too; None when the saved counts cannot be
    used: a key missing or counted for another definition, or saves that end at different times.

    With the open slices' parts saved at the end of the counts (unsharded), the rollups are
    counted from that end. Without them, from the whole slices (`align` seconds) before it: a
    slice is never judged on part of its traffic. `until`: the minute live counting started in.
    When the rollups from there on may already be compacted into hours (the collector was down
    longer than the minutes are kept), the point is rounded down to the hour too, since a
    compacted hour is read whole or not at all (and the slices' parts are not used)."""
    if not wanted or any(saved.fingerprint.get(k) != fp for k, fp in wanted.items()):
        return None
    throughs = {saved.through[k] for k in wanted}
    if len(throughs) != 1:
        return None
    through = throughs.pop()
    if until - through > minute_retention - HOUR_SECONDS:
        point = min(through, until)
        return point - point % math.lcm(align, HOUR_SECONDS), False
    if saved.through.get(SLICES) == through and through <= until:
        return through, True
    point = min(through, until)
    return point - point % align, False


def save(
    store: Store,
    rows: Sequence[SavedRow],
    ledger: SloLedger,
    wanted: dict[str, str],
    through: int,
    keep_minutes_from: int,
    keep_hours_from: int,
    replace: bool = False,
    owner: str = "",
    slices: Sequence[Published] | None = None,
    skip: Collection[str] = (),
    replace_keys: Collection[str] = (),
) -> None:
    """Write `owner`'s `rows` (upserted) and every key's fingerprint, exactness and `through`, in
    one transaction; forget minutes before `keep_minutes_from` and hours before `keep_hours_from`.
    `replace`: the rows are every count (a full backfill): what the store held is dropped first;
    `replace_keys`: the same for these keys' rows alone (counted again after a change). `skip`:
    keys whose counts are not complete yet (being counted again): what the store holds of them
    stays as it is, fingerprint included, so that a restart counts them again.
    `slices`: the open slices' parts as of `through` (`SloLedger.settled_slices`), in place of
    the ones saved before; None: those saved before no longer match `through`."""
    keys = ledger.count_keys()
    c, k = slo_counts.c, slo_count_keys.c
    with store.engine.begin() as conn:
        if replace:
            conn.execute(delete(slo_counts).where(c.owner == owner))
            conn.execute(delete(slo_count_keys).where(k.owner == owner))
        elif replace_keys:
            conn.execute(delete(slo_counts).where(c.owner == owner, c.key.in_(sorted(replace_keys))))
        parts = (c.key.like("slice:%")) | (c.key.like("cost:%"))
        conn.execute(delete(slo_counts).where(c.owner == owner, parts))
        conn.execute(delete(slo_count_keys).where(k.owner == owner, k.key.in_((SLICES, JUDGED))))
        if slices is not None:
            upsert(
                conn,
                slo_counts,
                [
                    {
                        "owner": owner,
                        "period_seconds": 0,
                        "start_unix": p.start_unix,
                        "key": p.key,
                        "good": p.good,
                        "total": p.total,
                        "data": None if p.work is None else json.dumps([[*pair, *v] for pair, v in p.work.items()]),
                    }
                    for p in slices
                ],
                ["owner", "period_seconds", "start_unix", "key"],
                ["good", "total", "data"],
            )
            for key, until in ((SLICES, through), (JUDGED, ledger.closed_before)):
                conn.execute(
                    insert(slo_count_keys).values(
                        owner=owner, key=key, fingerprint=_digest(sorted(wanted)), exact=True, through_unix=until
                    )
                )
        upsert(
            conn,
            slo_counts,
            [
                {"owner": owner, "key": key, "period_seconds": p, "start_unix": s, "good": g, "total": t}
                for key, p, s, g, t in rows
            ],
            ["owner", "period_seconds", "start_unix", "key"],
            ["good", "total"],
        )
        upsert(
            conn,
            slo_count_keys,
            [
                {
                    "owner": owner,
                    "key": key,
                    "fingerprint": wanted[key],
                    "exact": not counts.inexact,
                    "through_unix": through,
                }
                for key, counts in keys.items()
                if key in wanted and key not in skip
            ],
            ["owner", "key"],
            ["fingerprint", "exact", "through_unix"],
        )
        mine = c.owner == owner
        conn.execute(
            delete(slo_counts).where(mine, c.period_seconds == MINUTE_SECONDS, c.start_unix < keep_minutes_from)
        )
        conn.execute(delete(slo_counts).where(mine, c.period_seconds == HOUR_SECONDS, c.start_unix < keep_hours_from))
        # a key these rules no longer have: its rows go (its definition may come back changed)
        held = conn.execute(select(k.key).where(k.owner == owner, k.key.not_in((SLICES, JUDGED))))
        gone = [key for (key,) in held if key not in wanted]
        if gone:
            conn.execute(delete(slo_counts).where(mine, c.key.in_(gone)))
            conn.execute(delete(slo_count_keys).where(k.owner == owner, k.key.in_(gone)))

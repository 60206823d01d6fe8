"""Incremental SLO evaluation: every objective's good and total events kept per minute and per
hour as scrapes and spans are committed, so a pass sums a few arrays instead of re-reading the
period's rollups.

Each objective has two rings of counts: minutes over the minute-rollup retention, hours over the
whole period. A window sums its whole hours from the hours and its partial hours from the minutes,
as far back as the store keeps minutes (the same rule a read of the stored rollups follows after
compaction). Memory is fixed by the period and the retention, not by how much history or traffic
there is: 100 objectives at the defaults (50 h of minutes, 28 d of hours) hold ~6 MB.

At start-up the rings are filled once from the stored rollups (`backfill`); from then on only new
commits are added. The minute in which the collector started is counted from the live commits
only: what the previous process stored in that same minute (at most one minute's worth, once per
restart) is not in the rings. `Runtime.evaluate_slos` uses the full re-read (`evaluate`) whenever
`now` lies outside the ledger's live span (tests with virtual clocks, the simulator's fast clock).

Sharded collectors (collector/cluster.py) each count their own commits and exchange them: with
`share()`, what the live commits add is also kept in an outbox (`take_outbox`), and what the other
collectors published is added with `add_published`. Throughput and cost slices are exchanged as
their sums (tokens and requests, the per-target work), not as judged events, so each collector
judges a slice on the whole fleet's traffic, once the slice is `settle` seconds old.
"""

from __future__ import annotations

import logging
import threading
from array import array
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, fields

import numpy as np

from collector.analytics.percentiles import fraction_at_or_below
from collector.cost.allocation import COST_METRICS, CostInputs, Work
from collector.cost.slo import CostOf, judge
from collector.rollup import HOUR_SECONDS, MINUTE_SECONDS, Cell, Row, ScrapeDeltas, SeriesIdent, period_start
from collector.slo.evaluate import (
    ERROR_REASONS,
    NEEDS_COSTS,
    NEEDS_TRACES,
    NO_EVENTS,
    RECOUNTING,
    BusinessTypeOf,
    Events,
    SloStatus,
    make_status,
    period_bounds,
    windows_needed,
)
from collector.slo.spec import Objective, SloRules
from collector.sources.vllm import Kind
from collector.traces.normalize import SHADOW
from collector.traces.rollup import RequestCell, RequestKey

log = logging.getLogger(__name__)

KEEP_RECENT_SECONDS = 3600  # the longest a minute's slice parts wait for a save to take them


class Ring:
    """Two counts (good, total) per slot of `slot` seconds, for the last `slots` slots; `dirty`
    holds the slot numbers changed since they were last saved (collector/slo/saved.py)."""

    __slots__ = ("dirty", "good", "latest", "slot", "slots", "total")

    def __init__(self, slot: int, slots: int) -> None:
        self.slot = slot
        self.slots = slots
        self.good = array("d", bytes(8 * slots))
        self.total = array("d", bytes(8 * slots))
        self.latest: int | None = None  # the newest slot number written (unix // slot)
        self.dirty: set[int] = set()

    def add(self, unix: int, good: float, total: float) -> None:
        n = unix // self.slot
        latest = self.latest
        if latest is None:
            self.latest = latest = n
        elif n > latest:
            for k in range(latest + 1, min(n, latest + self.slots) + 1):  # slots reused: clear them
                self.good[k % self.slots] = 0.0
                self.total[k % self.slots] = 0.0
            self.latest = latest = n
        if n <= latest - self.slots:
            return  # older than the ring reaches
        i = n % self.slots
        self.good[i] += good
        self.total[i] += total
        self.dirty.add(n)

    def take_dirty(self, before: int) -> list[tuple[int, float, float]]:
        """(start unix, good, total) of the changed slots that end by `before` (and are still
        held), no longer marked changed."""
        if self.latest is None:
            self.dirty.clear()
            return []
        oldest = self.latest - self.slots + 1
        last = before // self.slot - 1
        taken = [n for n in self.dirty if n <= last]
        out = []
        for n in sorted(taken):
            self.dirty.discard(n)
            if oldest <= n <= self.latest:
                i = n % self.slots
                out.append((n * self.slot, self.good[i], self.total[i]))
        return out

    def absorb(self, other: Ring) -> None:
        """Add `other`'s counts (a ring of the same shape whose newest slot is not newer than
        this one's, unless this one is empty) and its changed slots into this ring."""
        assert other.slot == self.slot and other.slots == self.slots
        dirty = self.dirty | other.dirty
        if other.latest is None:
            pass
        elif self.latest is None:
            self.good, self.total = array("d", other.good), array("d", other.total)
            self.latest = other.latest
        elif other.latest > self.latest:  # not the case at start-up (live commits are newer): slot by slot
            for n in other.held():
                i = n % other.slots
                self.add(n * self.slot, other.good[i], other.total[i])
        else:
            # the slot each index of `other` holds, and which of them this ring still reaches
            index = np.arange(self.slots)
            held = other.latest - (other.latest - index) % self.slots
            inside = held > self.latest - self.slots
            good, total = np.frombuffer(self.good), np.frombuffer(self.total)
            good[inside] += np.frombuffer(other.good)[inside]
            total[inside] += np.frombuffer(other.total)[inside]
        self.dirty = dirty

    def held(self) -> list[int]:
        """The slot numbers held that count anything."""
        if self.latest is None:
            return []
        first = self.latest - self.slots + 1
        return [n for n in range(first, self.latest + 1) if self.total[n % self.slots] or self.good[n % self.slots]]

    def oldest(self) -> int | None:
        """Start (unix) of the oldest slot held."""
        return None if self.latest is None else (self.latest - self.slots + 1) * self.slot

    def sum(self, start: int, end: int) -> tuple[float, float]:
        """Counts of the slots lying wholly inside [start, end)."""
        if self.latest is None:
            return 0.0, 0.0
        first = max(-(-start // self.slot), self.latest - self.slots + 1)
        last = min(end // self.slot - 1, self.latest)
        if last < first:
            return 0.0, 0.0
        a, b = first % self.slots, last % self.slots
        if a <= b:
            return sum(self.good[a : b + 1]), sum(self.total[a : b + 1])
        return (
            sum(self.good[a:]) + sum(self.good[: b + 1]),
            sum(self.total[a:]) + sum(self.total[: b + 1]),
        )


class Counts:
    """Minutes (recent) and hours (the period) of one objective's events."""

    __slots__ = ("hours", "inexact", "minutes", "retention")

    def __init__(self, minute_retention: int, hour_slots: int, slot: int = MINUTE_SECONDS) -> None:
        self.retention = minute_retention
        # two hours more than the retention: the store keeps minutes back to the whole hour.
        # `slot` is a minute, or less when the rules' windows are scaled below a minute (tests,
        # the demo's compressed clock): live scrapes then land at their own second.
        self.minutes = Ring(slot, (minute_retention + 2 * HOUR_SECONDS) // slot)
        self.hours = Ring(HOUR_SECONDS, hour_slots)
        self.inexact = False  # a latency threshold fell between bucket bounds somewhere

    def add(self, unix: int, period: int, good: float, total: float) -> None:
        if period == MINUTE_SECONDS:
            self.minutes.add(unix, good, total)
        self.hours.add(unix - unix % HOUR_SECONDS, good, total)

    def window(self, start: int, end: int) -> Events:
        """The whole hours inside [start, end) from the hours, the partial hours at either edge
        from the minutes, and minutes only as far back as the store keeps them (the whole hour
        `minute_rollups` before `end`): what a read of the stored rollups counts."""
        kept_from = (end - self.retention) // HOUR_SECONDS * HOUR_SECONDS
        first_hour = -(-start // HOUR_SECONDS) * HOUR_SECONDS
        last_hour = end // HOUR_SECONDS * HOUR_SECONDS
        if first_hour >= last_hour:
            good, total = self.minutes.sum(max(start, kept_from), end)
        else:
            good, total = self.hours.sum(first_hour, last_hour)
            for lo, hi in ((max(start, kept_from), first_hour), (last_hour, end)):
                if lo < hi:
                    g, t = self.minutes.sum(lo, hi)
                    good, total = good + g, total + t
        return Events(good, total, not self.inexact)


def counts_live(o: Objective) -> bool:
    """An objective whose events the engine's histograms or counters give: exported as counters."""
    return o.sli == "error_ratio" or (o.sli == "latency" and o.source == "engine" and o.threshold_seconds is not None)


@dataclass(frozen=True, slots=True)
class Published:
    """One exchanged count (collector/cluster.py): `key` is an objective's slo, `cache:<business
    type>`, `slice:<slo>` (a throughput slice's tokens as good, requests as total) or
    `cost:<slice seconds>` (`work`: per (target, model), the cost model's additive inputs)."""

    key: str
    start_unix: int
    good: float
    total: float
    exact: bool = True
    work: dict[tuple[str, str], list[float]] | None = None


WORK_FIELDS = tuple(f.name for f in fields(Work))


class Outbox:
    """What this collector's live commits counted since the last publish."""

    __slots__ = ("cost", "counts")

    def __init__(self) -> None:
        self.counts: dict[tuple[str, int], list[float]] = {}  # (key, start) -> [good, total, exact]
        self.cost: dict[int, dict[int, CostInputs]] = {}  # slice size -> slot -> inputs

    def add(self, key: str, start: int, good: float, total: float, exact: bool = True) -> None:
        c = self.counts.get((key, start))
        if c is None:
            self.counts[(key, start)] = [good, total, 1.0 if exact else 0.0]
        else:
            c[0] += good
            c[1] += total
            if not exact:
                c[2] = 0.0

    def rows(self) -> list[Published]:
        out = [Published(k, start, g, t, bool(e)) for (k, start), (g, t, e) in self.counts.items()]
        for size, slots in self.cost.items():
            for slot, inputs in slots.items():
                work = {key: [getattr(w, f) for f in WORK_FIELDS] for key, w in inputs.work.items()}
                if work:
                    out.append(Published(f"cost:{size}", slot, 0.0, 0.0, True, work))
        return out


class SloLedger:
    def __init__(
        self,
        rules: SloRules,
        business_type_of: BusinessTypeOf,
        minute_retention_seconds: float,
        cost_of: CostOf | None = None,
        only: Collection[str] | None = None,
    ) -> None:
        """`only`: the saved-count keys (`count_keys`) this ledger counts, None all of them; a
        ledger that fills part of another (`Runtime._fill_ledger`) has rings of the same size."""
        self.rules = rules
        self.cost_of = cost_of
        self.place = business_type_of
        self.lock = threading.Lock()
        longest = max([rules.period_seconds, *windows_needed(rules)])
        if rules.calendar == "month":
            longest = max(longest, 31 * 86400.0)
        retention = int(min(minute_retention_seconds, longest + HOUR_SECONDS))
        hour_slots = int(longest // HOUR_SECONDS) + 2
        # windows scaled below a minute (window_scale): slots of that fraction of a minute, kept
        # for the longest scaled window (not the whole period) to bound the arrays
        self.slot = max(1, int(MINUTE_SECONDS * rules.window_scale)) if rules.window_scale < 1 else MINUTE_SECONDS
        if self.slot < MINUTE_SECONDS:
            retention = int(min(retention, max(windows_needed(rules)) + HOUR_SECONDS))
        self.objectives = [o for bt in rules.business_types for o in bt.objectives if only is None or o.slo in only]
        self.counts = {o.slo: Counts(retention, hour_slots, self.slot) for o in self.objectives}
        self.engine_objectives: dict[str, list[Objective]] = defaultdict(list)
        self.trace_objectives: dict[str, list[Objective]] = defaultdict(list)
        for o in self.objectives:
            if o.sli == "goodput" or (o.sli == "latency" and o.source == "traces"):
                self.trace_objectives[o.business_type].append(o)
            elif o.sli in ("latency", "error_ratio", "throughput"):
                self.engine_objectives[o.business_type].append(o)
        # throughput: tokens and requests per slice until the slice is complete, then one event
        self.slices: dict[str, dict[int, list[float]]] = {o.slo: {} for o in self.objectives}
        # cost ceiling: every target's cost inputs per open slice (the idle share and the work
        # calibration need the whole deployment), priced once the slice is complete
        self.cost_objectives = [o for o in self.objectives if o.sli == "cost_ceiling"] if cost_of else []
        self.cost_open: dict[int, dict[int, CostInputs]] = {int(o.slice_seconds): {} for o in self.cost_objectives}
        # prefix-cache hits (good) and queried tokens (total) per business type: the collapse ticket
        self.cache: dict[str, Counts] = {
            bt.name: Counts(retention, hour_slots, self.slot)
            for bt in rules.business_types
            if only is None or "cache:" + bt.name in only
        }
        # engine latency and error events of the live commits since this process started: the
        # llmslo_slo_*events_total counters. A sum of each server's own cumulative counts would drop
        # whenever one replica restarts, and rate() would read that as a reset of the whole fleet
        # (counting every event of the other replicas' lifetimes again); these only ever grow.
        self.since_start: dict[str, list[float]] = {o.slo: [0.0, 0.0] for o in self.objectives if counts_live(o)}
        self.live_since: float | None = None  # set when live commits start counting
        # what an earlier process stored of the minute live counting started in, read before the
        # first live commit (`hold_start_minute`) and counted by the backfill
        self.start_rows: Sequence[Row] = ()
        self.start_requests: Sequence[tuple[RequestKey, RequestCell]] = ()
        self.ready = False  # backfilled from the store
        # sharded (`share`): the live commits' counts for the other collectors, and how long a
        # slice waits for their part before it is judged
        self.outbox: Outbox | None = None
        self.settle = 0
        # unsharded with saved counts (`keep_recent`): per minute, what the live commits added to the
        # open throughput and cost slices, so that a save can tell the slices' part before a
        # minute from the part after it (`settled_slices`)
        self.recent: dict[int, Outbox] | None = None
        self.closed_before = 0  # slices ending by this were judged: a late part of one is dropped
        self.late = 0  # published counts that came after their slice was judged
        self.unknown: set[str] = set()  # published keys these rules do not have
        # keys whose saved counts were made for another definition, counted again from the stored
        # rollups after the first pass (`Runtime.recount`): until then they have no status, are
        # not saved and their slices are not judged; then `fresh` until a save replaced their rows
        self.pending: set[str] = set()
        self.fresh: set[str] = set()

    def share(self, settle_seconds: float) -> None:
        """Keep an outbox of the live commits' counts and judge slices `settle_seconds` late."""
        self.outbox = Outbox()
        self.settle = int(settle_seconds)

    # --- feeding -------------------------------------------------------------------------------

    def add_engine(self, target: str, deltas: ScrapeDeltas) -> None:
        """A committed scrape's deltas (TargetScraper's commit hook)."""
        fine = self.slot < MINUTE_SECONDS and deltas.unix
        start = int(deltas.unix) if fine else deltas.minute
        self.add_cells(target, start, MINUTE_SECONDS, deltas.cells.items(), live=True)

    def add_cells(
        self, target: str, start: int, period: int, cells: Iterable[tuple[SeriesIdent, Cell]], live: bool = False
    ) -> None:
        """Cells of one target and period: from a live commit (`live`, also counted since start)
        or from the backfill."""
        places: dict[str, str | None] = {}
        outbox = self.outbox if live else None
        with self.lock:
            recent = self._recent(start) if live and self.cost_open else None
            for ident, cell in cells:
                for size, open_slices in self.cost_open.items():
                    slot = start - start % size
                    inputs = open_slices.get(slot)
                    if inputs is None:
                        inputs = open_slices[slot] = CostInputs()
                    inputs.add(target, ident, cell)
                    for also in (recent, outbox):  # a minute's record (saved counts), the cluster's outbox
                        if also is not None:
                            part = also.cost.setdefault(size, {})
                            inputs = part.get(slot)
                            if inputs is None:
                                inputs = part[slot] = CostInputs()
                            inputs.add(target, ident, cell)
                if ident.kind is Kind.GAUGE:
                    continue
                model = ident.key.model
                if model not in places:
                    places[model] = self.place(target, model)
                bt = places[model]
                if bt is None:
                    continue
                metric = ident.key.metric
                if metric in ("prefix_cache_hits", "prefix_cache_queries") and bt in self.cache:
                    hit = metric == "prefix_cache_hits"
                    good, total = (cell.value, 0.0) if hit else (0.0, cell.value)
                    self.cache[bt].add(start, period, good, total)
                    if live and self.outbox is not None:
                        self.outbox.add("cache:" + bt, start, good, total)
                for o in self.engine_objectives.get(bt, ()):
                    self._add_engine_cell(o, ident, cell, start, period, live)

    def _add_engine_cell(
        self, o: Objective, ident: SeriesIdent, cell: Cell, start: int, period: int, live: bool
    ) -> None:
        if o.sli in ("latency", "error_ratio"):
            events = self._engine_events(o, ident, cell)
            if events is None:
                return
            good, total, exact = events
            self.counts[o.slo].add(start, period, good, total)
            if live:
                counted = self.since_start.get(o.slo)
                if counted is not None:
                    counted[0] += good
                    counted[1] += total
                if self.outbox is not None:
                    self.outbox.add(o.slo, start, good, total, exact)
        elif o.sli == "throughput" and ident.kind is Kind.COUNTER:
            metric = ident.key.metric
            if metric not in ("generation_tokens", "request_success"):
                return
            size = int(o.slice_seconds)
            slot = self.slices[o.slo].setdefault(start - start % size, [0.0, 0.0])
            tokens = metric == "generation_tokens"
            slot[0 if tokens else 1] += cell.value
            recent = self._recent(start) if live else None
            if recent is not None:
                g, t = (cell.value, 0.0) if tokens else (0.0, cell.value)
                recent.add("slice:" + o.slo, start - start % size, g, t)
            if live and self.outbox is not None:
                g, t = (cell.value, 0.0) if tokens else (0.0, cell.value)
                self.outbox.add("slice:" + o.slo, start - start % size, g, t)

    def _engine_events(self, o: Objective, ident: SeriesIdent, cell: Cell) -> tuple[float, float, bool] | None:
        """(good, total) of a latency or error objective in one engine cell; None: not its series."""
        if o.sli == "latency":
            if ident.key.metric != o.metric or ident.kind is not Kind.HISTOGRAM or not cell.buckets:
                return None
            assert o.threshold_seconds is not None
            share = fraction_at_or_below(o.threshold_seconds, ident.bounds, cell.buckets)
            if share is None:
                return None
            total = cell.buckets[-1]
            exact = share[1] or total <= 0
            if not exact:
                self.counts[o.slo].inexact = True
            return share[0] * total, total, exact
        if ident.key.metric != "request_success" or ident.kind is not Kind.COUNTER:
            return None
        bad = dict(ident.key.labels).get("finished_reason") in ERROR_REASONS
        return (0.0 if bad else cell.value), cell.value, True

    def add_live_requests(self, cells: Iterable[tuple[RequestKey, RequestCell]]) -> None:
        """Newly committed trace request cells (the trace store's commit hook). A span is keyed by
        the minute it started in, which may be before live counting began (a request running
        across the collector's start, a gateway exporting late): until the backfill has run, those
        minutes are left to it (it reads them from the store, this commit included), or they would
        count twice. The same holds for the objectives being counted again (`pending`)."""
        before = period_start(self.live_since) if self.live_since is not None else None
        with self.lock:
            if not self.ready and before is not None:
                cells = [(k, c) for k, c in cells if k.start_unix >= before]
        self.add_requests(cells, live=True, recount_before=before if self.pending else None)

    def add_requests(
        self,
        cells: Iterable[tuple[RequestKey, RequestCell]],
        period: int = MINUTE_SECONDS,
        live: bool = False,
        recount_before: int | None = None,
    ) -> None:
        """Trace request cells, from the backfill or (through add_live_requests) as they commit;
        `recount_before`: a pending objective's cells before it are left to its recount."""
        outbox = self.outbox if live else None
        with self.lock:
            for key, cell in cells:
                if key.measured_at == SHADOW:
                    continue  # a shadow candidate's responses were not shown: no SLO counts them
                early = recount_before is not None and key.start_unix < recount_before
                for o in self.trace_objectives.get(key.business_type, ()):
                    if early and o.slo in self.pending:
                        continue
                    good = cell.jointly_good if o.sli == "goodput" else cell.good.get(o.slo, 0)
                    self.counts[o.slo].add(key.start_unix, period, float(good), float(cell.total))
                    if outbox is not None:
                        outbox.add(o.slo, key.start_unix, float(good), float(cell.total))

    def close_slices(self, now_unix: float) -> None:
        """Judge the throughput slices that are complete: one event each, good when the slice
        generated at least the minimum rate; a slice without requests is no data. Sharded, a slice
        waits `settle` seconds more for the other collectors' part of it."""
        done_before = period_start(now_unix - self.settle)
        with self.lock:
            self.closed_before = max(self.closed_before, done_before)
            if self.recent is not None:  # bounded when no save takes them (the store failing)
                for minute in [m for m in self.recent if m < done_before - KEEP_RECENT_SECONDS]:
                    del self.recent[minute]
            for o in self.objectives:
                if o.sli != "throughput" or o.min_tokens_per_second is None or o.slo in self.pending:
                    continue  # a pending objective's slices wait for the part its recount adds
                size = int(o.slice_seconds)
                open_slices = self.slices[o.slo]
                for start in [s for s in open_slices if s + size <= done_before]:
                    tokens, requests = open_slices.pop(start)
                    if requests > 0:
                        good = 1.0 if tokens / size >= o.min_tokens_per_second else 0.0
                        self.counts[o.slo].add(start, MINUTE_SECONDS, good, 1.0)
            if self.cost_of is None:
                return
            for size, open_costs in self.cost_open.items():
                if size in self._pending_sizes():
                    continue
                for start in [s for s in open_costs if s + size <= done_before]:
                    costs = self.cost_of(open_costs.pop(start), start, start + size)
                    for o in self.cost_objectives:
                        if int(o.slice_seconds) != size:
                            continue
                        assert o.max_usd_per_million_tokens is not None
                        judged = judge(costs, o.business_type, o.max_usd_per_million_tokens)
                        if judged is not None:
                            self.counts[o.slo].add(start, MINUTE_SECONDS, *judged)

    # --- sharded collectors (collector/cluster.py) ------------------------------------------------

    def take_outbox(self) -> list[Published]:
        """The live commits' counts since the last call, for the other collectors."""
        with self.lock:
            if self.outbox is None:
                return []
            rows, self.outbox = self.outbox.rows(), Outbox()
        return rows

    def add_published(self, rows: Iterable[Published]) -> None:
        """Counts another collector published: added as its commits would have been."""
        with self.lock:
            for p in rows:
                kind, _, name = p.key.partition(":")
                if not name:
                    counts = self.counts.get(p.key)
                elif kind == "cache":
                    counts = self.cache.get(name)
                else:
                    self._add_published_slice(kind, name, p)
                    continue
                if counts is None:
                    self._unknown(p.key)
                    continue
                counts.add(p.start_unix, MINUTE_SECONDS, p.good, p.total)
                if not p.exact:
                    counts.inexact = True

    def _add_published_slice(self, kind: str, name: str, p: Published) -> None:
        if kind == "slice" and name in self.slices:
            objective = next(o for o in self.objectives if o.slo == name)
            if p.start_unix + int(objective.slice_seconds) <= self.closed_before and name not in self.pending:
                self.late += 1
                return
            slot = self.slices[name].setdefault(p.start_unix, [0.0, 0.0])
            slot[0] += p.good
            slot[1] += p.total
        elif kind == "cost" and name.isdigit() and int(name) in self.cost_open and p.work is not None:
            if p.start_unix + int(name) <= self.closed_before and int(name) not in self._pending_sizes():
                self.late += 1
                return
            inputs = self.cost_open[int(name)].setdefault(p.start_unix, CostInputs())
            for key, values in p.work.items():
                w = inputs.work.get(key)
                if w is None:
                    w = inputs.work[key] = Work()
                w.merge(Work(*values))
        else:
            self._unknown(p.key)

    def _unknown(self, key: str) -> None:
        if key not in self.unknown:
            self.unknown.add(key)
            log.warning(
                "another collector published SLO counts for %r, which these rules do not have: "
                "are the collectors running the same rules?",
                key,
            )

    # --- start-up --------------------------------------------------------------------------------

    def hold_start_minute(
        self,
        read_rows: Callable[[int, int, int], Sequence[Row]],
        read_requests: Callable[[int, int, int], Sequence[tuple[RequestKey, RequestCell]]],
    ) -> None:
        """Read what is stored of the minute live counting starts in, before the first live
        commit: an earlier process's part of that minute (a restart 40 s into it stored 40 s of
        it), which the live commits do not bring and the backfill, reading the minutes before,
        would not either. `read_*(start, end, period)` as for `backfill`."""
        assert self.live_since is not None
        minute = period_start(self.live_since)
        self.start_rows = read_rows(minute, minute + MINUTE_SECONDS, MINUTE_SECONDS)
        self.start_requests = read_requests(minute, minute + MINUTE_SECONDS, MINUTE_SECONDS)

    def backfill(
        self,
        read_rows: Callable[[int, int, int], Sequence[Row]],
        read_requests: Callable[[int, int, int], Sequence[tuple[RequestKey, RequestCell]]],
        now_unix: float,
        start_from: int | None = None,
        minute_step: int = HOUR_SECONDS,
        fine_from: int | None = None,
    ) -> None:
        """Fill the rings from the store up to the minute the live commits started in: hour cells
        a day at a time, minute cells an hour at a time, and from `fine_from` on (where the store
        keeps minutes) `minute_step` seconds at a time (a few minutes for a large fleet:
        `rollup.read_step`), so that memory is bounded by one read of the fleet's rows, however
        long the period; trace request cells likewise (before `fine_from` minutes are rare, and
        a read costs its query even when empty). `read_*(start, end, period)`. `start_from`:
        the rings hold what came before it already (`restore`)."""
        assert self.live_since is not None
        until = period_start(self.live_since)
        start, _ = period_bounds(self.rules, now_unix)
        start = min(start, period_start(now_unix) + MINUTE_SECONDS - int(max(windows_needed(self.rules))))
        start -= start % HOUR_SECONDS
        if start_from is not None:
            start = max(start, start_from)
        fine = until if fine_from is None else fine_from
        for period, step in ((HOUR_SECONDS, 86400), (MINUTE_SECONDS, HOUR_SECONDS)):
            lo = start
            while lo < until:
                hi = min(lo + (minute_step if period == MINUTE_SECONDS and lo >= fine else step), until)
                rows = read_rows(lo, hi, period)
                self._add_rows((r for r in rows if r.start_unix + r.period_seconds <= until), period)
                self.add_requests(read_requests(lo, hi, period), period)
                lo = hi
        self._add_rows(self.start_rows, MINUTE_SECONDS)
        self.add_requests(self.start_requests, MINUTE_SECONDS)
        self.start_rows, self.start_requests = (), ()
        self.ready = True

    # --- saved counts (collector/slo/saved.py) ---------------------------------------------------

    def count_keys(self) -> dict[str, Counts]:
        """Every ring pair by the key its counts are saved under: an objective's slo, or
        cache:<business type> for the prefix-cache counts."""
        return {**self.counts, **{"cache:" + bt: counts for bt, counts in self.cache.items()}}

    def engine_metrics(self) -> set[str]:
        """The engine metrics whose rollups this ledger's keys count (a recount of one changed
        objective reads those alone: a TTFT threshold's, the TTFT histograms)."""
        out: set[str] = set()
        for bt_objectives in self.engine_objectives.values():
            for o in bt_objectives:
                if o.sli == "latency" and o.metric is not None:
                    out.add(o.metric)
                elif o.sli == "error_ratio":
                    out.add("request_success")
                elif o.sli == "throughput":
                    out.update(("generation_tokens", "request_success"))
        if self.cost_objectives:
            out.update(COST_METRICS)
        if self.cache:
            out.update(("prefix_cache_hits", "prefix_cache_queries"))
        return out

    def slice_sizes(self) -> list[int]:
        """The slice lengths of the objectives judged per slice (throughput, cost ceiling)."""
        return sorted({int(o.slice_seconds) for o in self.objectives if o.sli in ("throughput", "cost_ceiling")})

    def take_closed(self, through: int, skip: Collection[str] = ()) -> list[tuple[str, int, int, float, float]]:
        """(key, period, start, good, total) of every slot changed since it was last taken that
        ends by `through`: the minutes, and the hours, closed by then; not those of `skip`'s keys."""
        out: list[tuple[str, int, int, float, float]] = []
        with self.lock:
            for key, counts in self.count_keys().items():
                if key in skip:
                    continue
                for ring, period in ((counts.minutes, MINUTE_SECONDS), (counts.hours, HOUR_SECONDS)):
                    out.extend((key, period, start, good, total) for start, good, total in ring.take_dirty(through))
        return out

    def untake(self, rows: Iterable[tuple[str, int, int, float, float]]) -> None:
        """Mark taken slots changed again (their save failed)."""
        with self.lock:
            keys = self.count_keys()
            for key, period, start, _, _ in rows:
                counts = keys.get(key)
                if counts is not None:
                    ring = counts.minutes if period == MINUTE_SECONDS else counts.hours
                    ring.dirty.add(start // ring.slot)

    def _recent(self, minute: int) -> Outbox | None:
        """The record of `minute`'s live additions to the open slices (under the lock), when kept:
        from the minute live counting started in on, for at most KEEP_RECENT_SECONDS of minutes."""
        recent = self.recent
        if recent is None or self.live_since is None or minute < period_start(self.live_since):
            return None
        part = recent.get(minute)
        if part is None:
            if len(recent) >= KEEP_RECENT_SECONDS // MINUTE_SECONDS:  # no save took them: the oldest go
                del recent[min(recent)]
            part = recent[minute] = Outbox()
        return part

    def keep_recent(self) -> None:
        """Record per minute what the live commits add to the open slices (`settled_slices`)."""
        self.recent = {}

    def settled_slices(self, through: int) -> list[Published] | None:
        """The open throughput and cost slices as the minutes before `through` left them (what
        the live commits of later minutes added taken out), as published counts; the minutes
        before `through` are no longer recorded. None when the record does not reach back to
        `through` (it starts with the live commits)."""
        with self.lock:
            recent = self.recent
            if recent is None or self.live_since is None or through < period_start(self.live_since):
                return None
            later = [part for minute, part in recent.items() if minute >= through]
            for minute in [m for m in recent if m < through]:
                del recent[minute]
            out = []
            for slo, slots in self.slices.items():
                for start, (tokens, requests) in slots.items():
                    for part in later:
                        c = part.counts.get(("slice:" + slo, start))
                        if c is not None:
                            tokens, requests = tokens - c[0], requests - c[1]
                    out.append(Published("slice:" + slo, start, tokens, requests))
            for size, open_costs in self.cost_open.items():
                for start, inputs in open_costs.items():
                    work = {pair: [getattr(w, f) for f in WORK_FIELDS] for pair, w in inputs.work.items()}
                    for part in later:
                        taken = part.cost.get(size, {}).get(start)
                        for pair, w in taken.work.items() if taken is not None else ():
                            have = work.get(pair)
                            if have is not None:
                                work[pair] = [a - getattr(w, f) for a, f in zip(have, WORK_FIELDS, strict=True)]
                    out.append(Published(f"cost:{size}", start, 0.0, 0.0, True, work))
            return out

    def drop_judged(self, before: int, judged_before: int) -> None:
        """Forget the slices that started before `before` and ended by `judged_before`: an earlier
        process judged them (their events are in its saved counts), and what a backfill from
        `before` added to them is only their end."""
        with self.lock:
            for o in self.objectives:
                if o.sli == "throughput":
                    size = int(o.slice_seconds)
                    for start in [s for s in self.slices[o.slo] if s < before and s + size <= judged_before]:
                        del self.slices[o.slo][start]
            for size, open_costs in self.cost_open.items():
                for start in [s for s in open_costs if s < before and s + size <= judged_before]:
                    del open_costs[start]

    def touch_all(self) -> None:
        """Mark every slot that counts anything changed (the next save writes all of them)."""
        with self.lock:
            self._touch(self.count_keys())

    def _touch(self, keys: Iterable[str]) -> None:
        have = self.count_keys()
        for key in keys:
            for ring in (have[key].minutes, have[key].hours):
                ring.dirty.update(ring.held())

    # --- counting changed objectives again ---------------------------------------------------------

    def recount_group(self, keys: Iterable[str]) -> set[str]:
        """`keys` and what must be counted again with them: every cost ceiling of a slice length
        one of them has (their slices share each target's cost inputs)."""
        out = set(keys)
        sizes = {int(o.slice_seconds) for o in self.cost_objectives if o.slo in out}
        out.update(o.slo for o in self.cost_objectives if int(o.slice_seconds) in sizes)
        return out

    def _pending_sizes(self) -> set[int]:
        """The cost slice lengths waiting for a recount (under the lock)."""
        if not self.pending:
            return set()
        return {int(o.slice_seconds) for o in self.cost_objectives if o.slo in self.pending}

    def save_state(self) -> tuple[frozenset[str], frozenset[str]]:
        """(pending, fresh) as they are now: what a save leaves out, and whose rows it replaces."""
        with self.lock:
            return frozenset(self.pending), frozenset(self.fresh)

    def saved_fresh(self, keys: Iterable[str]) -> None:
        """A save replaced these keys' rows."""
        with self.lock:
            self.fresh.difference_update(keys)

    def restore(self, rows: Iterable[tuple[str, int, int, float, float]], exact: dict[str, bool], before: int) -> None:
        """Fill the empty rings from saved counts (`rows` as `take_closed` gave them, `exact` per
        key) for the minutes before `before`, a whole minute: minutes from the minute rows; hours
        from the hour rows up to the hour holding `before`, and that hour from its minute rows
        (the backfill adds the rest of it from `before` on). Marks nothing changed."""
        cut = before - before % HOUR_SECONDS
        with self.lock:
            keys = self.count_keys()
            for key, period, start, good, total in sorted(rows, key=lambda r: (r[1], r[2])):
                counts = keys.get(key)
                if counts is None:
                    continue
                if period == HOUR_SECONDS and start + HOUR_SECONDS <= cut:
                    counts.hours.add(start, good, total)
                elif period == MINUTE_SECONDS and start < before:
                    counts.minutes.add(start, good, total)
                    if start >= cut:
                        counts.hours.add(cut, good, total)
            for key, counts in keys.items():
                counts.inexact = not exact.get(key, True)
                counts.minutes.dirty.clear()
                counts.hours.dirty.clear()

    def absorb(self, filled: SloLedger, recounted: bool = False) -> None:
        """Take what `filled` counted from the store (a ledger of the same rules, or of some of
        their keys, given this one's start rows) into this one, which has counted the live
        commits meanwhile, and be ready. The first pass fills a ledger of its own and hands it
        over only once filled: a fill that fails half way (the database gone) leaves nothing
        behind, and the next pass fills afresh instead of counting twice what the failed one had
        read. `recounted`: `filled` counted pending keys again; they are no longer pending, and
        every slot of theirs is to be saved in place of what their old definition saved."""
        with self.lock, filled.lock:
            if recounted:
                keys = set(filled.count_keys())
                self.pending -= keys
                self.fresh |= keys
            mine = self.count_keys()
            for key, counts in filled.count_keys().items():
                have = mine[key]
                have.minutes.absorb(counts.minutes)
                have.hours.absorb(counts.hours)
                have.inexact = have.inexact or counts.inexact
            for slo, slots in filled.slices.items():
                for start, (tokens, requests) in slots.items():
                    slot = self.slices[slo].setdefault(start, [0.0, 0.0])
                    slot[0] += tokens
                    slot[1] += requests
            for size, open_slices in filled.cost_open.items():
                for start, inputs in open_slices.items():
                    into = self.cost_open[size].setdefault(start, CostInputs())
                    for pair, work in inputs.work.items():
                        have_work = into.work.get(pair)
                        if have_work is None:
                            into.work[pair] = have_work = Work()
                        have_work.merge(work)
            self.start_rows, self.start_requests = (), ()
            self.ready = True
            if recounted:
                self._touch(keys)

    def _add_rows(self, rows: Iterable[Row], period: int) -> None:
        """Stored rows of `period`, added per target and period start (the backfill's)."""
        by_cell: dict[tuple[str, int], list[tuple[SeriesIdent, Cell]]] = defaultdict(list)
        for r in rows:
            by_cell[(r.cell.target, r.start_unix)].append((r.cell.ident, r.cell.cell))
        for (target, t), cells in by_cell.items():
            self.add_cells(target, t, period, cells)

    # --- evaluation ------------------------------------------------------------------------------

    def events_since_start(self) -> list[tuple[Objective, Events]]:
        """Good and total engine events of every latency (engine source) and error objective,
        counted from the live commits since this process started (monotonic)."""
        with self.lock:
            return [
                (o, Events(self.since_start[o.slo][0], self.since_start[o.slo][1], not self.counts[o.slo].inexact))
                for o in self.objectives
                if o.slo in self.since_start
            ]

    def covers(self, now_unix: float) -> bool:
        """Whether `now` is within what the ledger has seen live (else the caller re-reads)."""
        return self.live_since is not None and now_unix >= self.live_since

    def statuses(self, now_unix: float) -> list[SloStatus]:
        self.close_slices(now_unix)
        rules = self.rules
        end = period_start(now_unix) + MINUTE_SECONDS
        if self.slot < MINUTE_SECONDS:  # scaled windows end at the slot holding now, not the minute's end
            end = period_start(now_unix, self.slot) + self.slot
        period_from, _ = period_bounds(rules, now_unix)
        windows = windows_needed(rules)
        out: list[SloStatus] = []
        with self.lock:
            for o in self.objectives:
                counts = self.counts[o.slo]
                waiting = RECOUNTING if o.slo in self.pending else ""
                if waiting or (o.sli == "cost_ceiling" and self.cost_of is None):
                    per_window = {w: NO_EVENTS for w in windows}
                    reason = waiting or NEEDS_COSTS
                    out.append(make_status(rules, o, now_unix, per_window, NO_EVENTS, end - period_from, reason))
                    continue
                per_window = {w: counts.window(end - int(w), end) for w in windows}
                period = counts.window(period_from, end)
                from_traces = o in self.trace_objectives.get(o.business_type, ())
                reason = NEEDS_TRACES if from_traces and period.total <= 0 else ""
                out.append(make_status(rules, o, now_unix, per_window, period, end - period_from, reason))
        return out

    def cache_sums(self, business_type: str, start: int, end: int) -> tuple[float, float]:
        """(prefix-cache hits, queried tokens) of a business type over [start, end)."""
        with self.lock:
            counts = self.cache.get(business_type)
            if counts is None:
                return 0.0, 0.0
            events = counts.window(start, end)
        return events.good, events.total

"""Alert lifecycle (pending, firing, resolved), persisted, and delivery to Alertmanager API v2.

Each burn-rate pair of each SLO is one alert instance. State lives in the database, so a
restarted collector neither forgets a firing alert nor re-pages for it. Delivery is an outbox:
every instance whose latest state Alertmanager has not acknowledged is (re)sent with backoff;
firing alerts are also resent every `resend_interval` with an `endsAt` a few intervals ahead,
so Alertmanager resolves them by itself if llmslo dies. Nothing is dropped while Alertmanager
is unreachable, and evaluation never waits for it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
from sqlalchemy import select

from collector.config import format_duration
from collector.slo.evaluate import PairState, SloStatus
from collector.slo.incidents import CACHE_COLLAPSE
from collector.slo.spec import SloRules
from collector.store.repository import Store, upsert
from collector.store.tables import alert_history
from collector.store.tables import alerts as alerts_table

log = logging.getLogger(__name__)


@dataclass
class AlertInstance:
    fingerprint: str
    labels: dict[str, str]
    annotations: dict[str, str]
    state: str
    active_since_unix: float
    starts_at_unix: float | None = None
    ends_at_unix: float | None = None
    updated_unix: float = 0.0
    sent_unix: float | None = None
    delivered_state: str | None = None
    attempts: int = 0
    next_attempt_unix: float = 0.0
    owner: str = ""  # who keeps and sends it (collector/cluster.py); "" unsharded

    def payload(self, resend_interval: float, now: float) -> dict[str, Any]:
        """One alert of Alertmanager's API v2 `POST /api/v2/alerts` body."""
        annotations = self.annotations
        if "dashboard_url" in annotations:  # the link opens on the alert's own time range
            until = self.ends_at_unix if self.state == "resolved" else None
            url = alert_time_range(annotations["dashboard_url"], self.active_since_unix, until)
            annotations = {**annotations, "dashboard_url": url}
        body: dict[str, Any] = {
            "labels": self.labels,
            "annotations": annotations,
            "startsAt": _iso(self.starts_at_unix or now),
        }
        if self.state == "resolved":
            body["endsAt"] = _iso(self.ends_at_unix or now)
        else:
            body["endsAt"] = _iso(now + 4 * resend_interval)
        return body


def alert_time_range(url: str, since_unix: float, until_unix: float | None) -> str:
    """A dashboard link whose time range (Grafana's `from`/`to`, when the link has them) spans
    the alert: from an hour before it became active to 15 minutes after it resolved (or now)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    if not {"from", "to"} <= {k for k, _ in query}:
        return url
    start = str(int((since_unix - 3600) * 1000))
    end = str(int((until_unix + 900) * 1000)) if until_unix is not None else "now"
    query = [(k, start if k == "from" else end if k == "to" else v) for k, v in query]
    return urlunsplit(parts._replace(query=urlencode(query, safe="$")))


@dataclass(frozen=True)
class Episode:
    """One firing of an alert, from the history (ends None: still firing)."""

    alertname: str
    business_type: str
    severity: str
    labels: dict[str, str]
    summary: str
    starts_unix: float
    ends_unix: float | None


def _iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).isoformat().replace("+00:00", "Z")


def pair_label(ps: PairState) -> tuple[str, str]:
    return format_duration(ps.pair.long_seconds), format_duration(ps.pair.short_seconds)


def held_by(recounting: Collection[str]) -> Callable[[dict[str, str]], bool] | None:
    """Which alerts the SLO ledger's keys being counted again (`SloLedger.pending`: objectives,
    cache:<business type>) cannot judge yet: their burn-rate alerts, and their business type's
    prefix-cache collapse ticket. None: every alert can be judged."""
    if not recounting:
        return None
    keys = frozenset(recounting)

    def hold(labels: dict[str, str]) -> bool:
        if labels.get("alertname") == CACHE_COLLAPSE:
            return "cache:" + labels.get("business_type", "") in keys
        return labels.get("slo") in keys

    return hold


def alert_for(rules: SloRules, st: SloStatus, ps: PairState) -> tuple[str, dict[str, str], dict[str, str]]:
    """Labels and annotations of one burn-rate alert instance (its identity is the labels)."""
    o = st.objective
    long_w, short_w = pair_label(ps)
    bt = next(b for b in rules.business_types if b.name == o.business_type)
    labels = {
        "alertname": o.alert_name,
        "severity": ps.pair.severity,
        "business_type": o.business_type,
        **({"model": bt.model_regex} if bt.model_patterns else {}),
        "slo": o.slo,
        "long_window": long_w,
        "short_window": short_w,
        "source": "llmslo",
    }
    budget = "no data" if st.budget_remaining is None else f"{st.budget_remaining:.1%}"
    annotations = {
        "summary": f"{o.business_type} {o.name} SLO is burning its error budget {ps.pair.factor:g}x too fast",
        "description": (
            f"{o.description or o.slo}: objective {o.objective:.2%}. Burn rate "
            f"{ps.long_burn or 0:.1f}x over {long_w} and {ps.short_burn or 0:.1f}x over {short_w} "
            f"(threshold {ps.pair.factor:g}x); error budget left this period: {budget}."
            + (
                " Tickets on long windows stay open after recovery until the long window clears."
                if ps.pair.severity == "ticket"
                else ""
            )
        ),
        "runbook_url": rules.runbook(o.alert_name.lower()),
        "dashboard_url": rules.dashboard(o.business_type),
    }
    fingerprint = json.dumps(sorted(labels.items()))
    return fingerprint, labels, annotations


@dataclass
class AlertBook:
    """The persisted alert instances and their transitions.

    Sharded collectors (collector/cluster.py) share the table: each keeps the instances of the
    owners it acts for (`owners`): its own name for the alerts of its own targets (`local`, which
    then carry a `collector` label), and `fleet` (with the unsharded "") while it is the elected
    evaluator, for the SLO burn rates and the fleet-wide incidents. Unsharded, every owner is ""."""

    store: Store
    instances: dict[str, AlertInstance] = field(default_factory=dict)
    fleet_owner: str = ""
    local_owner: str = ""
    owners: frozenset[str] = frozenset({""})

    def load(self) -> None:
        self._load(self.owners)

    def set_owners(self, owners: frozenset[str]) -> None:
        """Act for `owners` from now on: instances of an owner given up are forgotten (its next
        holder loads them), those of an owner taken on are loaded."""
        if owners == self.owners:
            return
        added = owners - self.owners
        self.instances = {fp: i for fp, i in self.instances.items() if i.owner in owners}
        self.owners = owners
        self._load(added)

    def _load(self, owners: frozenset[str]) -> None:
        if not owners:
            return
        with self.store.engine.connect() as conn:
            for row in conn.execute(select(alerts_table).where(alerts_table.c.owner.in_(sorted(owners)))):
                self.instances[row.fingerprint] = AlertInstance(
                    row.fingerprint,
                    json.loads(row.labels),
                    json.loads(row.annotations),
                    row.state,
                    row.active_since_unix,
                    row.starts_at_unix,
                    row.ends_at_unix,
                    row.updated_unix,
                    row.sent_unix,
                    row.delivered_state,
                    row.attempts,
                    row.next_attempt_unix,
                    row.owner,
                )

    def apply(
        self,
        rules: SloRules,
        statuses: list[SloStatus],
        now: float,
        for_seconds: float = 0.0,
        incidents: dict[str, tuple[dict[str, str], dict[str, str]]] | None = None,
        local: dict[str, tuple[dict[str, str], dict[str, str]]] | None = None,
        hold: Callable[[dict[str, str]], bool] | None = None,
    ) -> list[AlertInstance]:
        """Advance every instance to what the statuses (and the incident alerts, collector/slo/
        incidents.py: fleet-wide `incidents`, and the `local` ones of this collector's own
        targets) say, for the owners this book acts for; persist; return the changed ones.
        `hold(labels)`: an instance these statuses cannot judge (`held_by`) stays as it is."""
        wanted: dict[str, tuple[dict[str, str], dict[str, str], str]] = {}
        if self.fleet_owner in self.owners:
            wanted = {fp: (*want, self.fleet_owner) for fp, want in (incidents or {}).items()}
            for st in statuses:
                for ps in st.pairs:
                    if ps.firing:
                        fp, labels, annotations = alert_for(rules, st, ps)
                        wanted[fp] = (labels, annotations, self.fleet_owner)
        for fp, (labels, annotations) in (local or {}).items():
            if self.local_owner:  # sharded: which collector's target it is, in the labels and the identity
                labels = {**labels, "collector": self.local_owner}
                fp = json.dumps(sorted(labels.items()))
            wanted[fp] = (labels, annotations, self.local_owner)
        changed: list[AlertInstance] = []
        opened: list[AlertInstance] = []  # started firing: a new episode in the history
        closed: list[AlertInstance] = []  # stopped firing: its episode ends
        for fp, (labels, annotations, owner) in wanted.items():
            inst = self.instances.get(fp)
            if inst is None or inst.state == "resolved":
                inst = AlertInstance(fp, labels, annotations, "pending", now, updated_unix=now, owner=owner)
                self.instances[fp] = inst
                changed.append(inst)
            inst.annotations = annotations
            if inst.state == "pending" and now - inst.active_since_unix >= for_seconds:
                inst.state, inst.starts_at_unix, inst.updated_unix = "firing", now, now
                inst.attempts, inst.next_attempt_unix = 0, 0.0
                opened.append(inst)
                if inst not in changed:
                    changed.append(inst)
        for fp, inst in self.instances.items():
            if fp not in wanted and inst.state in ("pending", "firing") and not (hold and hold(inst.labels)):
                was_firing = inst.state == "firing"
                inst.state, inst.ends_at_unix, inst.updated_unix = "resolved", now, now
                inst.attempts, inst.next_attempt_unix = 0, 0.0
                if was_firing:
                    closed.append(inst)
                else:
                    inst.delivered_state = "resolved"  # never announced: nothing to resolve downstream
                changed.append(inst)
        self._save(changed, opened, closed)
        return changed

    def due(self, now: float, resend_interval: float) -> list[AlertInstance]:
        """Instances Alertmanager must hear about now: undelivered states, and firing resends."""
        out = []
        for inst in self.instances.values():
            if inst.state == "pending" or now < inst.next_attempt_unix:
                continue
            undelivered = inst.delivered_state != inst.state
            resend = inst.state == "firing" and (inst.sent_unix is None or now - inst.sent_unix >= resend_interval)
            if undelivered or resend:
                out.append(inst)
        return out

    def delivered(self, batch: list[AlertInstance], now: float) -> None:
        for inst in batch:
            inst.sent_unix, inst.delivered_state, inst.attempts, inst.next_attempt_unix = (
                now,
                inst.state,
                0,
                0.0,
            )
        self._save(batch)

    def failed(self, batch: list[AlertInstance], now: float, base: float = 2.0, cap: float = 300.0) -> None:
        for inst in batch:
            inst.attempts += 1
            inst.next_attempt_unix = now + min(cap, base * 2 ** (inst.attempts - 1))
        self._save(batch)

    def active(self) -> list[AlertInstance]:
        return [i for i in self.instances.values() if i.state in ("pending", "firing")]

    def episodes(self, start_unix: float, end_unix: float) -> list[Episode]:
        """Firing episodes that overlap [start, end), oldest first (still firing: no end)."""
        h = alert_history
        query = (
            select(h)
            .where(h.c.starts_at_unix < end_unix)
            .where((h.c.ends_at_unix.is_(None)) | (h.c.ends_at_unix >= start_unix))
            .order_by(h.c.starts_at_unix)
        )
        with self.store.engine.connect() as conn:
            return [
                Episode(
                    r.alertname, r.business_type, r.severity, json.loads(r.labels), r.summary, r.starts_at_unix,
                    r.ends_at_unix,
                )
                for r in conn.execute(query)
            ]  # fmt: skip

    def _save(
        self, items: list[AlertInstance], opened: Sequence[AlertInstance] = (), closed: Sequence[AlertInstance] = ()
    ) -> None:
        if not items:
            return
        rows = [
            {
                "fingerprint": i.fingerprint,
                "labels": json.dumps(i.labels, sort_keys=True),
                "annotations": json.dumps(i.annotations, sort_keys=True),
                "state": i.state,
                "active_since_unix": i.active_since_unix,
                "starts_at_unix": i.starts_at_unix,
                "ends_at_unix": i.ends_at_unix,
                "updated_unix": i.updated_unix,
                "sent_unix": i.sent_unix,
                "delivered_state": i.delivered_state,
                "attempts": i.attempts,
                "next_attempt_unix": i.next_attempt_unix,
                "owner": i.owner,
            }
            for i in items
        ]
        with self.store.engine.begin() as conn:
            upsert(
                conn,
                alerts_table,
                rows,
                ["fingerprint"],
                [c.name for c in alerts_table.columns if c.name != "fingerprint"],
            )
            if opened:
                conn.execute(
                    alert_history.insert(),
                    [
                        {
                            "fingerprint": i.fingerprint,
                            "starts_at_unix": i.starts_at_unix,
                            "alertname": i.labels.get("alertname", ""),
                            "business_type": i.labels.get("business_type", ""),
                            "severity": i.labels.get("severity", ""),
                            "labels": json.dumps(i.labels, sort_keys=True),
                            "summary": i.annotations.get("summary", ""),
                            "ends_at_unix": None,
                        }
                        for i in opened
                    ],
                )
            for i in closed:
                conn.execute(
                    alert_history.update()
                    .where(alert_history.c.fingerprint == i.fingerprint)
                    .where(alert_history.c.starts_at_unix == i.starts_at_unix)
                    .values(ends_at_unix=i.ends_at_unix)
                )


async def deliver(
    book: AlertBook, client: httpx.AsyncClient, url: str, now: float, resend_interval: float, timeout: float
) -> int:
    """Send what is due to Alertmanager (`POST {url}/api/v2/alerts`). Returns how many were sent;
    on failure the batch is retried later with backoff."""
    batch = book.due(now, resend_interval)
    if not batch:
        return 0
    body = [inst.payload(resend_interval, now) for inst in batch]
    try:
        resp = await client.post(url.rstrip("/") + "/api/v2/alerts", json=body, timeout=timeout)
        resp.raise_for_status()
    except httpx.HTTPError as exc:
        log.warning("Alertmanager at %s unreachable (%s); %d alert(s) kept for retry", url, exc, len(batch))
        book.failed(batch, now)
        return 0
    book.delivered(batch, now)
    return len(batch)

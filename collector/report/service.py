"""Reports as the running collector keeps them: built (on the schedule or on request), stored in
`llmslo_reports`, delivered by each configured channel, listed with their delivery state."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from sqlalchemy import select

from collector.report import build as builder
from collector.report.charts import render_all
from collector.report.deliver import channels, mail, post_webhook, send_mail, webhook_body, with_retries
from collector.report.period import Period, parse_week
from collector.report.render import to_html, to_markdown
from collector.store.repository import upsert
from collector.store.tables import reports

if TYPE_CHECKING:
    from collector.runtime import Runtime

log = logging.getLogger(__name__)
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


@dataclass(frozen=True)
class Built:
    id: str
    data: dict[str, Any]
    charts: dict[str, bytes]
    html: str
    markdown: str


def render(rt: Runtime, period: Period, link: str | None = None) -> Built:
    """Build and render one report (blocking; nothing stored)."""
    data = builder.build(rt, period, rt.settings.report.top_tenants)
    charts = render_all(data)
    return Built(data["id"], data, charts, to_html(data, charts), to_markdown(data, link))


class ReportService:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.config = rt.settings.report

    def link(self, report_id: str) -> str:
        base = self.config.public_url
        if base is None:
            server = self.rt.settings.server
            base = f"http://{server.host}:{server.port}"
        return f"{base.rstrip('/')}/reports/{report_id}"

    def generate(self, period: Period) -> Built:
        """Build, render and store (replacing a report of the same id); blocking."""
        built = render(self.rt, period, self.link(builder.report_id(period)))
        pending = {c: {"status": "pending", "attempts": 0, "last_error": None} for c in channels(self.config)}
        row = {
            "id": built.id,
            "start_unix": period.start,
            "end_unix": period.end,
            "created_unix": time.time(),
            "title": built.data["title"],
            "data": json.dumps(built.data),
            "html": built.html,
            "markdown": built.markdown,
            "deliveries": json.dumps(pending),
        }
        with self.rt.store.engine.begin() as conn:
            upsert(conn, reports, [row], ["id"], [c.name for c in reports.columns if c.name != "id"])
        return built

    async def deliver(self, built: Built) -> dict[str, bool]:
        """Every configured channel, each retried on its own; the outcome is stored per channel."""
        cfg = self.config
        link = self.link(built.id)
        jobs = []
        if cfg.webhook_url:
            url = cfg.webhook_url
            body = webhook_body(built.data, link)
            jobs.append(("webhook", lambda: post_webhook(self.rt.client, url, body)))
        if cfg.smtp is not None:
            smtp = cfg.smtp
            message = mail(built.data, built.charts, built.markdown, smtp)
            jobs.append(("email", lambda: asyncio.to_thread(send_mail, message, smtp)))

        def recorder(channel: str) -> Any:
            return lambda state: self._record(built.id, channel, state)

        results = await asyncio.gather(
            *(with_retries(name, job, recorder(name), cfg.attempts, cfg.backoff) for name, job in jobs)
        )
        return {name: ok for (name, _), ok in zip(jobs, results, strict=True)}

    def _record(self, report_id: str, channel: str, state: dict[str, Any]) -> None:
        with self.rt.store.engine.begin() as conn:
            raw = conn.execute(select(reports.c.deliveries).where(reports.c.id == report_id)).scalar_one_or_none()
            if raw is None:
                return
            deliveries = json.loads(raw)
            deliveries[channel] = state
            conn.execute(reports.update().where(reports.c.id == report_id).values(deliveries=json.dumps(deliveries)))

    def due(self, now_unix: float) -> Period | None:
        """Last week's report when its scheduled time has passed and it is not stored: what a
        collector that was down (or restarted) at the scheduled time still owes."""
        cfg = self.config
        period = parse_week("last", cfg.timezone, now_unix)
        tz = ZoneInfo(cfg.timezone)
        monday = datetime.fromtimestamp(period.end, tz).date()
        hour, minute = (int(x) for x in cfg.schedule_time.split(":"))
        day = monday + timedelta(days=DAYS.index(cfg.schedule_day))
        scheduled = datetime(day.year, day.month, day.day, hour, minute, tzinfo=tz).timestamp()
        if now_unix < scheduled or self.get(builder.report_id(period), "id") is not None:
            return None
        return period

    async def run_scheduled(self, period: Period | None = None) -> None:
        """The cron job: last week's report, stored, then delivered."""
        period = period or parse_week("last", self.config.timezone, self.rt.now())
        started = time.perf_counter()
        built = await asyncio.to_thread(self.generate, period)
        log.info("weekly report %s built in %.1f s", built.id, time.perf_counter() - started)
        await self.deliver(built)

    # --- reading --------------------------------------------------------------------------------

    def list(self) -> list[dict[str, Any]]:
        cols = [reports.c.id, reports.c.title, reports.c.start_unix, reports.c.end_unix, reports.c.created_unix]
        with self.rt.store.engine.connect() as conn:
            rows = conn.execute(select(*cols, reports.c.deliveries).order_by(reports.c.start_unix.desc())).all()
        return [
            {
                "id": r.id,
                "title": r.title,
                "start_unix": r.start_unix,
                "end_unix": r.end_unix,
                "created_unix": r.created_unix,
                "deliveries": json.loads(r.deliveries),
                "url": f"/reports/{r.id}",
            }
            for r in rows
        ]

    def get(self, report_id: str, column: str) -> str | None:
        with self.rt.store.engine.connect() as conn:
            value = conn.execute(select(reports.c[column]).where(reports.c.id == report_id)).scalar_one_or_none()
        return None if value is None else str(value)

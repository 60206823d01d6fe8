"""APScheduler wiring: it only triggers; the work is in Runtime and the functions it calls.

Scrapes are not APScheduler jobs: each target runs on its own fixed slots
(collector/sources/scrapeloop.py), which an interval trigger with jitter cannot give (it adds the
jitter to the previous run time, so the schedule drifts and targets bunch up)."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime, timedelta

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

from collector import gcpolicy
from collector.runtime import Runtime, ShuttingDown

log = logging.getLogger(__name__)


def build_scheduler(runtime: Runtime) -> AsyncIOScheduler:
    """Derive, SLO evaluation and compaction (scrapes run in Runtime.loops)."""
    scheduler = AsyncIOScheduler(
        timezone=UTC, job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None}
    )
    now = datetime.now(UTC)
    scheduler.add_job(
        runtime.tracked(_derive, "derive"),
        IntervalTrigger(seconds=runtime.settings.derive_interval),
        args=[runtime],
        id="derive",
        next_run_time=now + timedelta(seconds=1),
    )
    if runtime.drift is not None:
        scheduler.add_job(
            runtime.tracked(_drift, "drift"),
            IntervalTrigger(seconds=runtime.settings.drift.interval),
            args=[runtime],
            id="drift",
            next_run_time=now + timedelta(seconds=3),
        )
    if runtime.rules is not None:
        scheduler.add_job(
            runtime.tracked(_evaluate, "evaluate"),
            IntervalTrigger(seconds=runtime.rules.evaluation_interval_seconds),
            args=[runtime, scheduler],
            id="slo",
            next_run_time=now + timedelta(seconds=5),
        )
    report = runtime.settings.report
    if report.enabled:
        scheduler.add_job(
            runtime.tracked(_weekly_report, "weekly_report"),
            report_trigger(runtime),
            args=[runtime],
            id="report",
        )
        # a collector that was down (or restarted) at the scheduled time sends the week's report
        # once it is back, unless it is stored already
        scheduler.add_job(
            runtime.tracked(_weekly_report_catch_up, "weekly_report_catch_up"),
            DateTrigger(now + timedelta(seconds=60)),
            args=[runtime],
            id="report-catch-up",
        )
    # the objects a derive pass leaves are frozen after it (collector/gcpolicy.py); once an hour
    # they are put back and collected
    scheduler.add_job(
        runtime.tracked(_collect_frozen, "gc"),
        IntervalTrigger(seconds=gcpolicy.COLLECT_FROZEN_SECONDS),
        args=[runtime],
        id="gc",
    )
    scheduler.add_job(
        runtime.tracked(_compact, "compact"),
        IntervalTrigger(seconds=runtime.settings.retention.compaction_interval),
        args=[runtime],
        id="compact",
        next_run_time=now + timedelta(seconds=30),
    )
    return scheduler


def report_trigger(runtime: Runtime) -> CronTrigger:
    """`report.schedule_day` at `report.schedule_time`, in `report.timezone`."""
    report = runtime.settings.report
    hour, minute = (int(x) for x in report.schedule_time.split(":"))
    return CronTrigger(day_of_week=report.schedule_day, hour=hour, minute=minute, timezone=report.timezone)


async def _elected(runtime: Runtime, what: str) -> bool:
    """Sharded (collector/cluster.py), whether this collector is the elected one (taking the lock
    if no collector holds it); unsharded, always."""
    if runtime.cluster is None:
        return True
    if await asyncio.to_thread(runtime.cluster.leadership.check):
        return True
    log.debug("%s: the elected collector's job, not this one's", what)
    return False


async def _weekly_report(runtime: Runtime) -> None:
    from collector.report.service import ReportService

    if not await _elected(runtime, "the weekly report"):
        return
    try:
        await ReportService(runtime).run_scheduled()
    except Exception:
        log.exception("the weekly report failed; `llmslo report --week last` builds it by hand")


async def _weekly_report_catch_up(runtime: Runtime) -> None:
    from collector.report.service import ReportService

    service = ReportService(runtime)
    if not await _elected(runtime, "the weekly report"):
        return
    try:
        period = await asyncio.to_thread(service.due, runtime.now())
        if period is not None:
            log.info("the weekly report for %s was not built at its time: building it now", period.label)
            await service.run_scheduled(period)
    except Exception:
        log.exception("the weekly report failed; `llmslo report --week last` builds it by hand")


async def _derive(runtime: Runtime) -> None:
    try:
        with runtime.pass_switching.computing():
            await asyncio.to_thread(runtime.refresh_snapshot, runtime.now())
    except Exception:
        log.exception("refreshing derived metrics failed; the previous snapshot stays in place")
    gcpolicy.freeze()  # what the pass left is long-lived: out of the cyclic collector's walks


async def _collect_frozen(_runtime: Runtime) -> None:
    started = time.perf_counter()
    freed = gcpolicy.collect_frozen()
    log.debug("hourly full garbage collection: %d objects freed in %.2f s", freed, time.perf_counter() - started)


async def _drift(runtime: Runtime) -> None:
    assert runtime.drift is not None
    # drift is judged over the whole fleet's stored minutes: sharded, by the elected collector,
    # which sends its alerts (the others would each repeat the same reads)
    if not await _elected(runtime, "drift"):
        return
    if runtime.drift_waits(runtime.now()):
        if not runtime.drift_waiting:
            log.info("drift: the first pass waits for the SLO ledger's first fill (both read the stored history)")
            runtime.drift_waiting = True
        return
    try:
        with runtime.pass_switching.computing():
            await asyncio.to_thread(runtime.drift.evaluate, runtime.now())
    except ShuttingDown:
        log.info("drift: the reference build stopped at shutdown (what it read and saved is kept)")
    except Exception:
        log.exception("drift evaluation failed; the previous findings stay in place")


async def _evaluate(runtime: Runtime, scheduler: AsyncIOScheduler | None = None) -> None:
    """Evaluate SLOs, then deliver alerts; a failing Alertmanager never stops evaluation. Once
    the SLO ledger's first fill is done, drift's first pass, which waited for it, runs at once."""
    try:
        with runtime.pass_switching.computing():
            await asyncio.to_thread(runtime.evaluate_slos, runtime.now())
    except ShuttingDown:
        log.info("the SLO ledger's first fill stopped at shutdown; the next start fills it again")
        return
    except Exception:
        log.exception("SLO evaluation failed; it will run again")
    if runtime.drift_waiting and not runtime.drift_waits(runtime.now()):
        runtime.drift_waiting = False
        if scheduler is not None:
            scheduler.modify_job("drift", next_run_time=datetime.now(UTC))
    try:
        await runtime.deliver_alerts(runtime.now())
    except Exception:
        log.exception("alert delivery failed; alerts stay queued")


async def _compact(runtime: Runtime) -> None:
    try:
        async with runtime.store_lock:
            minutes, hours = await asyncio.to_thread(runtime.compact, runtime.now())
        if minutes or hours:
            log.info("compacted %d minute rollups into hours; expired %d hour rollups", minutes, hours)
    except Exception:
        log.exception("rollup compaction failed; it will run again")

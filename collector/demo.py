"""`llmslo demo`: the simulator and the collector in one process, with a live terminal view.

Healthy traffic, then an incident, then recovery (the built-in "demo" scenario); the view shows,
per business type, TTFT and TPOT p95 against the seeds' objectives, request rate, prefix-cache
hit ratio and queue depth, as the collector computes them from its own scrapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import uvicorn
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from collector.analytics.percentiles import QuantileEstimate
from collector.analytics.serving import ServingReport, ServingStats
from collector.api.app import create_app
from collector.api.embedded import EmbeddedServer
from collector.config import Settings
from collector.runtime import Runtime
from collector.sim.fastclock import targets_for
from collector.sim.scenario import Scenario
from collector.sim.server import Simulation
from collector.slo.evaluate import SloStatus

DEFAULT_RULES = Path(str(resources.files("collector").joinpath("data", "default-rules.yaml")))

# The seeds' latency targets per business type as p95 thresholds (seconds), for the p95 column;
# the SLO column shows the burn-rate alerts of the shipped rules (error budgets, not p95s).
OBJECTIVES: dict[str, dict[str, float]] = {
    "chat": {"ttft": 1.0, "tpot": 0.066},
    "customer_service": {"ttft": 2.0, "tpot": 0.1},
    "code_completion": {"ttft": 0.5, "tpot": 0.05},
    "batch": {},
}


@dataclass(frozen=True)
class DemoResult:
    report: ServingReport | None
    slos: list[SloStatus]


def _p95(stats: ServingStats, metric: str) -> QuantileEstimate | None:
    lat = stats.latencies.get(metric)
    if lat is None:
        return None
    return next((q for q in lat.quantiles if q.quantile == 0.95), None)


def _seconds(x: float) -> str:
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s"


def _estimate(q: QuantileEstimate) -> str:
    """An interpolated p95 with the bucket it fell in: '~24 ms (10-25)', '<= 10 ms', '>= 60 s'."""
    if q.below_first_bound:
        return f"<= {_seconds(q.upper_bound)}"
    if q.above_top_bound:
        return f">= {_seconds(q.lower_bound)}"
    scale, unit = (1000, "") if q.upper_bound < 1 else (1, " s")
    return f"~{_seconds(q.value)} ({q.lower_bound * scale:g}-{q.upper_bound * scale:g}{unit})"


def _cell(q: QuantileEstimate | None, objective: float | None) -> Text:
    if q is None:
        return Text("no data", style="dim")
    value = q.value
    text = _estimate(q)
    if objective is None:
        return Text(text)
    ok = value <= objective
    return Text(
        f"{text} / {objective * 1000:.0f} ms" if objective < 1 else f"{text} / {objective:g} s",
        style="green" if ok else "bold red",
    )


def _slo_cell(severity: str | None) -> Text:
    if severity == "page":
        return Text("PAGE", style="bold white on red")
    if severity == "ticket":
        return Text("ticket", style="yellow")
    return Text("ok", style="green")


def render_view(
    report: ServingReport | None, sim: Simulation, base: str, alerts: dict[str, str] | None = None
) -> Group:
    t = sim.now
    header = Text(
        f"llmslo demo   t = {int(t // 60)}:{int(t % 60):02d}   API {base}/api/v1/serving   "
        f"metrics {base}/metrics   docs {base}/docs   (Ctrl-C stops)",
        style="bold",
    )
    active = [i for i in sim.scenario.incidents if i.active(t)]
    upcoming = [i for i in sim.scenario.incidents if i.start > t]
    if active:
        state = Text(
            "incident: " + ", ".join(f"{i.kind} x{i.factor:g}" if i.factor != 1 else i.kind for i in active),
            style="bold red",
        )
    elif upcoming:
        nxt = upcoming[0]
        state = Text(
            f"healthy; next incident ({nxt.kind}) at {int(nxt.start // 60)}:{int(nxt.start % 60):02d}",
            style="green",
        )
    else:
        state = Text("healthy (no incident left in the scenario)", style="green")
    table = Table(
        title="per business type, last minute: p95 ~interpolated (vLLM bucket) / objective; SLO = burn-rate alerts"
    )
    for col in ("business type", "req/s", "TTFT p95", "TPOT p95", "cache hit", "waiting", "p95s", "SLO"):
        table.add_column(col)
    if report is not None:
        for b in report.business_types:
            s = b.stats
            obj = OBJECTIVES.get(b.business_type, {})
            ttft, tpot = _p95(s, "ttft"), _p95(s, "tpot")
            breach = (ttft is not None and "ttft" in obj and ttft.value > obj["ttft"]) or (
                tpot is not None and "tpot" in obj and tpot.value > obj["tpot"]
            )
            table.add_row(
                b.business_type,
                f"{s.requests_per_second:.1f}" if s.requests_per_second is not None else "-",
                _cell(ttft, obj.get("ttft")),
                _cell(tpot, obj.get("tpot")),
                f"{s.prefix_cache_hit_ratio:.0%}" if s.prefix_cache_hit_ratio is not None else "-",
                f"{s.requests_waiting.last:.0f}" if s.requests_waiting else "-",
                Text("over", style="bold red") if breach else Text("ok", style="green"),
                _slo_cell((alerts or {}).get(b.business_type)),
            )
    return Group(header, state, table)


async def run_demo(
    scenario: Scenario,
    host: str = "127.0.0.1",
    port: int = 9464,
    data_dir: str = "./data",
    duration: float | None = None,
    live: bool = True,
) -> DemoResult:
    """Run until Ctrl-C (or `duration` seconds); returns the last report and SLO statuses."""
    sim = Simulation(scenario, host=host)
    await sim.start()
    targets = targets_for(scenario, lambda r: sim.url(r))
    db = Path(data_dir) / "demo.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    db.unlink(missing_ok=True)  # every demo starts from an empty store
    settings = Settings.model_validate(
        {
            "data_dir": data_dir,
            "database_url": f"sqlite:///{db}",
            "server": {"host": host, "port": port},
            "windows": ["1m", "5m"],
            "rules": str(DEFAULT_RULES),
            "derive_interval": "5s",
            "scrape": {"interval": "5s", "timeout": "4s"},
            "targets": [t.model_dump() for t in targets],
        }
    )
    runtime = Runtime(settings)
    if runtime.rules is not None:  # a demo lasts minutes: evaluate every 5 s, not every 30 s
        runtime.rules = dataclasses.replace(runtime.rules, evaluation_interval_seconds=5.0)
    server = EmbeddedServer(
        uvicorn.Config(create_app(settings, runtime), host=host, port=port, log_level="warning", access_log=False)
    )
    serve_task = asyncio.create_task(server.serve())
    base = f"http://{host}:{port}"
    started = time.monotonic()
    report: ServingReport | None = None
    try:
        while not server.started:
            if serve_task.done():
                serve_task.result()
            await asyncio.sleep(0.05)
        with (
            Live(render_view(None, sim, base), refresh_per_second=2, transient=False)
            if live
            else (contextlib.nullcontext()) as view
        ):
            while duration is None or time.monotonic() - started < duration:
                report = await asyncio.to_thread(runtime.report, 60.0, time.time())
                worst: dict[str, str] = {}
                for inst in runtime.alerts.active():
                    if inst.state == "firing":
                        bt = inst.labels["business_type"]
                        if worst.get(bt) != "page":
                            worst[bt] = inst.labels["severity"]
                if view is not None:
                    view.update(render_view(report, sim, base, worst))
                await asyncio.sleep(2.0)
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await serve_task
        await sim.stop()
    return DemoResult(report, list(runtime.slo_statuses))

"""`llmslo demo`: the simulator and the collector in one process, with a live terminal view.

Healthy traffic, then an incident, then recovery (the built-in "demo" scenario); the view shows,
per business type, TTFT and TPOT p95 against the seeds' objectives, request rate, prefix-cache
hit ratio and queue depth, as the collector computes them from its own scrapes, and when the
scenario has a canary (a deployment with a `traffic_share`), its verdict against the stable
replicas (`llmslo compare`'s, from the same store).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import uvicorn
import yaml
from rich.console import Group
from rich.live import Live
from rich.logging import RichHandler
from rich.table import Table
from rich.text import Text

from collector.analytics.percentiles import QuantileEstimate
from collector.analytics.serving import ServingReport, ServingStats
from collector.api.app import create_app
from collector.api.embedded import EmbeddedServer
from collector.config import Settings, format_duration
from collector.drift.compare import Comparison, Selector
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


def _slo_cell(firing: list[tuple[str, str, str]]) -> Text:
    """The business type's firing burn-rate alerts: which SLO, which pair, page or ticket."""
    if not firing:
        return Text("ok", style="green")
    out = Text()
    for i, (slo, severity, pair) in enumerate(sorted(firing, key=lambda f: (f[1] != "page", f[0]))):
        if i:
            out.append(", ")
        style = "bold white on red" if severity == "page" else "yellow"
        out.append(f"{'PAGE' if severity == 'page' else 'ticket'} {slo} {pair}", style=style)
    return out


Firing = dict[str, list[tuple[str, str, str]]]  # business type -> [(slo, severity, long/short)]


def firing_alerts(runtime: Runtime) -> Firing:
    """Firing alerts per business type: burn-rate alerts by SLO and window pair, the incident
    alerts (cache collapse, drift, restarts, targets down) by name and what they concern."""
    out: Firing = {}
    for inst in runtime.alerts.active():
        if inst.state != "firing":
            continue
        lbl = inst.labels
        if "slo" in lbl:
            name, detail = lbl["slo"], f"{lbl.get('long_window', '')}/{lbl.get('short_window', '')}"
        else:
            name = lbl.get("alertname", "").removeprefix("LLMSLO")
            detail = lbl.get("signal") or lbl.get("target") or ""
        bt = lbl.get("business_type")
        if bt is None and "target" in lbl and lbl["target"] in runtime.targets:
            bt = runtime.targets[lbl["target"]].business_type
        out.setdefault(bt or "fleet", []).append((name, lbl.get("severity", ""), detail))
    return out


def measured(report: ServingReport | None, firing: Firing) -> tuple[str, str]:
    """What the collector measures now, in one line, and its style: the business types over
    their p95 objective (with where the time goes: queue or prefill), and the alerts firing."""
    if report is None:
        return "measuring: waiting for the first scrapes", "dim"
    problems = []
    for b in report.business_types:
        obj = OBJECTIVES.get(b.business_type, {})
        ttft = _p95(b.stats, "ttft")
        if ttft is not None and "ttft" in obj and ttft.value > obj["ttft"]:
            why = ""
            queue, prefill = b.stats.latencies.get("queue"), b.stats.latencies.get("prefill")
            if queue and prefill and queue.mean_seconds is not None and prefill.mean_seconds is not None:
                where = "queue" if queue.mean_seconds > prefill.mean_seconds else "prefill"
                why = f" (mean queue {_seconds(queue.mean_seconds)}, prefill {_seconds(prefill.mean_seconds)}: {where})"
            problems.append(f"{b.business_type} TTFT p95 {_estimate(ttft)} over {_seconds(obj['ttft'])}{why}")
    pages = sorted({slo for f in firing.values() for slo, sev, _ in f if sev == "page"})
    tickets = sorted({slo for f in firing.values() for slo, sev, _ in f if sev != "page"})
    parts = problems or ["every business type within its p95 objectives"]
    alerts = []
    if pages:
        alerts.append("PAGING " + ", ".join(pages))
    if tickets:
        alerts.append("tickets " + ", ".join(tickets))
    line = "measured: " + "; ".join(parts) + ("; " + "; ".join(alerts) if alerts else "; no alert firing")
    style = "bold red" if pages or problems else "yellow" if tickets else "green"
    return line, style


@dataclass(frozen=True)
class Canary:
    """The scenario's canary as the demo compares it: which replicas, how much of what traffic."""

    business_type: str
    share: float
    model: str
    replicas: list[str]

    @staticmethod
    def of(scenario: Scenario) -> Canary | None:
        for dep in scenario.deployments:
            if dep.traffic_share is not None:
                replicas = [f"{dep.name}-{i}" for i in range(dep.replicas)]
                return Canary(dep.business_types[0], dep.traffic_share, dep.model.name, replicas)
        return None

    def line(self, verdict: Comparison | None, since: str) -> tuple[str, str]:
        """The canary's line in the view, and its style."""
        what = f"canary {', '.join(self.replicas)} ({self.model}, {self.share:.0%} of {self.business_type})"
        if verdict is None:
            return f"{what}: not compared yet", "dim"
        counts = f"{verdict.candidate_requests:,.0f} vs {verdict.baseline_requests:,.0f} requests since {since}"
        style = {"rollback": "bold red", "promote": "green"}.get(verdict.verdict, "yellow")
        reasons = verdict.reason.split("); ")  # one per metric: the first two, and how many more
        reason = "); ".join(reasons[:2]) + (f"); and {len(reasons) - 2} more" if len(reasons) > 2 else "")
        return f"{what} vs stable, {counts}: {reason}", style


def compare_canary(runtime: Runtime, since: float, now: float) -> Comparison:
    """The canary replicas (`track: canary`) against the stable ones, since the demo began, as
    `llmslo compare --baseline track=stable --candidate track=canary --source engines` would judge them."""
    end = int(now) // 60 * 60 + 60
    stable, canary = Selector.parse("track=stable"), Selector.parse("track=canary")
    return runtime.compare(stable, canary, int(since) // 60 * 60, end, "engines")


def clock(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def scenario_line(sim: Simulation) -> str:
    t = sim.now
    active = [i for i in sim.scenario.incidents if i.active(t)]
    upcoming = [i for i in sim.scenario.incidents if i.start > t]
    if active:
        return "scenario: " + ", ".join(
            f"{i.kind}{f' x{i.factor:g}' if i.factor != 1 else ''} until {clock(i.start + i.duration)}" for i in active
        )
    if upcoming:
        return f"scenario: next incident {upcoming[0].kind} at {clock(upcoming[0].start)}"
    return "scenario: no incident left (the alerts resolve as their windows clear)"


def render_view(
    report: ServingReport | None,
    sim: Simulation,
    base: str,
    firing: Firing | None = None,
    scale_note: str = "",
    alertmanager: str | None = None,
    canary: tuple[str, str] | None = None,
) -> Group:
    t = sim.now
    firing = firing or {}
    header = Text(f"llmslo demo   t = {int(t // 60)}:{int(t % 60):02d}   {scale_note}", style="bold")
    line, style = measured(report, firing)
    links = f"API {base}/api/v1/slos   metrics {base}/metrics"
    links += f"   Alertmanager {alertmanager}" if alertmanager else "   (no Alertmanager installed: alerts listed here)"
    table = Table(
        title="per business type, last minute: p95 ~interpolated in its vLLM bucket (from-to) / objective",
        caption="Ctrl-C stops",
    )
    for col in ("business type", "req/s", "TTFT p95", "TPOT p95", "cache hit", "waiting", "p95 vs objective", "alerts"):
        table.add_column(col, overflow="fold")
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
                Text("over", style="bold red") if breach else Text("within", style="green"),
                _slo_cell(firing.get(b.business_type, [])),
            )
    parts: list[Text | Table] = [
        header,
        Text(line, style=style),
        Text(scenario_line(sim), style="dim"),
        Text(links),
        table,
    ]
    if canary is not None:
        parts.append(Text(canary[0], style=canary[1]))
    return Group(*parts)


def scaled_rules(data_dir: Path, scale: float, alertmanager_url: str | None) -> Path:
    """The shipped rules on the demo's compressed clock: every SLO window `scale` as long."""
    text = DEFAULT_RULES.read_text()
    text = text.replace("evaluation_interval: 30s", f"evaluation_interval: 5s\nwindow_scale: {scale!r}")
    if scale < 1:  # the incident tickets' own windows on the same clock (at least a minute)
        for key, seconds, least in (
            ("restart_window", 600, 60),
            ("prefix_cache_window", 300, 120),
            ("prefix_cache_reference", 3600, 240),
        ):
            text = re.sub(rf"({key}: )\S+", rf"\g<1>{max(least, int(seconds * scale))}s", text)
    if alertmanager_url:
        text += f"\nalertmanager: {{url: {alertmanager_url}}}\n"
    path = data_dir / "demo-rules.yaml"
    path.write_text(text)
    return path


def start_alertmanager(data_dir: Path, rules_path: Path, host: str) -> tuple[subprocess.Popen[bytes], str] | None:
    """Debian's Alertmanager on loopback with the generated routing, when it is installed."""
    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if binary is None:
        return None
    from collector.generate.alertmanager import alertmanager_config
    from collector.slo.spec import load_rules

    with socket.socket() as sock:
        sock.bind((host, 0))
        port = int(sock.getsockname()[1])
    config = data_dir / "demo-alertmanager.yml"
    config.write_text(yaml.safe_dump(alertmanager_config(load_rules(rules_path).rules)))
    proc = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.path={data_dir / 'demo-alertmanager'}",
         f"--web.listen-address={host}:{port}", "--cluster.listen-address="],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return proc, f"http://{host}:{port}"


class PlainLog:
    """Without a terminal (output piped to a file): one line per event, and what is measured
    once a minute."""

    def __init__(self) -> None:
        self.firing: set[tuple[str, str, str]] = set()
        self.incidents: set[str] = set()
        self.last_state = ""
        self.last_print = -1e9
        self.last_verdict = ""

    def update(
        self, report: ServingReport | None, sim: Simulation, firing: Firing, canary: tuple[str, str] | None = None
    ) -> None:
        t = sim.now
        stamp = f"[{int(t // 60)}:{int(t % 60):02d}]"
        now = {(bt, slo, f"{sev} {pair}") for bt, items in firing.items() for slo, sev, pair in items}
        for bt, slo, what in sorted(now - self.firing):
            print(f"{stamp} FIRING {what} {slo} ({bt})", flush=True)
        for bt, slo, what in sorted(self.firing - now):
            print(f"{stamp} resolved {what} {slo} ({bt})", flush=True)
        self.firing = now
        active = {i.kind for i in sim.scenario.incidents if i.active(t)}
        for kind in sorted(active - self.incidents):
            print(f"{stamp} scenario: {kind} starts", flush=True)
        for kind in sorted(self.incidents - active):
            print(f"{stamp} scenario: {kind} ends", flush=True)
        self.incidents = active
        line, _ = measured(report, firing)
        # a new line when what is over its objective changes, else every half minute
        state = " ".join(sorted(re.findall(r"(\S+) TTFT p95", line))) + "|" + str(sorted(now))
        if report is not None and (state != self.last_state or t - self.last_print >= 30):
            print(f"{stamp} {line}", flush=True)
            self.last_state, self.last_print = state, t
        # the canary: a line when its verdict changes (hold, promote, rollback), once it has traffic
        found = re.search(r"vs stable, ([\d,]+) vs .* since \S+: (\w+)", canary[0]) if canary else None
        if canary is not None and found and found.group(1) != "0" and found.group(2) != self.last_verdict:
            print(f"{stamp} {canary[0]}", flush=True)
            self.last_verdict = found.group(2)


async def run_demo(
    scenario: Scenario,
    host: str = "127.0.0.1",
    port: int = 9464,
    data_dir: str = "./data",
    duration: float | None = None,
    live: bool = True,
    window_scale: float = 1 / 60,
    alertmanager: bool = True,
) -> DemoResult:
    """Run until Ctrl-C (or `duration` seconds); returns the last report and SLO statuses.

    The SLO windows run on a compressed clock (`window_scale`: 1/60 makes the 1h burn window
    1 minute), so that a page, its cause and its resolution all happen within minutes."""
    restore_sigterm = _stop_on_sigterm()
    sim = Simulation(scenario, host=host)
    await sim.start()
    targets = targets_for(scenario, lambda r: sim.url(r))
    folder = Path(data_dir)
    db = folder / "demo.db"
    folder.mkdir(parents=True, exist_ok=True)
    db.unlink(missing_ok=True)  # every demo starts from an empty store
    am = start_alertmanager(folder, scaled_rules(folder, window_scale, None), host) if alertmanager else None
    rules_path = scaled_rules(folder, window_scale, am[1] if am else None)
    settings = Settings.model_validate(
        {
            "data_dir": data_dir,
            "database_url": f"sqlite:///{db}",
            "server": {"host": host, "port": port},
            "windows": ["1m", "5m"],
            "rules": str(rules_path),
            "derive_interval": "5s",
            "scrape": {"interval": "5s", "timeout": "4s"},
            "targets": [t.model_dump() for t in targets],
            "report": {"enabled": False},
            # drift judged on the compressed clock too: two minutes against the six before them
            "drift": {"window": "2m", "reference_length": "6m", "refresh": "30s", "min_events": 50},
        }
    )
    runtime = Runtime(settings)
    scale_note = (
        f"clock: SLO windows {1 / window_scale:g}x shorter (the 1h/5m page pair reads "
        f"{format_duration(3600 * window_scale)}/{format_duration(300 * window_scale)})"
        if window_scale != 1
        else "clock: real SLO windows"
    )
    server = EmbeddedServer(
        uvicorn.Config(create_app(settings, runtime), host=host, port=port, log_level="warning", access_log=False)
    )
    serve_task = asyncio.create_task(server.serve())
    base = f"http://{host}:{port}"
    started, began = time.monotonic(), time.time()
    canary = Canary.of(scenario)
    report: ServingReport | None = None
    plain = None if live else PlainLog()
    logging.getLogger("alembic").setLevel(logging.WARNING)  # schema set-up chatter
    if plain is not None:
        print(f"llmslo demo: {scale_note}; API {base}" + (f"; Alertmanager {am[1]}" if am else ""), flush=True)
    try:
        while not server.started:
            if serve_task.done():
                serve_task.result()
            await asyncio.sleep(0.05)
        with (
            Live(render_view(None, sim, base, None, scale_note), refresh_per_second=2)
            if live
            else (contextlib.nullcontext()) as view
        ):
            if view is not None:  # log records through the live console, not over the view
                root = logging.getLogger()
                for handler in list(root.handlers):
                    root.removeHandler(handler)
                root.addHandler(RichHandler(console=view.console, show_path=False))
            verdict: Comparison | None = None
            compared = -1e9
            while duration is None or time.monotonic() - started < duration:
                report = await asyncio.to_thread(runtime.report, 60.0, time.time())
                firing = firing_alerts(runtime)
                if canary is not None and time.monotonic() - compared >= 10.0:
                    verdict = await asyncio.to_thread(compare_canary, runtime, began, time.time())
                    compared = time.monotonic()
                canary_line = canary.line(verdict, "0:00") if canary is not None else None
                if view is not None:
                    alerting = am[1] if am else None
                    view.update(render_view(report, sim, base, firing, scale_note, alerting, canary_line))
                elif plain is not None:
                    plain.update(report, sim, firing, canary_line)
                await asyncio.sleep(2.0)
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await serve_task
        await sim.stop()
        if am is not None:
            am[0].terminate()
            am[0].wait(10)
        restore_sigterm()
    return DemoResult(report, list(runtime.slo_statuses))


def _stop_on_sigterm() -> Callable[[], None]:
    """`kill` (SIGTERM: a service manager, `docker stop`) stops the demo as Ctrl-C does, so that
    it stops the Alertmanager it started (by default SIGTERM ended the process at once and left
    that Alertmanager running): the demo's task is cancelled, its clean-up runs. Returns what
    undoes it."""
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    if task is None:
        return lambda: None
    try:
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
        return lambda: None

    def restore() -> None:
        loop.remove_signal_handler(signal.SIGTERM)

    return restore

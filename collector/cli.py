"""The `llmslo` command: serve, demo, simulate, cost, capacity, drift, compare, check-config, check,
generate, db, inspect, example-target."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collector import __version__, gcpolicy
from collector.config import ConfigError, Settings, TargetConfig, load_settings
from collector.secrets import redact_url
from collector.sources.expfmt import ExpositionError

if TYPE_CHECKING:
    from collector.sim.scenario import Scenario


def _load(args: argparse.Namespace) -> Settings:
    path = args.config or os.environ.get("LLMSLO_CONFIG")
    settings = load_settings(path)
    if settings.traces.otlp_grpc_port is not None and importlib.util.find_spec("grpc") is None:
        raise ConfigError(["traces.otlp_grpc_port: OTLP/gRPC needs grpcio: pip install 'llmslo[grpc]'"])
    return settings


def _load_or_report(args: argparse.Namespace) -> Settings | None:
    """The settings, or None after printing every configuration problem."""
    try:
        return _load(args)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"config: {problem}", file=sys.stderr)
        return None


def cmd_check_config(args: argparse.Namespace) -> int:
    try:
        settings = _load(args)
        if args.rules:
            settings = settings.model_copy(update={"rules": args.rules})
        _check_fleet_map(settings)
    except ConfigError as exc:
        print(f"{len(exc.problems)} problem(s) in the configuration:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return 2
    database = redact_url(settings.resolved_database_url)
    print(f"configuration OK: {len(settings.targets)} target(s){_shard_note(settings)}, database {database}")
    return 0


def _shard_note(settings: Settings) -> str:
    """Sharded: how many of the targets this collector scrapes."""
    c = settings.cluster
    if c.name is None:
        return ""
    mine = sum(1 for t in settings.targets if c.scrapes(t.name))
    return f" ({mine} in shard {c.shard} of {c.shards}, collector {c.name})"


def _check_fleet_map(settings: Settings) -> None:
    """The targets' business types against the SLO rules' model lists (the two views of one map)."""
    if not settings.rules:
        return
    from collector.fleetmap import static_conflicts
    from collector.slo.spec import RulesError, load_rules

    try:
        rules = load_rules(settings.rules).rules
    except RulesError as exc:
        raise ConfigError([f"rules: {p}" for p in exc.problems]) from None
    problems = static_conflicts(settings.targets, rules)
    if problems:
        raise ConfigError(problems)


def cmd_db(args: argparse.Namespace) -> int:
    """`llmslo db upgrade` applies the schema migrations (serve does too, at start-up);
    `llmslo db current` prints the database's revision; `llmslo db recount-slos` forgets the SLO
    ledger's saved counts (collector/slo/saved.py), so that the next start counts the SLO period
    from the stored rollups again."""
    from sqlalchemy.exc import SQLAlchemyError

    from collector.store import migrate
    from collector.store.repository import make_engine

    settings = _load_or_report(args)
    if settings is None:
        return 2
    database = redact_url(settings.resolved_database_url)
    engine = make_engine(settings.resolved_database_url)
    try:
        if args.action == "current":
            print(f"{database}: revision {migrate.current(engine) or 'none'} (newest {migrate.head()})")
            return 0
        if args.action == "recount-slos":
            return _forget_slo_counts(engine, database, args.force)
        before, after = migrate.upgrade(engine)
    except SQLAlchemyError as exc:
        print(f"{database}: {type(exc).__name__}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    finally:
        engine.dispose()
    print(
        f"{database}: upgraded from {before or 'an empty database'} to {after}"
        if before != after
        else f"{database}: at {after}, nothing to do"
    )
    return 0


def _forget_slo_counts(engine: Any, database: str, force: bool) -> int:
    """Delete the saved SLO counts, unless a collector saved some in the last few minutes (it
    would save again from where it is, and a later start would take that for the whole count)."""
    import sqlalchemy as sa

    from collector.slo.saved import JUDGED, SLICES
    from collector.store import migrate
    from collector.store.tables import slo_count_keys, slo_counts

    migrate.upgrade(engine)
    with engine.begin() as conn:
        newest = conn.execute(sa.select(sa.func.max(slo_count_keys.c.through_unix))).scalar()
        if newest is not None and newest > time.time() - 600 and not force:
            print(
                f"{database}: a collector saved SLO counts {time.time() - newest:.0f} s ago: stop every "
                "collector on this database first (or pass --force)",
                file=sys.stderr,
            )
            return 1
        keys = conn.execute(sa.delete(slo_count_keys).where(slo_count_keys.c.key.not_in((SLICES, JUDGED)))).rowcount
        conn.execute(sa.delete(slo_count_keys))
        rows = conn.execute(sa.delete(slo_counts)).rowcount
    print(f"{database}: forgot the saved SLO counts ({keys} keys, {rows} rows); the next start counts "
          "the SLO period from the stored rollups")  # fmt: skip
    return 0


def _offline_runtime(args: argparse.Namespace, inventory: bool = True):  # type: ignore[no-untyped-def]
    """A Runtime over the configured database, for commands that only read it (nothing is
    scraped); None after printing what is wrong."""
    from collector.runtime import Runtime

    settings = _load_or_report(args)
    if settings is None:
        return None
    if inventory and not settings.deployments:
        print("config: no `deployments:` (GPU type and price per deployment): nothing to cost", file=sys.stderr)
        return None
    return Runtime(settings)


def _window(args: argparse.Namespace) -> tuple[int, int]:
    from datetime import datetime

    from collector.config import parse_duration
    from collector.runtime import window_bounds

    if args.start or args.end:
        if not (args.start and args.end):
            raise ValueError("give both --start and --end (ISO 8601 or unix seconds), or --window")

        def when(text: str) -> int:
            return (
                int(float(text))
                if text.replace(".", "", 1).isdigit()
                else int(datetime.fromisoformat(text).timestamp())
            )

        start, end = when(args.start), when(args.end)
        if end <= start:
            raise ValueError(f"--end ({args.end}) must be after --start ({args.start})")
        return start, end
    return window_bounds(time.time(), parse_duration(args.window))


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
    lines = [
        "  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths, strict=True)))
    ]
    for row in rows:
        lines.append(
            "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        )
    return "\n".join(lines)


def _utc(unix: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(unix))


def num(x: float | None, fmt: str = ",.0f") -> str:
    return "-" if x is None else format(x, fmt)


def _money(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"${x:,.{digits}f}"


def _offline_report(args: argparse.Namespace, command: str, build: Callable[..., Any]) -> tuple[Any, int, int] | int:
    """Build a report over the period the arguments name from the configured database: (the
    report, start, end), or an exit code once the JSON is printed (--json) or a problem is."""
    rt = _offline_runtime(args)
    if rt is None:
        return 2
    try:
        start, end = _window(args)
    except ValueError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return 2
    try:
        out = build(rt, start, end)
    finally:
        rt.store.close()
    if args.json:
        print(out.model_dump_json(indent=2))
        return 0
    return out, start, end


def cmd_cost(args: argparse.Namespace) -> int:
    """Cost per group over a window from the stored rollups (the same as /api/v1/cost)."""
    from collector.api.schemas import cost_out

    def build(rt, start: int, end: int):  # type: ignore[no-untyped-def]
        report = rt.cost_report(start, end)
        return cost_out(report, args.group_by, rt.cost_lines(report, args.group_by))

    done = _offline_report(args, "cost", build)
    if isinstance(done, int):
        return done
    out, start, end = done
    print(f"cost {_utc(start)} - {_utc(end)} UTC")
    print(
        _table(
            ["deployment", "gpu", "GPU-h", "allocated", "busy", "idle", "busy share", "vs API", "break-even req/day"],
            [
                [
                    d.name, d.gpu, f"{d.gpu_hours:,.1f}", _money(d.allocated_usd), _money(d.busy_usd),
                    _money(d.idle_usd), "-" if d.busy_share is None else f"{d.busy_share:.0%}",
                    _money(d.api_usd), num(d.break_even_requests_per_day),
                ]
                for d in out.deployments
            ],
        )
    )  # fmt: skip
    print()
    print(
        _table(
            [args.group_by, "requests", "cost", "$/1k req", "$/1M in", "$/1M out", "alloc $/1M", "usage $/1M",
             "util", "cache saved"],
            [
                [
                    g.key, f"{g.requests:,.0f}", _money(g.cost_usd), _money(g.usd_per_1k_requests, 3),
                    _money(g.usd_per_million_input_tokens, 3), _money(g.usd_per_million_output_tokens, 3),
                    _money(g.allocation_usd_per_million_tokens, 3), _money(g.usage_usd_per_million_tokens, 3),
                    "-" if g.utilization is None else f"{g.utilization:.0%}", _money(g.cache_savings_usd),
                ]
                for g in out.groups
            ],
        )
    )  # fmt: skip
    print(f"\nallocated {_money(out.allocated_usd)}; attributed to requests {_money(out.attributed_usd)}")
    if out.unpriced_targets:
        print(f"targets in no deployment (work shown, not costed): {', '.join(out.unpriced_targets)}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """The weekly capacity and cost report for a week or period, from the configured database:
    written to --out (or stdout); --store keeps it for /reports/<id>, --deliver sends it too."""
    from collector.report.period import PeriodError, between, parse_instant, parse_week
    from collector.report.service import ReportService, render

    rt = _offline_runtime(args, inventory=False)
    if rt is None:
        return 2
    tz = args.timezone or rt.settings.report.timezone
    try:
        from zoneinfo import ZoneInfo

        ZoneInfo(tz)
    except (KeyError, ValueError):
        print(f"report: unknown time zone {tz!r} (an IANA name such as UTC or Europe/Berlin)", file=sys.stderr)
        rt.store.close()
        return 2
    try:
        if args.start or args.end:
            if not (args.start and args.end):
                raise PeriodError("give both --start and --end, or --week")
            period = between(parse_instant(args.start, tz), parse_instant(args.end, tz), tz)
        else:
            period = parse_week(args.week, tz, time.time())
    except (PeriodError, KeyError) as exc:
        print(f"report: {exc}", file=sys.stderr)
        rt.store.close()
        return 2
    service = ReportService(rt)
    started = time.perf_counter()
    try:
        built = service.generate(period) if args.store or args.deliver else render(rt, period)
        delivered: dict[str, bool] = {}
        if args.deliver:
            delivered = asyncio.run(_deliver(service, built))
    finally:
        rt.store.close()
    body = {"html": built.html, "md": built.markdown, "json": json.dumps(built.data, indent=2)}[args.format]
    if args.out:
        Path(args.out).write_text(body, encoding="utf-8")
        print(
            f"report {built.id} ({period.label}, {args.format}) written to {args.out} "
            f"in {time.perf_counter() - started:.1f} s",
            file=sys.stderr,
        )
    else:
        sys.stdout.write(body)
    failed = [name for name, ok in delivered.items() if not ok]
    if failed:
        print(f"report: delivery failed by {', '.join(failed)} (see /api/v1/reports)", file=sys.stderr)
        return 1
    return 0


async def _deliver(service: Any, built: Any) -> dict[str, bool]:
    try:
        return dict(await service.deliver(built))
    finally:
        await service.rt.client.aclose()


def cmd_capacity(args: argparse.Namespace) -> int:
    """Capacity per deployment over a window (the same as /api/v1/capacity)."""
    from collector.api.schemas import capacity_out

    done = _offline_report(args, "capacity", lambda rt, start, end: capacity_out(start, end, rt.capacity(start, end)))
    if isinstance(done, int):
        return done
    out = done[0]

    rows = []
    for c in out.deployments:
        fit = c.memory_p99 or c.memory_p95
        rows.append(
            [
                c.deployment, c.gpu, num(c.replicas_seen, ".1f"), num(c.peak_concurrency), num(c.context_p99_tokens),
                "-" if fit is None or fit.needed_gib is None else f"{fit.needed_gib:.1f}/{fit.usable_gib:.1f}",
                "-" if fit is None or fit.fits is None else ("yes" if fit.fits else "NO"),
                num(fit.max_concurrency if fit else None), num(c.peak_tokens_per_second_at_slo),
                num(c.peak_demand_tokens_per_second), num(c.replicas_needed),
            ]
        )  # fmt: skip
    header = ["deployment", "gpu", "replicas", "peak seqs", "p99 ctx", "GiB need/usable", "fits",
              "max seqs", "tok/s/replica@SLO", "peak tok/s", "replicas needed"]  # fmt: skip
    print(_table(header, rows))
    for c in out.deployments:
        for advice in c.advice:
            print(f"{c.deployment}: {advice}")
        for name, t in c.forecasts.items():
            when = "not on the current trend"
            if t.crosses_unix is not None:
                when = time.strftime("%Y-%m-%d", time.gmtime(t.crosses_unix))
                if t.crosses_earliest_unix is not None:
                    late = (
                        "never"
                        if t.crosses_latest_unix is None
                        else time.strftime("%Y-%m-%d", time.gmtime(t.crosses_latest_unix))
                    )
                    when += f" (95 %: {time.strftime('%Y-%m-%d', time.gmtime(t.crosses_earliest_unix))} .. {late})"
            trend = f"weekly peak {t.latest:.3g}, {t.slope_per_week:+.3g}/week"
            print(f"{c.deployment}: {name} {trend}, reaches {t.limit:g}: {when}")
    return 0


def cmd_drift(args: argparse.Namespace) -> int:
    """Drift of every signal at a time (default now) from the stored rollups (as /api/v1/drift)."""
    from datetime import datetime

    from collector.api.schemas import drift_out

    rt = _offline_runtime(args, inventory=False)
    if rt is None:
        return 2
    if rt.drift is None:
        print("config: drift.enabled is false", file=sys.stderr)
        return 2
    try:
        at = time.time() if args.at is None else datetime.fromisoformat(args.at).timestamp()
    except ValueError as exc:
        print(f"drift: --at: {exc}", file=sys.stderr)
        return 2
    if args.action == "pin":
        return _drift_pin(args, rt)
    try:
        found = rt.drift.evaluate(at)
    finally:
        rt.store.close()
    if args.json:
        print(json.dumps([drift_out(f).model_dump() for f in found], indent=2))
        return 0
    if not found:
        print(f"nothing to judge: no business type had {rt.settings.drift.min_events} requests in the window")
        return 0
    rows = [
        [
            f.business_type + (f" / {f.tenant}" if f.tenant else ""), f.signal, f"{f.distances.psi:.3f}",
            f"{f.threshold.psi:.3f}" + ("" if f.threshold.calibrated else "*"), f"{f.distances.js:.3f}",
            f"{f.events:,.0f}", "DRIFT" if f.drifted else "ok",
        ]
        for f in found
    ]  # fmt: skip
    print(_table(["business type", "signal", "PSI", "threshold", "JS", "requests", ""], rows))
    print("* the default threshold: the reference has too few chunks to calibrate one")
    for f in found:
        if f.drifted:
            print(f"\n{f.summary}")
    return 1 if args.fail_on_drift and any(f.drifted for f in found) else 0


def _fraction(text: str, flag: str) -> float:
    """`10%` or `0.1`: a fraction, non-negative."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected a percentage (10%) or a fraction (0.1)") from None
    if not value >= 0:
        raise ValueError(f"{flag} {text!r}: must not be negative")
    return value


def cmd_compare(args: argparse.Namespace) -> int:
    """A deployment gate: exit 0 promote, 1 rollback, 3 hold (not enough data or inconclusive)."""
    from datetime import datetime

    from collector.api.schemas import compare_out
    from collector.config import parse_duration
    from collector.drift.compare import Selector, SelectorError, tolerances

    try:
        base, cand = Selector.parse(args.baseline), Selector.parse(args.candidate)
        window = parse_duration(args.window)
        given = [None if v is None else _fraction(v, flag) for v, flag in (
            (args.tolerance_p95, "--tolerance-p95"), (args.tolerance_p50, "--tolerance-p50"),
            (args.tolerance_errors, "--tolerance-errors"))]  # fmt: skip
        at = time.time() if args.at is None else datetime.fromisoformat(args.at).timestamp()
    except (SelectorError, ValueError) as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 2
    rt = _offline_runtime(args, inventory=False)
    if rt is None:
        return 2
    try:
        end = int(at) // 60 * 60 + 60  # the minute holding `at` and the whole minutes before it
        tol = tolerances(rt.settings.compare, given[0], given[1], given[2], args.min_requests)
        out = compare_out(rt.compare(base, cand, end - int(window), end, args.source, tol))
    except SelectorError as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 2
    finally:
        rt.store.close()
    if args.json:
        print(out.model_dump_json(indent=2))
    else:
        print(f"{out.candidate} vs {out.baseline} over {out.window} ({out.source}): {out.candidate_requests:,.0f} vs "
              f"{out.baseline_requests:,.0f} requests")  # fmt: skip
        for m in out.metrics:
            print(f"  {m.verdict:8} {m.text}")
        print(out.reason)
    return {"promote": 0, "rollback": 1}.get(out.verdict, 3)


def _drift_pin(args: argparse.Namespace, rt) -> int:  # type: ignore[no-untyped-def]
    """Freeze the reference of [start, end) (default: the trailing reference_length) under a name."""
    from collector.drift.baseline import save

    try:
        if args.start or args.end:
            start, end = _window(args)
        else:
            end = int(time.time()) // 60 * 60
            start = end - int(rt.settings.drift.reference_length)
    except ValueError as exc:
        print(f"drift pin: {exc}", file=sys.stderr)
        return 2
    window = int(rt.settings.drift.window)
    try:
        ref = rt.drift.build(start, end, window, time.time())
        if not ref.totals:
            print(f"drift pin: no drift series stored between {_utc(start)} and {_utc(end)} UTC", file=sys.stderr)
            return 2
        save(rt.store, args.name, ref, window)
    finally:
        rt.store.close()
    calibrated = sum(t.calibrated for t in ref.thresholds.values())
    print(
        f"pinned baseline {args.name!r}: {_utc(start)} - {_utc(end)} UTC, {len(ref.totals)} signal(s), "
        f"{calibrated} with thresholds calibrated for the {window // 60}-minute window"
    )
    print(f"use it with drift: {{reference: pinned, baseline: {args.name}}}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """Validate SLO rules: every problem with file, line and key path; warnings for thresholds
    that only traces can measure exactly."""
    from collector.slo.spec import RulesError, load_rules

    try:
        loaded = load_rules(args.rules)
    except RulesError as exc:
        print(f"{len(exc.problems)} problem(s) in {args.rules}:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  error: {problem}", file=sys.stderr)
        for warning in exc.warnings:
            print(f"  warning: {warning}", file=sys.stderr)
        return 2
    for warning in loaded.warnings:
        print(f"warning: {warning}")
    rules = loaded.rules
    counts = f"{len(rules.business_types)} business type(s), {len(rules.objectives)} objective(s)"
    print(f"{args.rules}: OK: {counts}, {len(loaded.warnings)} warning(s)")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    """Compile rules/ into alerts/ and dashboards/; with --check, exit 1 if either is not what the
    rules give (stale or hand-edited)."""
    from collector.generate.dashboards import dashboard_files
    from collector.generate.files import differences, generate, leftovers, write
    from collector.slo.spec import RulesError, load_rules

    try:
        rules = load_rules(args.rules).rules
    except RulesError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    outputs = ((Path(args.out), generate(rules)), (Path(args.dashboards_out), dashboard_files(rules)))
    if args.check:
        stale = [out / rel for out, files in outputs for rel in differences(files, out)]
        for path in stale:
            print(f"{path}: differs from what `llmslo generate` writes", file=sys.stderr)
        left = [out / rel for out, files in outputs for rel in leftovers(files, out)]
        for path in left:
            print(f"{path}: generated, but the rules no longer give it", file=sys.stderr)
        stale += left
        if stale:
            print("generated files are stale or hand-edited: run `llmslo generate` and commit", file=sys.stderr)
            return 1
        for out, files in outputs:
            print(f"{out}: {len(files)} generated file(s) up to date")
        return 0
    for out, files in outputs:
        changed = write(files, out)
        listing = ": " + ", ".join(changed) if changed else ""
        print(f"{out}: wrote {len(changed)} of {len(files)} generated file(s){listing}")
        for rel in leftovers(files, out):
            (out / rel).unlink()
            print(f"{out}: removed {rel} (generated, and the rules no longer give it)")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from collector.api.app import create_app

    settings = _load_or_report(args)
    if settings is None:
        return 2
    if args.rules:
        settings = settings.model_copy(update={"rules": args.rules})
    if settings.rules:
        from collector.slo.spec import RulesError, load_rules

        try:
            loaded = load_rules(settings.rules)
        except RulesError as exc:
            for problem in exc.problems:
                print(f"rules: {problem}", file=sys.stderr)
            return 2
        for warning in loaded.warnings:
            print(f"rules warning: {warning}")
    server_cfg = settings.server.model_copy(
        update={k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    )
    settings = settings.model_copy(update={"server": server_cfg})
    example = None
    if args.example:
        from collector.example_target import ExampleTarget

        example = ExampleTarget().start()
        target = TargetConfig(name="example-vllm", url=example.url, interval=5.0, timeout=4.0, business_type="chat")
        settings = settings.model_copy(update={"targets": [*settings.targets, target]})
        print(f"example vLLM target (a replayed real scrape) at {example.url}")
    base = f"http://{settings.server.host}:{settings.server.port}"
    database = redact_url(settings.resolved_database_url)
    print(f"llmslo {__version__}: {len(settings.targets)} target(s){_shard_note(settings)}, database {database}")
    print(f"  API      {base}/api/v1/serving?window=5m   {base}/api/v1/targets")
    print(f"  metrics  {base}/metrics")
    print(f"  docs     {base}/docs")
    sys.stdout.flush()
    try:
        uvicorn.run(
            create_app(settings),
            host=settings.server.host,
            port=settings.server.port,
            log_level="info",
            access_log=False,
        )
    finally:
        if example is not None:
            example.stop()
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    """Show what llmslo reads from one /metrics body (a URL or a file)."""
    import httpx

    from collector.sources.vllm import read_scrape

    source: str = args.source
    content_type = args.content_type
    if source.startswith(("http://", "https://")):
        try:
            resp = httpx.get(source, timeout=10.0, trust_env=False)
        except httpx.HTTPError as exc:
            print(f"{source}: {exc}", file=sys.stderr)
            return 1
        if resp.status_code != 200:
            print(f"{source}: HTTP {resp.status_code}", file=sys.stderr)
            return 1
        body = resp.content
        content_type = content_type or resp.headers.get("content-type")
    else:
        try:
            body = Path(source).read_bytes()
        except OSError as exc:
            print(f"{source}: cannot read: {exc.strerror or exc}", file=sys.stderr)
            return 2
    try:
        snap = read_scrape(body, content_type)
    except ExpositionError as exc:
        print(f"{source}: {exc}", file=sys.stderr)
        return 1
    text = body.decode("utf-8", "replace")
    if not args.json:
        print(_inspect_summary(source, text, snap))
        return 0
    out = {
        "vllm_naming": naming_range(text),
        "samples_used": snap.samples,
        "counters": {f"{k.model} {k.metric}{dict(k.labels) or ''}": v for k, v in sorted(snap.counters.items())},
        "gauges": {f"{k.model} {k.metric}": v for k, v in sorted(snap.gauges.items())},
        "histograms": {
            f"{k.model} {k.metric}": {"count": h.count, "sum": h.sum, "bounds": list(h.bounds)}
            for k, h in sorted(snap.histograms.items())
        },
        "units": {f"{k.model} {k.metric}": u for k, u in sorted(snap.units.items())},
    }
    print(json.dumps(out, indent=2))
    return 0


def naming_range(text: str) -> str:
    """Which vLLM releases expose these metric names (shared/reference/vllm-metrics.md section 1)."""

    def has(name: str) -> bool:
        return f"\n{name}" in f"\n{text}" or f"# TYPE {name} " in text

    lower, upper = (0, 6), None
    if has("vllm:kv_cache_usage_perc"):
        lower = max(lower, (0, 9))
    if has("vllm:inter_token_latency_seconds"):
        lower = max(lower, (0, 10))
    if has("vllm:request_time_per_output_token_seconds"):
        lower = max(lower, (0, 11))
    if has("vllm:gpu_cache_usage_perc"):
        upper = (0, 11)
    if has("vllm:time_per_output_token_seconds") and not has("vllm:inter_token_latency_seconds"):
        upper = min(upper or (0, 10), (0, 10))
    if not has("vllm:kv_cache_usage_perc") and has("vllm:gpu_cache_usage_perc"):
        upper = min(upper or (0, 8), (0, 8))

    def v(x: tuple[int, int]) -> str:
        return f"{x[0]}.{x[1]}"

    if upper is None:
        return f"{v(lower)} or later"
    return f"{v(lower)} to {v(upper)}" if upper > lower else f"{v(upper)}"


def _inspect_summary(source: str, text: str, snap) -> str:  # type: ignore[no-untyped-def]
    """A reading of one scrape a person can check at a glance (--json has every series)."""
    models = sorted({k.model for k in (*snap.counters, *snap.gauges, *snap.histograms)})
    lines = [f"{source}: vLLM metric names of {naming_range(text)}; {snap.samples} samples used, "
             f"{len(models)} model(s)"]  # fmt: skip
    for model in models:
        finished = {dict(k.labels).get("finished_reason", "?"): v for k, v in snap.counters.items()
                    if k.model == model and k.metric == "request_success"}  # fmt: skip
        c = {k.metric: v for k, v in snap.counters.items() if k.model == model and not k.labels}
        g = {k.metric: v for k, v in snap.gauges.items() if k.model == model}
        lines.append(f"model {model}")
        mix = ", ".join(f"{r} {n:,.0f}" for r, n in sorted(finished.items()))
        lines.append(
            f"  requests finished {sum(finished.values()):,.0f} ({mix})" if finished else "  no finished requests"
        )
        lines.append(
            f"  tokens: {c.get('prompt_tokens', 0):,.0f} prompt, {c.get('generation_tokens', 0):,.0f} generated"
        )
        if "prefix_cache_queries" in c:
            unit = next(
                (u for k, u in snap.units.items() if k.model == model and k.metric == "prefix_cache_queries"), ""
            )
            hits, queried = c.get("prefix_cache_hits", 0), c["prefix_cache_queries"]
            lines.append(f"  prefix cache: {hits:,.0f} hits of {queried:,.0f} queried {unit}")
        if g:
            kv = g.get("kv_cache_usage")
            lines.append(
                f"  now: {g.get('requests_running', 0):.0f} running, {g.get('requests_waiting', 0):.0f} waiting"
                + (f", KV cache {kv:.0%} used" if kv is not None else "")
            )
        for k, h in sorted(snap.histograms.items()):
            if k.model == model:
                unit = "tokens" if k.metric.endswith("_length") else "s"
                mean = f", mean {h.sum / h.count:.3g} {unit}" if h.count else ""
                lines.append(f"  {k.metric}: {h.count:,.0f} observations{mean}, {len(h.bounds)} buckets")
    lines.append("(--json prints every series read)")
    return "\n".join(lines)


def cmd_example_target(args: argparse.Namespace) -> int:
    from collector.example_target import ExampleTarget

    target = ExampleTarget(port=args.port).start()
    print(f"example vLLM target at {target.url} (Ctrl-C stops)")
    sys.stdout.flush()
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        target.stop()
    return 0


def _scenario(name: str) -> Scenario | None:
    from collector.sim.scenario import ScenarioError, load_scenario

    try:
        return load_scenario(name)
    except ScenarioError as exc:
        print(f"{len(exc.problems)} problem(s) in the scenario:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return None


def cmd_simulate(args: argparse.Namespace) -> int:
    """Run a simulated vLLM fleet: real time on loopback ports, or --fast into a database."""
    scenario = _scenario(args.scenario)
    if scenario is None:
        return 2
    version = args.vllm_version or scenario.spec.vllm_version
    if args.fast:
        from collector.config import parse_duration
        from collector.sim.fastclock import run_into_store, store_spans
        from collector.store.repository import Store

        store = Store(args.database or "sqlite:///data/simulated.db")
        started = time.perf_counter()
        run = run_into_store(
            scenario, store, parse_duration(args.fast), parse_duration(args.scrape_interval), version=version
        )
        spans = store_spans(run, store, scenario.start_unix) if args.spans else 0
        print(
            f"simulated {args.fast} in {time.perf_counter() - started:.1f} s: {len(run.requests)} requests, "
            f"{sum(s.status.scrapes_total for s in run.scrapers.values())} scrapes"
            + (f", {spans} gateway spans" if args.spans else "")
            + f" into {store.url}"
        )
        store.close()
        return 0
    return asyncio.run(_simulate_realtime(scenario, version, args))


async def _simulate_realtime(scenario: Scenario, version: str, args: argparse.Namespace) -> int:
    from collector.sim.server import Simulation
    from collector.sim.spans import SpanEmitter

    otlp = args.otlp_endpoint or (scenario.spec.otlp.endpoint if scenario.spec.otlp else None)
    emitter = SpanEmitter(otlp) if otlp else None
    sim = Simulation(
        scenario,
        version,
        host=args.host,
        base_port=args.port_base,
        builtin_workload=not args.no_workload,
        emitter=emitter,
    )
    await sim.start()
    print(f"simulating {scenario.source} (vLLM naming {version}); Ctrl-C stops")
    for name in sim.replicas:
        print(f"  {name:12} {sim.url(name, '/metrics')}   {sim.url(name, '/v1')}")
    if otlp:
        print(f"  gateway spans -> {otlp}")
    sys.stdout.flush()
    try:
        if args.duration:
            await asyncio.sleep(args.duration)
        else:
            await asyncio.Event().wait()
    finally:
        await sim.stop()
        if emitter is not None:
            emitter.shutdown()
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from collector.demo import run_demo

    scenario = _scenario(args.scenario)
    if scenario is None:
        return 2
    with contextlib.suppress(KeyboardInterrupt, asyncio.CancelledError):  # Ctrl-C, or SIGTERM (see run_demo)
        asyncio.run(
            run_demo(
                scenario,
                host=args.host,
                port=args.port,
                data_dir=args.data_dir,
                duration=args.duration,
                live=not args.no_live and sys.stdout.isatty(),
                window_scale=args.window_scale,
                alertmanager=not args.no_alertmanager,
            )
        )
    print("demo stopped")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llmslo", description=__doc__)
    parser.add_argument("--version", action="version", version=f"llmslo {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def with_config(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--config", help="YAML settings file (default: $LLMSLO_CONFIG, else built-in defaults)")
        return p

    p = with_config(sub.add_parser("serve", help="run the collector and its HTTP API"))
    p.add_argument("--host", help="listen address (default from config: 127.0.0.1)")
    p.add_argument("--port", type=int, help="listen port (default from config: 9464)")
    p.add_argument("--example", action="store_true", help="also start and scrape a bundled example vLLM target")
    p.add_argument("--rules", help="SLO rules file or directory to evaluate (default from config: none)")
    p.set_defaults(func=cmd_serve)

    p = with_config(sub.add_parser("check-config", help="validate the configuration and print every problem"))
    p.add_argument(
        "--rules", help="SLO rules to check the targets' business types against (default: the config's `rules`)"
    )
    p.set_defaults(func=cmd_check_config)

    p = with_config(
        sub.add_parser(
            "db",
            help="database: `upgrade` applies migrations, `current` shows the revision, `recount-slos` "
            "forgets the saved SLO counts",
        )
    )
    p.add_argument(
        "action",
        choices=["upgrade", "current", "recount-slos"],
        help="upgrade: apply migrations; current: show the revision; recount-slos: forget the SLO ledger's "
        "saved counts, so that the next start counts the SLO period from the stored rollups (collectors stopped)",
    )
    p.add_argument("--force", action="store_true", help="recount-slos: even if a collector saved counts just now")
    p.set_defaults(func=cmd_db)

    for name, func, default, what in (
        ("cost", cmd_cost, "1d", "cost per deployment and group from the stored rollups"),
        ("capacity", cmd_capacity, "4w", "memory fit, throughput at SLO, replicas needed, saturation forecast"),
    ):
        p = with_config(sub.add_parser(name, help=what))
        p.add_argument("--window", default=default, help=f"the last this long (default {default})")
        p.add_argument("--start", help="ISO 8601 time or unix seconds (with --end, instead of --window)")
        p.add_argument("--end", help="ISO 8601 time or unix seconds, exclusive")
        if name == "cost":
            p.add_argument(
                "--group-by",
                default="business_type",
                choices=["deployment", "business_type", "model", "target", "tenant"],
                help="the groups of the second table (default business_type)",
            )
        p.add_argument("--json", action="store_true", help="the API's JSON instead of tables")
        p.set_defaults(func=func)

    p = with_config(
        sub.add_parser(
            "report",
            help="the weekly capacity and cost report (HTML with charts, Markdown or JSON)",
            epilog="examples: llmslo report --week last --out report.html; llmslo report --week 2026-W48 "
            "--format md; llmslo report --start 2026-11-01 --end 2026-12-01 --format json",
        )
    )
    p.add_argument("--week", default="last", help="last (default), this, or an ISO week such as 2026-W48")
    p.add_argument("--start", help="instead of --week: a date, RFC 3339 time or unix seconds")
    p.add_argument("--end", help="with --start, exclusive")
    p.add_argument("--timezone", help="weeks and days start at midnight here (default: report.timezone)")
    p.add_argument(
        "--format", choices=["html", "md", "json"], default="html", help="html (default, charts inline), md or json"
    )
    p.add_argument("--out", help="write to this file (default: stdout)")
    p.add_argument("--store", action="store_true", help="keep it in the database (served at /reports/<id>)")
    p.add_argument("--deliver", action="store_true", help="store it and send it by the configured webhook/SMTP")
    p.set_defaults(func=cmd_report)

    p = with_config(
        sub.add_parser(
            "drift",
            help="workload drift per business type and signal, from the database; `drift pin` stores a baseline",
            epilog="examples: llmslo drift --config llmslo.yaml; llmslo drift pin --name before-v2 --start "
            "2026-11-23T00:00 --end 2026-11-30T00:00",
        )
    )
    p.add_argument("action", nargs="?", choices=["show", "pin"], default="show", help="show (default) or pin")
    p.add_argument("--name", default="default", help="pin: the baseline's name (drift.baseline)")
    p.add_argument("--start", help="pin: ISO 8601 time or unix seconds (default: the trailing reference_length)")
    p.add_argument("--end", help="pin: ISO 8601 time or unix seconds, exclusive")
    p.add_argument("--at", help="judge the window ending at this ISO 8601 time (default: now)")
    p.add_argument("--json", action="store_true", help="the API's JSON instead of a table")
    p.add_argument("--fail-on-drift", action="store_true", help="exit 1 when any signal drifted (for scripts)")
    p.set_defaults(func=cmd_drift)

    p = with_config(
        sub.add_parser(
            "compare",
            help="canary gate: candidate vs baseline (exit 0 promote, 1 rollback, 3 hold)",
            epilog="example: llmslo compare --baseline model=llama-3.1-8b --candidate model=llama-3.1-8b-v2",
        )
    )
    p.add_argument(
        "--baseline",
        required=True,
        help="target=A,B | model=NAME | deployment=NAME | track=NAME (the spans' track, the targets' "
        "track label) | label.KEY=VALUE; from spans also tenant=T | business_type=B | shadow=true",
    )
    p.add_argument(
        "--source",
        choices=["auto", "engines", "spans"],
        default="auto",
        help="engines (vLLM's histograms), spans (gateway spans: exact to 1 %%, tenants, tracks, shadow traffic) or "
        "auto (spans when both sides have some)",
    )
    p.add_argument("--candidate", required=True, help="the same forms as --baseline")
    p.add_argument("--window", default="30m", help="the last this long (default 30m)")
    p.add_argument("--tolerance-p95", help="p95 may be this much slower: 10%% or 0.1 (default: compare: in the config)")
    p.add_argument("--tolerance-p50", help="p50 latency likewise")
    p.add_argument("--tolerance-errors", help="error ratio may rise by this much: 0.5%% or 0.005")
    p.add_argument("--min-requests", type=int, help="requests each side needs before any verdict but hold")
    p.add_argument("--at", help="the window ends at this ISO 8601 time (default: now)")
    p.add_argument("--json", action="store_true", help="the API's JSON report")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("check", help="validate SLO rules and print every problem")
    p.add_argument("rules", nargs="?", default="rules", help="rules file or directory (default: rules)")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("generate", help="compile rules/ into alerts/ (Prometheus rules, Alertmanager, tests)")
    p.add_argument("--rules", default="rules", help="SLO rules file or directory (default: rules)")
    p.add_argument("--out", default="alerts", help="where the rule, Alertmanager and test files go (default: alerts)")
    p.add_argument(
        "--dashboards-out", default="dashboards", help="where the Grafana dashboard goes (default: dashboards)"
    )
    p.add_argument("--check", action="store_true", help="only check that alerts/ is up to date (CI)")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("inspect", help="show what llmslo reads from a /metrics URL or file")
    p.add_argument("source", help="a /metrics URL or a file holding a scrape body")
    p.add_argument("--json", action="store_true", help="every series read, as JSON")
    p.add_argument(
        "--content-type", default=None, help="the body's Content-Type (default: from the URL, else text 0.0.4)"
    )
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("simulate", help="run a simulated vLLM fleet (real time, or --fast into a database)")
    p.add_argument("--scenario", default="healthy", help="scenario file, or builtin: demo, healthy, incidents")
    p.add_argument("--vllm-version", choices=["current", "0.10", "0.6"], help="metric naming family to emit")
    p.add_argument("--host", default="127.0.0.1", help="listen address of the replicas (default 127.0.0.1)")
    p.add_argument("--port-base", type=int, default=0, help="replica i listens on base+i (default: free ports)")
    p.add_argument("--no-workload", action="store_true", help="only serve what API clients send")
    p.add_argument("--otlp-endpoint", help="send one gateway span per request here (OTLP/HTTP)")
    p.add_argument("--duration", type=float, help="stop after this many seconds")
    p.add_argument("--fast", help="simulate this long (e.g. 6h) on a virtual clock into --database")
    p.add_argument("--database", help="database URL for --fast (default sqlite:///data/simulated.db)")
    p.add_argument("--scrape-interval", default="15s", help="how often --fast scrapes each replica (default 15s)")
    p.add_argument("--spans", action="store_true", help="--fast: also store one gateway span per request")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("demo", help="simulator + collector + live view: healthy, an incident, recovery")
    p.add_argument("--scenario", default="demo", help="scenario file, or builtin: demo, healthy, incidents")
    p.add_argument("--host", default="127.0.0.1", help="listen address of the collector (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=9464, help="the collector's port (default 9464)")
    p.add_argument("--data-dir", default="./data", help="where the demo's SQLite database goes (default ./data)")
    p.add_argument("--duration", type=float, help="stop after this many seconds")
    p.add_argument(
        "--no-live", action="store_true", help="a plain line per event instead of the view (also when not a terminal)"
    )
    p.add_argument(
        "--window-scale",
        type=float,
        default=1 / 60,
        help="SLO windows this much of their length (default 1/60: the 1h burn window lasts a minute; 1 = real)",
    )
    p.add_argument(
        "--no-alertmanager", action="store_true", help="do not start Debian's Alertmanager even if installed"
    )
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("example-target", help="serve the bundled example vLLM /metrics")
    p.add_argument("--port", type=int, default=8000, help="listen port (default 8000)")
    p.set_defaults(func=cmd_example_target)
    for name, command in _subcommands(parser).items():
        if not command.epilog:
            command.epilog = "example: " + EXAMPLES[name]
    return parser


EXAMPLES = {
    "serve": "llmslo serve --config llmslo.yaml   (or: llmslo serve --example, a bundled vLLM replay)",
    "check-config": "llmslo check-config --config llmslo.yaml --rules rules/",
    "db": "llmslo db upgrade --config llmslo.yaml",
    "cost": "llmslo cost --config llmslo.yaml --window 7d --group-by tenant",
    "capacity": "llmslo capacity --config llmslo.yaml --window 4w",
    "check": "llmslo check rules/",
    "generate": "llmslo generate --rules rules/ --out alerts/ --dashboards-out dashboards/ [--check]",
    "inspect": "llmslo inspect http://127.0.0.1:8000/metrics   (or a saved file; --json for every series)",
    "simulate": "llmslo simulate --scenario incidents --port-base 8000   (or --fast 7d --spans --database URL)",
    "demo": "llmslo demo",
    "example-target": "llmslo example-target --port 8000",
}


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # one line per job run or request drowns the useful lines (matplotlib: one per report chart)
    for noisy in ("apscheduler", "httpx", "matplotlib"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    gcpolicy.offline()  # `serve` sets its own (gcpolicy.serving)
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())

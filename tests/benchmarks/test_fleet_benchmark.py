"""Fleet benchmark: `llmslo serve` scraping N loopback vLLM targets at 15 s, end to end (HTTP,
gzip, parse, deltas, group commit, derived views, SLO evaluation, its own /metrics), side by
side with a real Prometheus scraping the same targets in the same run. CPU is read from /proc for
both processes; the targets run in a third process.

Run (outside the default suite):
  LLMSLO_FLEET_TARGETS=300,1000 LLMSLO_FLEET_DBS=sqlite,postgresql LLMSLO_FLEET_SECONDS=180 \
    .venv/bin/python -m pytest tests/benchmarks/test_fleet_benchmark.py -s

LLMSLO_FLEET_PROM_RULES=1 gives Prometheus the generated rules (alerts/*.rules.yml: recording,
burn-rate and drift rules, the same SLOs llmslo evaluates) and each target its business_type
label, as a fleet that runs the SLOs in Prometheus would: the baseline of llmslo's whole job
rather than of scraping alone.

Each case measures two phases after the warm-up: LLMSLO_FLEET_QUIET_SECONDS (90) with no reader of
llmslo (the collector's own work: scraping, derive passes, SLO evaluation, drift), then
LLMSLO_FLEET_SECONDS with /metrics fetched every 13 s and the fleet view every 26 s
(LLMSLO_FLEET_VIEW_EVERY sets another period: a slow dashboard; their cost is in llmslo's CPU),
and Prometheus asked the same fleet view in PromQL at the same times (per target and model: the
histograms' quantiles, counts and means, the counters' increases and the gauges over the window;
LLMSLO_FLEET_PROM_READERS=0 leaves it without a reader). Each phase prints its own ratio;
LLMSLO_FLEET_SEGMENT_SECONDS=S also prints the quiet phase's ratio, RSS and job timings every S
seconds as it runs (for a phase long enough to fill the 1h window: 4200 s and more; each such line
reads llmslo's /metrics once, for the job timings).

LLMSLO_FLEET_SHARDS=K (PostgreSQL) runs K sharded collectors (README, "Sharded collectors"), each
scraping its shard of the targets and all evaluating the fleet's SLOs: CPU, RSS and scrapes are
their sums; /metrics and the fleet view are timed on the first collector (its shard).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest
import yaml

from collector.analytics.serving import LATENCY_METRICS, LENGTH_METRICS
from collector.sources.vllm import LOGICAL_BY_NAME

pytestmark = pytest.mark.benchmark

ROOT = Path(__file__).resolve().parents[2]
INTERVAL = 15.0
TICK = os.sysconf("SC_CLK_TCK")
TYPES = ("chat", "customer_service", "code_completion", "batch")


_local = threading.local()


def http() -> httpx.Client:
    """This thread's client, kept: `httpx.get` builds a client (and loads the CA bundle) on
    every call, 60-180 ms on these machines, which the reads timed here must not include."""
    client = getattr(_local, "client", None)
    if client is None:
        client = _local.client = httpx.Client(trust_env=False)
    return client


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@contextmanager
def process(
    cmd: list[str], cwd: Path, log: Path | None = None, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env={**os.environ, **(env or {})})
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log:
            out.close()  # type: ignore[union-attr]


@contextmanager
def loopback_fleet(port: int) -> Iterator[None]:
    """The loopback vLLM fleet (tests/benchmarks/fleet_server.py) on `port`, once it answers."""
    with process([sys.executable, "-m", "tests.benchmarks.fleet_server", "--port", str(port)], ROOT):
        wait_http(f"http://127.0.0.1:{port}/t/0/metrics", 30)
        yield


def wait_http(url: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if http().get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} did not answer within {timeout:.0f} s")


def llmslo_scrapes(base: str) -> tuple[float, float]:
    """(successful scrapes, failed scrapes) over all targets, from llmslo's API."""
    targets = http().get(f"{base}/api/v1/targets", timeout=60).json()["targets"]
    total = sum(t["scrapes_total"] for t in targets)
    failed = sum(sum(t["errors_total"].values()) for t in targets)
    return total - failed, failed


def skipped_slots(base: str) -> float:
    """Scrape slots llmslo skipped since it started (a target's scrape overran its interval, or
    the process could not keep up), from its /metrics: unlike a count of scrapes in a phase, which
    moves with where the phase's ends fall in the targets' 15 s, a slot skipped is a scrape missed."""
    for line in http().get(f"{base}/metrics", timeout=60).text.splitlines():
        if line.startswith("llmslo_scrape_slots_skipped_total "):
            return float(line.split()[1])
    raise AssertionError("llmslo_scrape_slots_skipped_total is not on llmslo's /metrics")


def prometheus_scrapes(base: str) -> float:
    """Scrapes Prometheus ran, from its own /metrics (it does not scrape itself here)."""
    total = 0.0
    for line in http().get(f"{base}/metrics", timeout=30).text.splitlines():
        if line.startswith("prometheus_target_interval_length_seconds_count"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def prometheus_rules(base: str) -> dict[str, float]:
    """That the generated rules ran on data: evaluations, failures, series they recorded."""
    out = {"evaluations": 0.0, "failures": 0.0}
    for line in http().get(f"{base}/metrics", timeout=30).text.splitlines():
        if line.startswith("prometheus_rule_evaluations_total"):
            out["evaluations"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("prometheus_rule_evaluation_failures_total"):
            out["failures"] += float(line.rsplit(" ", 1)[1])
    answer = http().get(f"{base}/api/v1/query", params={"query": 'count({__name__=~"llmslo:.+"})'}, timeout=30)
    result = answer.json()["data"]["result"]
    out["recorded series"] = float(result[0]["value"][1]) if result else 0.0
    return out


def cluster_leader(base: str) -> float:
    for line in http().get(f"{base}/metrics", timeout=60).text.splitlines():
        if line.startswith("llmslo_cluster_leader "):
            return float(line.split()[1])
    return float("nan")


def job_timings(base: str) -> dict[str, tuple[float, float]]:
    """Each periodic job's mean and last duration, from llmslo's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    total: dict[str, float] = {}
    runs: dict[str, float] = {}
    last: dict[str, float] = {}
    for fam in text_string_to_metric_families(http().get(f"{base}/metrics", timeout=60).text):
        for sample in fam.samples:
            job = sample.labels.get("periodic_job")
            if sample.name == "llmslo_job_duration_seconds_total":
                total[job] = sample.value
            elif sample.name == "llmslo_job_runs_total":
                runs[job] = sample.value
            elif sample.name == "llmslo_job_last_duration_seconds":
                last[job] = sample.value
            elif sample.name == "llmslo_job_last_run_timestamp_seconds" and job == "derive":
                print(f"  (the last derive pass finished {time.time() - sample.value:.1f} s before this read)")
    return {job: (total[job] / runs[job], last.get(job, 0.0)) for job in total if runs.get(job)}


def writes_per_transaction(base: str) -> float:
    """The scrapes' writes per group commit so far, from llmslo's /metrics."""
    found: dict[str, float] = {}
    for line in http().get(f"{base}/metrics", timeout=60).text.splitlines():
        if line.startswith(("llmslo_store_writes_total ", "llmslo_store_transactions_total ")):
            name, value = line.split()
            found[name] = float(value)
    return found.get("llmslo_store_writes_total", 0.0) / max(found.get("llmslo_store_transactions_total", 0.0), 1.0)


# The fleet view (`/api/v1/serving?window=5m`: per target and model, the quantiles, count and mean
# of each histogram it derives, its counters over the window and its gauges' last, min, max and
# mean) asked of Prometheus, as a Grafana dashboard showing the same figures would ask it.
# The newest vLLM names (the fleet server's) of the series the view derives its figures from.
FLEET_VIEW_HISTOGRAMS = tuple(LOGICAL_BY_NAME[m].aliases[0] for m in (*LATENCY_METRICS, *LENGTH_METRICS))
FLEET_VIEW_COUNTERS = tuple(
    LOGICAL_BY_NAME[m].aliases[0]
    for m in ("prompt_tokens", "generation_tokens", "preemptions", "prefix_cache_hits", "prefix_cache_queries")
)
FLEET_VIEW_GAUGES = tuple(
    LOGICAL_BY_NAME[m].aliases[0] for m in ("kv_cache_usage", "requests_running", "requests_waiting")
)
REQUESTS = LOGICAL_BY_NAME["request_success"].aliases[0]


DASHBOARD = ThreadPoolExecutor(4)  # a dashboard's panels load in parallel


def prometheus_fleet_view_queries() -> list[str]:
    by = "sum by (instance, model_name"
    out: list[str] = []
    for h in FLEET_VIEW_HISTOGRAMS:
        out += [f"histogram_quantile({q}, {by}, le) (increase({h}_bucket[5m])))" for q in (0.5, 0.9, 0.95, 0.99)]
        out += [f"{by}) (increase({h}_count[5m]))", f"{by}) (increase({h}_sum[5m]))"]
    out.append(f"{by}, finished_reason) (increase({REQUESTS}[5m]))")
    out += [f"{by}) (increase({c}[5m]))" for c in FLEET_VIEW_COUNTERS]
    for g in FLEET_VIEW_GAUGES:
        out += [f"{by}) ({g})"] + [f"{by}) ({f}_over_time({g}[5m]))" for f in ("min", "max", "avg")]
    return out


def prometheus_fleet_view(base: str, queries: list[str], n: int) -> float:
    """Every query of the fleet view, four at a time (a dashboard's panels load in parallel);
    the wall time in ms. Each must answer a series per target: a query that matched nothing
    would cost Prometheus nothing and make the comparison a lie."""

    def one(query: str) -> int:
        answer = http().get(f"{base}/api/v1/query", params={"query": query}, timeout=120)
        answer.raise_for_status()
        return len({r["metric"].get("instance") for r in answer.json()["data"]["result"]})

    list(DASHBOARD.map(lambda _: http(), range(8)))  # each thread's client made before the clock starts
    t0 = time.perf_counter()
    found = list(DASHBOARD.map(one, queries))
    ms = (time.perf_counter() - t0) * 1000
    short = [(q, k) for q, k in zip(queries, found, strict=True) if k < 0.99 * n]
    assert not short, f"Prometheus' fleet view answered fewer targets than scraped: {short[:3]}"
    return ms


def timed_get(url: str, runs: int = 3) -> tuple[float, int]:
    times, size = [], 0
    for _ in range(runs):
        t0 = time.perf_counter()
        r = http().get(url, timeout=120)
        times.append(time.perf_counter() - t0)
        r.raise_for_status()
        size = len(r.content)
    if runs > 1:
        print(f"  GET {url.split('/', 3)[-1]}: " + ", ".join(f"{t * 1000:.0f}" for t in times) + " ms")
    return statistics.median(times) * 1000, size


def database_url(kind: str, tmp: Path, n: int) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp / 'llmslo.db'}"
    import psycopg

    name = f"llmslo_fleet_{n}"
    with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"


def cases() -> list[tuple[int, str]]:
    targets = [int(x) for x in os.environ.get("LLMSLO_FLEET_TARGETS", "300,1000").split(",")]
    dbs = os.environ.get("LLMSLO_FLEET_DBS", "sqlite").split(",")
    return [(n, db) for n in targets for db in dbs]


@pytest.mark.parametrize(("n", "db"), cases())
def test_fleet_against_prometheus(n: int, db: str, tmp_path: Path) -> None:
    seconds = float(os.environ.get("LLMSLO_FLEET_SECONDS", "180"))
    warmup = float(os.environ.get("LLMSLO_FLEET_WARMUP", "60"))
    quiet = float(os.environ.get("LLMSLO_FLEET_QUIET_SECONDS", "90"))
    prometheus = shutil.which("prometheus")
    if prometheus is None and os.environ.get("CI") == "true":
        pytest.fail("prometheus is not installed (apt-get install prometheus)")
    port = free_port()
    with loopback_fleet(port):
        urls = [f"http://127.0.0.1:{port}/t/{i}/metrics" for i in range(n)]
        shards = int(os.environ.get("LLMSLO_FLEET_SHARDS", "1"))
        if shards > 1 and db != "postgresql":
            pytest.skip("sharded collectors share a PostgreSQL database")
        api_ports = [free_port() for _ in range(shards)]
        api_port = api_ports[0]
        config: dict[str, object] = {
            "data_dir": str(tmp_path),
            "database_url": database_url(db, tmp_path, n),
            "server": {
                "host": "127.0.0.1",
                "port": api_port,
                # LLMSLO_FLEET_SWITCH: the interpreter's switch interval while serving (server.switch_interval)
                **(
                    {"switch_interval": os.environ["LLMSLO_FLEET_SWITCH"]}
                    if "LLMSLO_FLEET_SWITCH" in os.environ
                    else {}
                ),
            },
            "rules": str(ROOT / "rules"),
            "targets": [
                {"name": f"t{i}", "url": u, "business_type": TYPES[i % len(TYPES)]} for i, u in enumerate(urls)
            ],
        }
        if shards > 1:
            config["cluster"] = {"shards": shards}
        if "LLMSLO_FLEET_COMMIT_LINGER" in os.environ:  # scrape.commit_linger (0 = a transaction per write)
            config["scrape"] = {"commit_linger": os.environ["LLMSLO_FLEET_COMMIT_LINGER"]}
        (tmp_path / "llmslo.yaml").write_text(yaml.safe_dump(config))
        with_rules = os.environ.get("LLMSLO_FLEET_PROM_RULES") == "1"
        prom_cfg: dict[str, object] = {
            "global": {"scrape_interval": "15s", "scrape_timeout": "10s"},
            "scrape_configs": [
                {
                    "job_name": "vllm",
                    "static_configs": [
                        {
                            "targets": [f"127.0.0.1:{port}"],
                            "labels": {
                                "__metrics_path__": f"/t/{i}/metrics",
                                "instance": f"t{i}",
                                **({"business_type": TYPES[i % len(TYPES)]} if with_rules else {}),
                            },
                        }
                        for i in range(n)
                    ],
                }
            ],
        }
        if with_rules:
            prom_cfg["rule_files"] = [str(p) for p in sorted((ROOT / "alerts").glob("*.rules.yml"))]
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(prom_cfg))
        prom_port = free_port()
        base = f"http://127.0.0.1:{api_port}"
        prom_base = f"http://127.0.0.1:{prom_port}"
        llmslo_cmd = [str(Path(sys.executable).parent / "llmslo"), "serve", "--config", str(tmp_path / "llmslo.yaml")]
        prom_cmd = [
            prometheus or "true",
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'prom'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ]
        with ExitStack() as stack:
            collectors = [
                stack.enter_context(
                    process(
                        llmslo_cmd,
                        tmp_path,
                        tmp_path / f"llmslo-{k}.log",
                        {
                            "LLMSLO_SERVER__PORT": str(api_ports[k]),
                            **(
                                {"LLMSLO_CLUSTER__NAME": f"collector-{k}", "LLMSLO_CLUSTER__SHARD": str(k)}
                                if shards > 1
                                else {}
                            ),
                        },
                    )
                )
                for k in range(shards)
            ]
            prom = stack.enter_context(process(prom_cmd, tmp_path, tmp_path / "prometheus.log"))
            bases = [f"http://127.0.0.1:{p}" for p in api_ports]
            for b in bases:
                wait_http(f"{b}/readyz")
            if prometheus:
                wait_http(f"{prom_base}/-/ready")
            time.sleep(warmup)

            def ours_cpu() -> float:
                each.append([cpu_seconds(c.pid) for c in collectors])
                return sum(each[-1])

            each: list[list[float]] = []  # per collector, at the start and the end

            def ours_rss() -> float:
                return sum(rss_mib(c.pid) for c in collectors)

            def ours_scrapes() -> tuple[float, float]:
                counts = [llmslo_scrapes(b) for b in bases]
                return sum(c[0] for c in counts), sum(c[1] for c in counts)

            rss: list[float] = [ours_rss()]
            # first the collector alone: nobody reads llmslo (Prometheus serves no reader either),
            # so its CPU is the scraping and the derived views, evaluation and drift every pass
            q_skipped = sum(skipped_slots(b) for b in bases)  # before the CPU readings: it reads /metrics
            q_ours, q_prom, (q_ok, q_failed) = ours_cpu(), cpu_seconds(prom.pid) if prometheus else 0.0, ours_scrapes()
            q_ps, q_t0 = prometheus_scrapes(prom_base) if prometheus else 0.0, time.monotonic()
            # LLMSLO_FLEET_SEGMENT_SECONDS: in a long quiet phase (past the 1h window's first hour),
            # each segment's own CPU per scrape and RSS, printed as it ends, to show the trend
            segment = float(os.environ.get("LLMSLO_FLEET_SEGMENT_SECONDS", "0"))
            seg = (time.monotonic(), q_ours, q_prom, q_ok, q_ps)
            while time.monotonic() - q_t0 < quiet:
                time.sleep(min(13.0, quiet - (time.monotonic() - q_t0)))
                rss.append(ours_rss())
                if segment and time.monotonic() - seg[0] >= segment:
                    now_cpu, now_ok = ours_cpu(), ours_scrapes()[0]
                    now_prom = cpu_seconds(prom.pid) if prometheus else 0.0
                    now_ps = prometheus_scrapes(prom_base) if prometheus else 0.0
                    ours_seg = (now_cpu - seg[1]) / max(now_ok - seg[3], 1) * 1000
                    prom_seg = (now_prom - seg[2]) / max(now_ps - seg[4], 1) * 1000 if prometheus else float("nan")
                    at, span = time.monotonic() - q_t0, time.monotonic() - seg[0]
                    timings = sorted(job_timings(base).items())
                    print(
                        f"\n  quiet phase at {at:.0f} s: the last {span:.0f} s llmslo {ours_seg:.2f} ms per scrape "
                        f"({now_ok - seg[3]:.0f} scrapes), prometheus {prom_seg:.2f} ms, ratio "
                        f"{ours_seg / prom_seg:.2f}x; RSS {rss[-1]:.0f} MiB; jobs (mean, last): "
                        + ", ".join(f"{j} {m * 1000:.0f}/{la * 1000:.0f} ms" for j, (m, la) in timings),
                        flush=True,
                    )
                    seg = (time.monotonic(), now_cpu, now_prom, now_ok, now_ps)
            quiet_elapsed = time.monotonic() - q_t0
            quiet_done = ours_scrapes()[0] - q_ok
            quiet_ms = (ours_cpu() - q_ours) / max(quiet_done, 1) * 1000
            quiet_prom_ms = float("nan")
            if prometheus:
                quiet_prom_ms = (cpu_seconds(prom.pid) - q_prom) / max(prometheus_scrapes(prom_base) - q_ps, 1) * 1000
            each.clear()
            # then with readers: the same, plus /metrics and the fleet view fetched as below
            c0, p0 = ours_cpu(), cpu_seconds(prom.pid) if prometheus else 0.0
            ok0, _ = ours_scrapes()
            ps0 = prometheus_scrapes(prom_base) if prometheus else 0.0
            t0 = time.monotonic()
            # /metrics is fetched through the run about as often as a Prometheus scraping llmslo
            # would (its cost is in llmslo's CPU), every 13 s: not the derive interval (15 s), so
            # that the fetches fall at every moment of the derive cycle, not at one phase of it
            metrics_times: list[float] = []
            metrics_bytes = 0
            # and the fleet view, as a dashboard polling it would (every other /metrics fetch);
            # its first read is timed apart: it derives the groups and encodes them while it waits
            first_serving_ms, _ = timed_get(f"{base}/api/v1/serving?window=5m", runs=1)
            serving_times: list[float] = []
            serving_bytes = 0
            # Prometheus is asked the same fleet view at the same time (LLMSLO_FLEET_PROM_READERS=0:
            # it serves no reader, the comparison of sessions before 23)
            prom_readers = bool(prometheus) and os.environ.get("LLMSLO_FLEET_PROM_READERS", "1") != "0"
            prom_queries = prometheus_fleet_view_queries()
            prom_view_times: list[float] = []
            # LLMSLO_FLEET_VIEW_EVERY: the fleet view's period (26 s: every other /metrics fetch,
            # 3 s after it; a longer one, e.g. 300, is a slow dashboard, read on its own schedule)
            view_every = float(os.environ.get("LLMSLO_FLEET_VIEW_EVERY", "26"))
            next_view = t0 + view_every

            def read_view() -> None:
                nonlocal serving_bytes
                ms, serving_bytes = timed_get(f"{base}/api/v1/serving?window=5m", runs=1)
                serving_times.append(ms)
                if prom_readers:
                    prom_view_times.append(prometheus_fleet_view(prom_base, prom_queries, n))

            while time.monotonic() - t0 < seconds:
                time.sleep(max(0.0, min(13.0, seconds - (time.monotonic() - t0))))
                rss.append(ours_rss())
                ms, metrics_bytes = timed_get(f"{base}/metrics", runs=1)
                metrics_times.append(ms)
                if view_every == 26.0 and len(metrics_times) % 2 == 0:
                    time.sleep(3.0)
                    read_view()
                elif view_every != 26.0 and time.monotonic() + 13.0 > next_view:
                    time.sleep(max(0.0, next_view - time.monotonic()))
                    read_view()
                    next_view += view_every
            elapsed = time.monotonic() - t0
            ok1, failed = ours_scrapes()
            c1, p1 = ours_cpu(), cpu_seconds(prom.pid) if prometheus else 0.0
            ps1 = prometheus_scrapes(prom_base) if prometheus else 0.0
            skipped = sum(skipped_slots(b) for b in bases)  # after the CPU readings: it reads /metrics
            if with_rules and prometheus:
                rules_done = prometheus_rules(prom_base)
                print(f"\n  prometheus rules: {rules_done}")
                assert rules_done["failures"] == 0 and rules_done["recorded series"] > 0
            metrics_ms = statistics.median(metrics_times)
            jobs = job_timings(base)
            grouped = writes_per_transaction(base)
            if shards > 1:
                leaders = [cluster_leader(b) for b in bases]
                print(f"\n  {shards} collectors, elected (1) and not (0): {leaders}")
                for k, b in enumerate(bases):
                    cpu = (each[-1][k] - each[0][k]) / elapsed
                    jobs_k = ", ".join(f"{j} {m * 1000:.0f} ms" for j, (m, _) in job_timings(b).items())
                    print(f"  collector-{k}: {cpu:.0%} of a core; mean job runs: {jobs_k}")
                assert leaders.count(1.0) == 1
            assert all(c.poll() is None for c in collectors), "llmslo exited during the run"
    expected = n * elapsed / INTERVAL
    phase_slots = n * (quiet_elapsed + elapsed) / INTERVAL
    done = ok1 - ok0
    ours_ms = (c1 - c0) / max(done, 1) * 1000
    prom_done = ps1 - ps0
    prom_ms = (p1 - p0) / max(prom_done, 1) * 1000 if prometheus else float("nan")
    half = len(rss) // 2
    print(
        f"\nFLEET {n} targets, {db}, {shards} collector(s), {elapsed:.0f} s measured after {warmup:.0f} s warm-up"
        f" (switch interval {os.environ.get('LLMSLO_FLEET_SWITCH', 'default')};"
        f" Prometheus {'with the generated rules' if with_rules else 'scraping only'})\n"
        f"  no reader, {quiet_elapsed:.0f} s before: llmslo {quiet_done:.0f} scrapes, {quiet_ms:.2f} ms per scrape; "
        f"prometheus {quiet_prom_ms:.2f} ms per scrape; ratio {quiet_ms / quiet_prom_ms:.2f}x\n"
        f"  with readers (/metrics and the fleet view, below), {elapsed:.0f} s:\n"
        f"  llmslo:     {done:.0f}/{expected:.0f} scrapes ({done / expected:.1%}), "
        f"{failed:.0f} failed and {skipped:.0f} slots skipped in total; in the two phases "
        f"{failed - q_failed:.0f} failed and {skipped - q_skipped:.0f} skipped of {phase_slots:.0f} slots "
        f"({(failed - q_failed + skipped - q_skipped) / phase_slots:.2%} missed), "
        f"CPU {c1 - c0:.1f} s = {(c1 - c0) / elapsed:.0%} of a core, {ours_ms:.2f} ms per scrape\n"
        f"  prometheus: {prom_done:.0f}/{expected:.0f} scrapes, CPU {p1 - p0:.1f} s = {(p1 - p0) / elapsed:.0%} "
        f"of a core, {prom_ms:.2f} ms per scrape, "
        + (
            f"answering the same fleet view ({len(prom_queries)} PromQL queries, 4 at a time) at the same "
            f"times: median {statistics.median(prom_view_times):.0f} ms, max {max(prom_view_times):.0f} ms\n"
            if prom_view_times
            else "serving no reader\n"
        )
        + f"  ratio llmslo/prometheus CPU per scrape: {ours_ms / prom_ms:.2f}x\n"
        f"  llmslo RSS MiB: {' '.join(f'{x:.0f}' for x in rss)} "
        f"(mean first half {statistics.mean(rss[:half] or rss):.0f}, second half {statistics.mean(rss[half:]):.0f})\n"
        f"  GET /metrics every 13 s: median {metrics_ms:.0f} ms, "
        f"90th percentile {sorted(metrics_times)[int(0.9 * (len(metrics_times) - 1))]:.0f} ms, "
        f"max {max(metrics_times):.0f} ms "
        f"({len(metrics_times)} fetches, {metrics_bytes / 1e6:.1f} MB)"
        f"\n  GET /api/v1/serving?window=5m (gzip) every {view_every:.0f} s: "
        f"median {statistics.median(serving_times):.0f} ms, max {max(serving_times):.0f} ms "
        f"({len(serving_times)} fetches, {serving_bytes / 1e6:.1f} MB; each: "
        f"{', '.join(f'{x:.0f}' for x in serving_times)} ms), its first read {first_serving_ms:.0f} ms\n"
        f"  writes per transaction (group commit, scrape.commit_linger "
        f"{os.environ.get('LLMSLO_FLEET_COMMIT_LINGER', 'default')}): {grouped:.1f}\n"
        f"  periodic jobs, mean run (last): "
        + ", ".join(f"{job} {mean * 1000:.0f} ms ({last * 1000:.0f} ms)" for job, (mean, last) in sorted(jobs.items()))
    )
    assert done > 0

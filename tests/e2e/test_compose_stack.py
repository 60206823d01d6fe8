"""docker-compose.yml without Docker: the file is valid Compose (Debian's docker-compose parses
and validates it against the Compose specification), every mounted file exists, the ports and
URLs between services agree, and the same llmslo, Prometheus and Alertmanager configuration
files run natively (Debian's binaries, the simulator, `llmslo serve`) with only the service
host names and the mount paths mapped to loopback and the repository."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from collector.config import load_settings
from collector.sim.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]


def require(tool: str) -> str:
    found = shutil.which(tool)
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{tool} is not installed (scripts/test.sh installs it from Debian's packages as root)")
        pytest.skip(f"{tool} is not installed")
    return found


def mounts(service: str) -> dict[str, Path]:
    """Container path -> host path of a service's bind mounts."""
    out = {}
    for volume in SERVICES[service].get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            out[target] = (ROOT / source).resolve()
    return out


def host_path(service: str, container_path: str) -> Path:
    for target, source in sorted(mounts(service).items(), key=lambda kv: -len(kv[0])):
        if container_path == target or container_path.startswith(target.rstrip("/") + "/"):
            return source / container_path[len(target) :].lstrip("/")
    raise AssertionError(f"{service}: {container_path} is not inside any mount")


def container_ports(service: str) -> set[int]:
    return {int(str(p).split(":")[-1]) for p in SERVICES[service].get("ports", [])}


def test_compose_file_is_valid_compose() -> None:
    tool = require("docker-compose")
    for profile in ("sim", "gpu"):
        done = subprocess.run(
            [tool, "-f", str(ROOT / "docker-compose.yml"), "--profile", profile, "config", "-q"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr


def test_every_mount_exists_and_every_address_agrees() -> None:
    for name in SERVICES:
        for target, source in mounts(name).items():
            assert source.exists(), f"{name}: {source} (mounted at {target}) does not exist"
    # llmslo: its configs load (with the image's /app/rules mapped to the repository's rules/)
    for config in ("/etc/llmslo/llmslo.yaml", "/etc/llmslo/llmslo-gpu.yaml"):
        text = host_path("llmslo", config).read_text().replace("/app/rules", str(ROOT / "rules"))
        settings = load_settings_text(text)
        assert settings.server.port in container_ports("llmslo")
        if settings.traces.otlp_grpc_port is not None:
            assert settings.traces.otlp_grpc_port in container_ports("llmslo")
    sim_settings = load_settings_text(
        host_path("llmslo", "/etc/llmslo/llmslo.yaml").read_text().replace("/app/rules", str(ROOT / "rules"))
    )
    # the simulator serves replica i on port-base + i, in the scenario's replica order
    command = SERVICES["sim"]["command"]
    base = int(command[command.index("--port-base") + 1])
    scenario = load_scenario(re.sub(r"\$\{LLMSLO_SCENARIO:-(\w+)\}", r"\1", command[command.index("--scenario") + 1]))
    ports = {f"sim:{base + i}": name for i, name in enumerate(scenario.replica_names)}
    by_url = {t.url: t for t in sim_settings.targets}
    assert set(by_url) == {f"http://{hp}/metrics" for hp in ports}
    for hp, replica in ports.items():
        assert by_url[f"http://{hp}/metrics"].name == replica
    # Prometheus: the same engines with the same business types, llmslo and Alertmanager by service
    prom = yaml.safe_load(host_path("prometheus", "/etc/prometheus/prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    assert jobs["llmslo"]["static_configs"][0]["targets"] == [f"llmslo:{sim_settings.server.port}"]
    am = prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"][0]
    assert am.split(":")[0] in SERVICES and int(am.split(":")[1]) in container_ports("alertmanager")
    groups = yaml.safe_load(host_path("prometheus", "/etc/prometheus/targets/sim.yml").read_text())
    labelled = {t: g["labels"]["business_type"] for g in groups for t in g["targets"]}
    assert labelled == {hp: by_url[f"http://{hp}/metrics"].business_type for hp in ports}
    for pattern in prom["rule_files"]:
        assert list(host_path("prometheus", str(Path(pattern).parent)).glob(Path(pattern).name))
    # the simulator's spans and vLLM's go to llmslo's ports
    otlp = command[command.index("--otlp-endpoint") + 1]
    assert otlp == f"http://llmslo:{sim_settings.server.port}/v1/traces"
    vllm = SERVICES["vllm"]["command"]
    gpu = load_settings_text(
        host_path("llmslo", "/etc/llmslo/llmslo-gpu.yaml").read_text().replace("/app/rules", str(ROOT / "rules"))
    )
    assert vllm[vllm.index("--otlp-traces-endpoint") + 1] == f"grpc://llmslo:{gpu.traces.otlp_grpc_port}"
    assert gpu.targets[0].url == f"http://vllm:{min(container_ports('vllm'))}/metrics"
    assert gpu.targets[0].service_name == SERVICES["vllm"]["environment"]["OTEL_SERVICE_NAME"]
    # Grafana: the datasource is the prometheus service, the dashboards are the generated ones
    ds = yaml.safe_load(host_path("grafana", "/etc/grafana/provisioning/datasources/prometheus.yml").read_text())
    assert ds["datasources"][0]["url"] == f"http://prometheus:{min(container_ports('prometheus'))}"
    provider = yaml.safe_load(host_path("grafana", "/etc/grafana/provisioning/dashboards/llmslo.yml").read_text())
    dashboards = host_path("grafana", provider["providers"][0]["options"]["path"])
    assert dashboards == (ROOT / "dashboards").resolve() and list(dashboards.glob("*.json"))
    # llmslo waits for a healthy PostgreSQL
    assert SERVICES["llmslo"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "healthcheck" in SERVICES["postgres"]
    assert "HEALTHCHECK" in (ROOT / "Dockerfile").read_text() and "USER llmslo" in (ROOT / "Dockerfile").read_text()


def load_settings_text(text: str):  # type: ignore[no-untyped-def]
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
    try:
        return load_settings(f.name, environ={})
    finally:
        os.unlink(f.name)


def free_ports(n: int) -> int:
    """The first of n consecutive free loopback ports."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + n >= 65535:
            continue
        ok = True
        for p in range(base, base + n):
            with socket.socket() as s, contextlib.suppress(OSError):
                s.bind(("127.0.0.1", p))
                continue
            ok = False
            break
        if ok:
            return base
    raise RuntimeError("no run of free ports")


@contextlib.contextmanager
def running(cmd: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_the_compose_configuration_runs_natively(tmp_path: Path) -> None:
    prometheus = require("prometheus")
    alertmanager = shutil.which("prometheus-alertmanager") or require("alertmanager")
    replicas = len(load_scenario("healthy").replica_names)
    base = free_ports(replicas + 4)
    sim_base, llmslo_port, prom_port, am_port = base, base + replicas, base + replicas + 1, base + replicas + 2
    hosts = {
        "sim": lambda port: f"127.0.0.1:{sim_base + port - 8000}",
        "llmslo": lambda port: f"127.0.0.1:{llmslo_port}",
        "alertmanager": lambda port: f"127.0.0.1:{am_port}",
    }

    def loopback(text: str) -> str:
        return re.sub(r"\b(sim|llmslo|alertmanager):(\d+)", lambda m: hosts[m.group(1)](int(m.group(2))), text)

    # llmslo: the compose config, on loopback, SQLite instead of the postgres service
    cfg = yaml.safe_load(loopback(host_path("llmslo", "/etc/llmslo/llmslo.yaml").read_text()))
    cfg["rules"] = str(ROOT / "rules")
    cfg["server"] = {"host": "127.0.0.1", "port": llmslo_port}
    cfg["traces"]["otlp_grpc_port"] = None
    cfg["data_dir"] = str(tmp_path / "data")
    (tmp_path / "llmslo.yaml").write_text(yaml.safe_dump(cfg))
    # Prometheus: the compose file with its mounts resolved to the repository and hosts to loopback
    prom_text = host_path("prometheus", "/etc/prometheus/prometheus.yml").read_text()
    prom = yaml.safe_load(loopback(prom_text))
    prom["rule_files"] = [str(host_path("prometheus", p)) for p in prom["rule_files"]]
    targets_dir = tmp_path / "targets"
    targets_dir.mkdir()
    for f in host_path("prometheus", "/etc/prometheus/targets").glob("*.yml"):
        (targets_dir / f.name).write_text(loopback(f.read_text()))
    for sd in prom["scrape_configs"][1]["file_sd_configs"]:
        sd["files"] = [str(targets_dir / Path(p).name) for p in sd["files"]]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(prom))
    promtool = require("promtool")
    check = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr
    llmslo = str(Path(sys.executable).parent / "llmslo")
    sim_cmd = [llmslo, "simulate", "--scenario", "healthy", "--host", "127.0.0.1", "--port-base", str(sim_base),
               "--otlp-endpoint", f"http://127.0.0.1:{llmslo_port}/v1/traces"]  # fmt: skip
    with (
        running([llmslo, "serve", "--config", str(tmp_path / "llmslo.yaml")], tmp_path / "llmslo.log"),
        running(sim_cmd, tmp_path / "sim.log"),
        running(
            [
                alertmanager,
                f"--config.file={host_path('alertmanager', '/etc/alertmanager/alertmanager.yml')}",
                f"--storage.path={tmp_path / 'am'}",
                f"--web.listen-address=127.0.0.1:{am_port}",
                "--cluster.listen-address=",
            ],
            tmp_path / "am.log",
        ),  # fmt: skip
        running(
            [
                prometheus,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            tmp_path / "prom.log",
        ),  # fmt: skip
    ):
        api = f"http://127.0.0.1:{prom_port}/api/v1"
        deadline = time.monotonic() + 90
        up: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):  # not ready yet
                up = httpx.get(f"{api}/query", params={"query": "up"}, timeout=5).json()["data"]["result"]
                if len(up) == replicas + 1 and all(r["value"][1] == "1" for r in up):
                    break
            time.sleep(1)
        assert len(up) == replicas + 1 and all(r["value"][1] == "1" for r in up), (
            up,
            (tmp_path / "prom.log").read_text()[-2000:],
        )
        # every engine carries its business type, as the generated rules select it
        series = httpx.get(
            f"{api}/query", params={"query": "count by (business_type) (vllm:num_requests_running)"}
        ).json()
        assert {r["metric"]["business_type"] for r in series["data"]["result"]} == {
            "chat", "customer_service", "code_completion", "batch"
        }  # fmt: skip
        # every generated rule file loaded, and Prometheus found the Alertmanager
        groups = httpx.get(f"{api}/rules").json()["data"]["groups"]
        files = {Path(g["file"]).name for g in groups}
        assert files == {p.name for p in (ROOT / "alerts").glob("*.rules.yml")}
        broken = [(r["name"], r.get("lastError")) for g in groups for r in g["rules"] if r.get("health") == "err"]
        assert not broken
        managers = httpx.get(f"{api}/alertmanagers").json()["data"]["activeAlertmanagers"]
        assert [m["url"] for m in managers] == [f"http://127.0.0.1:{am_port}/api/v2/alerts"]
        assert httpx.get(f"http://127.0.0.1:{am_port}/-/ready").status_code == 200
        built = httpx.get(f"{api}/query", params={"query": "llmslo_build_info"}).json()["data"]["result"]
        assert built and built[0]["metric"]["job"] == "llmslo"
        # llmslo's own labels arrive as llmslo wrote them: none renamed exported_* by Prometheus
        renamed = httpx.get(
            f"{api}/query",
            params={"query": '{job="llmslo", exported_job=~".+"} or {job="llmslo", exported_instance=~".+"}'},
        ).json()["data"]["result"]
        assert renamed == []
        # the collector's own health alert reads two of llmslo's counters as Prometheus stores them
        rule = next(r for g in groups for r in g["rules"] if r.get("name") == "LLMSLOCollectorSkippingScrapes")
        for name in ("llmslo_scrape_slots_skipped_total", "llmslo_scrapes_total"):
            assert name in rule["query"]
            found = httpx.get(f"{api}/query", params={"query": f'{name}{{job="llmslo"}}'}).json()["data"]["result"]
            assert found and {r["metric"]["instance"] for r in found} == {f"127.0.0.1:{llmslo_port}"}, name

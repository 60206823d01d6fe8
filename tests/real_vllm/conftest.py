"""A real vLLM server (CPU build) on loopback, in its own environment, with a tiny random model."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]
SERVED_MODEL = "tiny-llama"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The vLLM environment's interpreter, built on first use by scripts/vllm_env.sh."""
    if sys.platform != "linux":
        require(False, "the vLLM CPU build runs on Linux only")
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "vllm_env.sh")], capture_output=True, text=True, timeout=3000)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or "").strip().splitlines()[-15:])
        require(False, f"could not build the vLLM environment:\n{tail}")
    env_dir = Path(proc.stdout.strip().splitlines()[-1])
    return env_dir / "bin" / "python"


@pytest.fixture(scope="session")
def tiny_model(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-llama")
    subprocess.run(
        [str(vllm_python), str(Path(__file__).parent / "make_model.py"), str(out)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return out


@pytest.fixture(scope="session")
def slow_model(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A larger random Llama (6 layers, hidden 768: tens of ms per decode step on one CPU core),
    so that a burst of requests queues in the engine, where vLLM's own histograms see it."""
    out = tmp_path_factory.mktemp("slow-llama")
    subprocess.run(
        [str(vllm_python), str(Path(__file__).parent / "make_model.py"), str(out), "6", "12"],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return out


@dataclass
class VllmServer:
    python: Path
    model_dir: Path
    port: int = field(default_factory=free_port)
    log_path: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    otlp_endpoint: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)  # e.g. OTEL_SERVICE_NAME
    max_num_seqs: int = 8

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.base}/metrics"

    def start(self, timeout: float = 300.0) -> None:
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CPU_OMP_THREADS_BIND": "auto",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_LOGGING_LEVEL": "WARNING",
            **self.extra_env,
        }
        args = [
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            SERVED_MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            "float32",
            "--max-model-len",
            "1024",
            "--enable-prefix-caching",
            "--enforce-eager",
            "--max-num-seqs",
            str(self.max_num_seqs),
        ]
        if self.otlp_endpoint:
            args += ["--otlp-traces-endpoint", self.otlp_endpoint]
            env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
        assert self.log_path is not None
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.base}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"vLLM did not become healthy in {timeout}s:\n{self.log_tail()}")

    def stop(self) -> None:
        """Stop the server and its engine processes by process group id."""
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = os.getpgid(self.proc.pid)
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        # engine-core children share the group; make sure none survive
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)

    def log_tail(self, lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture(scope="module")
def vllm_server(vllm_python: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    server = VllmServer(vllm_python, tiny_model, log_path=tmp_path_factory.mktemp("vllm") / "vllm.log")
    try:
        server.start()
    except RuntimeError as exc:
        pytest.fail(str(exc))
    try:
        yield server
    finally:
        server.stop()

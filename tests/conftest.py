"""Shared fixtures: fixture files, a real Store on SQLite and on PostgreSQL, local HTTP targets."""

from __future__ import annotations

import importlib.util
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from collector.store.repository import Store

FIXTURES = Path(__file__).parent / "fixtures"
IN_CI = os.environ.get("CI", "").lower() == "true"
PG_ADMIN_URL = os.environ.get("LLMSLO_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def require(condition: bool, why: str) -> None:
    """Skip locally when a real dependency is missing; under CI=true a missing one is a failure."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"{why} (required under CI=true)")
    pytest.skip(why)


if importlib.util.find_spec("xdist") is not None:

    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
        """Under pytest-xdist (the test command runs two workers): each test module runs whole on
        one worker, so that its module fixtures (a Prometheus stack, a simulated week) start
        once, and the real-vLLM tier's modules share one worker (one engine on the CPU at a time)
        with the generated promtool tests: promtool keeps both cores busy for a minute or more, and the
        real engine's drift assertions have time bounds (the incident run missed its 150 s for
        the prompt-length drift when the two ran together on two cores; alone it passes).
        (xdist's own `--dist loadgroup` marks do not take with pytest 9.2, which keeps a node's
        id where xdist no longer writes it.)"""
        from xdist.scheduler import LoadScopeScheduling

        # the modules are handed out in collection order (`pytest_collection_modifyitems`: the
        # slowest first), not xdist's default of the most tests first, which left the slowest
        # modules (few tests each: the incident run, the Prometheus stack) to the end, one worker
        # running them while the other had nothing left
        config.option.loadscopereorder = False

        class ModuleScheduling(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                module = nodeid.split("::", 1)[0]
                if module.startswith("tests/real_vllm/") or module == "tests/generate/test_generate.py":
                    return "cpu-heavy"
                return module

        return ModuleScheduling(config, log)


# The slowest modules, run first (so that under two workers the run does not end with one of them
# alone on a long module): seconds on one of two workers of the 2-core CI machine, session 33.
SLOWEST_FIRST = (
    "tests/real_vllm/test_incident_run.py",  # 400, with the real-vLLM tier and promtool's 250 (one worker)
    "tests/real_vllm/test_real_vllm.py",
    "tests/generate/test_generate.py",
    "tests/slo/test_saved_counts.py",  # 260
    "tests/report/test_weekly_report.py",  # 250
    "tests/e2e/test_prometheus_alertmanager.py",  # 190
    "tests/sim/test_demo_terminal.py",  # 150
    "tests/traces/test_ingest.py",  # 120
    "tests/slo/test_sharded.py",  # 110
    "tests/slo/test_ledger.py",  # 110
    "tests/integration/test_serve.py",  # 75
    "tests/drift/test_drift_on_the_simulator.py",  # 75
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slowest modules first (`SLOWEST_FIRST`), the others after them in their own order."""
    rank = {module: i for i, module in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


def public_sample_section(n: int = 1) -> str:
    text = (FIXTURES / "vllm-metrics-public-samples.txt").read_text()
    sections = text.split("# ===== SECTION ")
    return sections[n].split("\n", 1)[1]


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session; dropped afterwards."""
    try:
        import psycopg
    except ImportError:  # pragma: no cover
        require(False, "psycopg is not installed")
        raise
    dsn = "host=127.0.0.1 port=5432 user=postgres dbname=postgres connect_timeout=3"
    try:
        admin = psycopg.connect(dsn, autocommit=True)
    except psycopg.OperationalError as exc:
        require(False, f"PostgreSQL is not reachable on 127.0.0.1:5432: {exc}")
        raise
    name = f"llmslo_test_{uuid.uuid4().hex[:10]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def _reset_pg(url: str) -> None:
    store = Store(url)
    with store.engine.begin() as conn:
        from collector.store.tables import metadata

        for table in reversed(metadata.sorted_tables):
            conn.execute(table.delete())
    store.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database URL on each supported backend (both run in CI)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'llmslo.db'}"
    url: str = request.getfixturevalue("pg_server")
    _reset_pg(url)
    return url


@pytest.fixture
def pg_url(pg_server: str) -> str:
    """PostgreSQL alone (what collectors sharing one database need), emptied for the test."""
    _reset_pg(pg_server)
    return pg_server


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = Store(db_url)
    yield s
    s.close()

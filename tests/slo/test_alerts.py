"""Alert lifecycle in the database and delivery to a real Alertmanager (API v2)."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from collector.generate.alertmanager import alertmanager_config
from collector.rollup import Row
from collector.slo.alerts import AlertBook, deliver
from collector.slo.evaluate import evaluate
from collector.slo.spec import SloRules, load_rules
from collector.store.repository import Store
from tests.conftest import require
from tests.receivers import PostRecorder
from tests.slo.test_evaluate import END, NOW, RULES, success_row


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def rules(tmp_path: Path) -> SloRules:
    p = tmp_path / "r.yaml"
    p.write_text(RULES)
    return load_rules(p).rules


def outage_rows(bad_share: float) -> list[Row]:
    rows = []
    for i in range(120):
        start = END - 60 * (i + 1)
        rows += [success_row(start, "stop", 100 * (1 - bad_share)), success_row(start, "error", 100 * bad_share)]
    return rows


def test_lifecycle_is_persisted_and_survives_a_restart(rules: SloRules, store: Store) -> None:
    book = AlertBook(store)
    book.load()
    changed = book.apply(rules, evaluate(rules, outage_rows(0.5), NOW), NOW)
    firing = [i for i in book.instances.values() if i.state == "firing"]
    assert firing and {i.labels["slo"] for i in firing} == {"chat-errors"}
    page = next(i for i in firing if i.labels["severity"] == "page" and i.labels["long_window"] == "1h")
    assert page.labels["short_window"] == "5m" and page.labels["business_type"] == "chat"
    assert page.annotations["runbook_url"].endswith("#llmslochaterrorsbudgetburn")
    assert {"summary", "description", "runbook_url", "dashboard_url"} <= set(page.annotations)
    assert len(changed) == len(firing)

    again = AlertBook(store)  # a restarted collector
    again.load()
    assert {k: v.state for k, v in again.instances.items()} == {k: v.state for k, v in book.instances.items()}
    assert again.apply(rules, evaluate(rules, outage_rows(0.5), NOW + 30), NOW + 30) == []  # no re-page

    resolved = again.apply(rules, evaluate(rules, outage_rows(0.0), NOW + 60), NOW + 60)
    assert {i.state for i in resolved} == {"resolved"} and all(i.ends_at_unix == NOW + 60 for i in resolved)


class Receiver(PostRecorder):
    """Alertmanager's webhook target: every notification, decoded."""

    @property
    def notifications(self) -> list[dict[str, object]]:
        return [{"path": p.path, **json.loads(p.body)} for p in self.posts]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def start_alertmanager(tmp_path: Path, config: dict[str, object], port: int) -> subprocess.Popen[bytes]:
    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    require(binary is not None, "Debian's prometheus-alertmanager is not installed")
    assert binary is not None
    cfg = tmp_path / "am.yml"
    cfg.write_text(yaml.safe_dump(config))
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={cfg}",
            f"--storage.path={tmp_path / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/-/ready", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError("Alertmanager did not start")


def test_delivery_queues_while_alertmanager_is_down_then_pages(
    rules: SloRules, store: Store, receiver: Receiver, tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    book = AlertBook(store)
    book.load()
    book.apply(rules, evaluate(rules, outage_rows(0.5), NOW), NOW)
    firing = len(book.active())

    async def first_try() -> int:
        async with httpx.AsyncClient() as client:
            return await deliver(book, client, url, NOW, 60.0, 2.0)

    assert asyncio.run(first_try()) == 0  # refused: nothing dropped, retried later
    assert all(i.attempts == 1 and i.next_attempt_unix > NOW for i in book.active())
    assert book.due(NOW + 1, 60.0) == []  # backing off

    config = alertmanager_config(rules, webhook_base=receiver.base)
    for route in config["route"]["routes"]:  # type: ignore[index]
        route["group_wait"] = "1s"
    proc = start_alertmanager(tmp_path, config, port)
    try:
        now = time.time()
        book2 = AlertBook(store)  # also proves the queue survived in the database
        book2.load()
        for inst in book2.instances.values():
            assert inst.attempts == 1  # the failed attempt was persisted
            # move the virtual clock of the evaluation (NOW) to the wall clock Alertmanager runs on
            inst.starts_at_unix, inst.next_attempt_unix = now, now
        assert len(book2.due(now + 10, 60.0)) == firing

        async def second_try() -> int:
            async with httpx.AsyncClient() as client:
                return await deliver(book2, client, url, now + 10, 60.0, 2.0)

        assert asyncio.run(second_try()) == firing
        alerts = httpx.get(f"{url}/api/v2/alerts").json()
        assert {a["labels"]["slo"] for a in alerts} == {"chat-errors"}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(n["path"] == "/pager" for n in receiver.notifications):
            time.sleep(0.2)
        pages = [n for n in receiver.notifications if n["path"] == "/pager"]
        assert pages, "no page reached the webhook"
        labels = pages[0]["commonLabels"]
        assert labels["severity"] == "page" and labels["slo"] == "chat-errors"  # type: ignore[index]
        # tickets of the same SLO are inhibited while it pages
        assert not any(n["path"] == "/tickets" for n in receiver.notifications)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_generated_routing_passes_amtool(tmp_path: Path) -> None:
    amtool = shutil.which("amtool")
    require(amtool is not None, "Debian's amtool (prometheus-alertmanager) is not installed")
    assert amtool is not None
    root = Path(__file__).resolve().parents[2]
    cfg = root / "alerts" / "alertmanager.yml"
    assert subprocess.run([amtool, "check-config", str(cfg)], capture_output=True).returncode == 0
    for labels, receiver_name in (
        (["severity=page", "slo=chat-ttft"], "llmslo-pager"),
        (["severity=ticket", "slo=chat-ttft"], "llmslo-tickets"),
        (["alertname=Other"], "llmslo-tickets"),
    ):
        proc = subprocess.run(
            [
                amtool,
                "config",
                "routes",
                "test",
                f"--config.file={cfg}",
                f"--verify.receivers={receiver_name}",
                *labels,
            ],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr

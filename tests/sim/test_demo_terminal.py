"""`llmslo demo` as a user sees it: run in a pseudo-terminal of 150 x 40 and read through a VT100
emulator (pyte), on its compressed clock, with a scenario that brings the overload sooner: the
story's milestones appear on screen in order (healthy, overload measured with its cause, a page
naming its SLO, recovery, the page resolved), the view redraws in place (one header on screen,
never a pile of stale copies); and piped to a file, one plain line per event."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import re
import select
import shutil
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import httpx
import pyte
import pytest

from tests.conftest import require
from tests.embedded import free_port

ROOT = Path(__file__).resolve().parents[2]
LLMSLO = str(Path(sys.executable).parent / "llmslo")
# the built-in demo, shortened: 15 s healthy, 60 s overloaded (the built-in: 1 and 3 minutes)
SCENARIO = (ROOT / "collector" / "data" / "scenario-demo.yaml").read_text().split("incidents:")[0]
SCENARIO += "incidents:\n  - {kind: overload, start: 15s, duration: 60s, factor: 10}\n"
SECONDS = 330
CANARY_LINE = re.compile(
    r"canary chat-canary-0 \(acme/llama-3.1-8b-chat-v2, 5% of chat\) vs stable, \d+ vs \d+ requests"
)


def test_the_story_on_a_terminal(tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(SCENARIO)
    assert "start: 15s" in SCENARIO
    cols, rows = 150, 40
    screen = pyte.Screen(cols, rows)
    stream = pyte.ByteStream(screen)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    # Debian's Alertmanager: the demo starts it and llmslo's evaluator sends it the page
    require(shutil.which("prometheus-alertmanager") is not None, "Debian's prometheus-alertmanager is not installed")
    cmd = [LLMSLO, "demo", "--scenario", str(scenario), "--port", str(free_port()), "--data-dir", str(tmp_path),
           "--duration", str(SECONDS)]  # fmt: skip
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(cols), "LINES": str(rows)}
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    seen: list[tuple[float, str]] = []  # (seconds, milestone), in the order they first appeared
    headers_on_screen = 0
    canary_seen = False
    alertmanager: str | None = None
    paged_in_alertmanager: list[str] = []
    started = time.monotonic()
    milestones = {
        "healthy": re.compile(r"measured: every business type within its p95 objectives; no alert firing"),
        "overload measured": re.compile(r"TTFT p95 .* over .*: queue\)"),
        "page": re.compile(r"PAGE \S+-ttft"),
        "recovered": re.compile(r"scenario: no incident left"),
    }
    try:
        while proc.poll() is None and time.monotonic() - started < SECONDS + 60:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    stream.feed(os.read(master, 65536))
                except OSError:
                    break
            text = "\n".join(screen.display)
            headers_on_screen = max(headers_on_screen, text.count("llmslo demo   t ="))
            canary_seen = canary_seen or bool(CANARY_LINE.search(text))
            found = re.search(r"Alertmanager (http://127\.0\.0\.1:\d+)", text)
            alertmanager = alertmanager or (found.group(1) if found else None)
            if alertmanager and "page" in {m for _, m in seen} and not paged_in_alertmanager:
                with contextlib.suppress(httpx.HTTPError):
                    alerts = httpx.get(f"{alertmanager}/api/v2/alerts", timeout=2).json()
                    paged_in_alertmanager += [
                        a["labels"]["alertname"] for a in alerts if a["labels"].get("severity") == "page"
                    ]
            for name, pattern in milestones.items():
                if name not in {m for _, m in seen} and pattern.search(text):
                    seen.append((time.monotonic() - started, name))
            if seen and seen[-1][1] == "resolved":
                break
            names = {m for _, m in seen}
            if "page" in names and "recovered" in names and "PAGE" not in text and "resolved" not in names:
                seen.append((time.monotonic() - started, "resolved"))
    finally:
        proc.terminate()  # SIGTERM, as a service manager stops it: the demo stops as on Ctrl-C
        proc.wait(30)
        os.close(master)
    assert proc.returncode == 0, proc.returncode
    if alertmanager is not None:  # and it stopped the Alertmanager it started (once left running)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{alertmanager}/-/healthy", timeout=2)
    order = [m for _, m in seen]
    print("\n" + "\n".join(f"{t:5.0f} s  {m}" for t, m in seen))
    assert order == ["healthy", "overload measured", "page", "recovered", "resolved"], (
        order,
        "\n".join(screen.display),
    )
    assert headers_on_screen == 1, "stale copies of the view piled up on the screen"
    assert alertmanager is not None, "the view never showed the Alertmanager it started"
    assert canary_seen, "the canary's line never showed its counts and verdict"
    assert any(name.endswith("TtftBudgetBurn") for name in paged_in_alertmanager), paged_in_alertmanager


def test_plain_lines_when_not_a_terminal(tmp_path: Path) -> None:
    """Piped: one line per event; and the canary's verdict. The built-in canary takes 5 % of chat
    and reaches the 100 requests a verdict needs in about three minutes; here it takes 40 %, so
    that within the run it goes from not enough data to rolled back for its slower tokens."""
    scenario = tmp_path / "scenario.yaml"
    assert "traffic_share: 0.05" in SCENARIO
    scenario.write_text(SCENARIO.replace("traffic_share: 0.05", "traffic_share: 0.4"))
    done = subprocess.run(
        [LLMSLO, "demo", "--scenario", str(scenario), "--port", str(free_port()), "--data-dir", str(tmp_path),
         "--duration", "60", "--no-alertmanager"],
        capture_output=True, text=True, timeout=150, check=False,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("[")]
    assert done.returncode == 0, done.stderr[-2000:]
    assert lines[0].startswith("[0:0") and "measured: every business type within" in lines[0]
    assert any("scenario: overload starts" in line for line in lines), lines
    assert "\x1b[" not in done.stdout  # no terminal control sequences in a file
    canary = [line for line in lines if "canary chat-canary-0 (acme/llama-3.1-8b-chat-v2, 40% of chat)" in line]
    assert canary and "hold: not enough data" in canary[0], lines
    # the candidate is slower in prefill and per token: rolled back, naming the metric over tolerance
    assert re.search(r"rollback: (TTFT|TPOT|e2e latency) p\d\d \+\d+ % \(CI \+", canary[-1]), canary
    counts = [int(re.search(r"vs stable, (\d+) vs", line).group(1)) for line in canary]  # type: ignore[union-attr]
    assert counts[-1] >= 100 > counts[0], counts

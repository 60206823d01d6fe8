"""CLI user errors are one clear line and exit 2, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def llmslo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "collector.cli", *args], capture_output=True, text=True, timeout=60)


def test_inspect_of_a_missing_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    out = llmslo("inspect", str(tmp_path / "nowhere.txt"))
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [f"{tmp_path / 'nowhere.txt'}: cannot read: No such file or directory"]
    assert "Traceback" not in out.stderr


def test_help_lists_every_command() -> None:
    out = llmslo("--help")
    assert out.returncode == 0
    for command in ("serve", "demo", "simulate", "check-config", "check", "generate", "db", "inspect"):
        assert command in out.stdout

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


def test_inspect_reads_a_scrape_and_names_the_vllm_release_range() -> None:
    sample = Path(__file__).resolve().parents[2] / "collector" / "data" / "vllm-0.13-sample.txt"
    out = llmslo("inspect", str(sample))
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0]
    assert "vLLM metric names of 0.11 or later" in first and "1 model(s)" in first
    assert "requests finished 2 (abort 0, error 0, length 2, stop 0)" in out.stdout
    assert "ttft: 2 observations, mean 0.207 s" in out.stdout
    raw = llmslo("inspect", str(sample), "--json")
    assert '"vllm_naming": "0.11 or later"' in raw.stdout


def test_naming_range_of_older_releases() -> None:
    from collector.cli import naming_range

    v0 = "vllm:gpu_cache_usage_perc 0\nvllm:time_per_output_token_seconds_count 1\n"
    assert naming_range(v0) == "0.6 to 0.8"
    both = "vllm:gpu_cache_usage_perc 0\nvllm:kv_cache_usage_perc 0\nvllm:inter_token_latency_seconds_count 1\n"
    assert naming_range(both) == "0.10 to 0.11"


def test_every_command_has_an_example_and_every_option_its_help() -> None:
    import argparse

    from collector import cli

    for name, command in cli._subcommands(cli.build_parser()).items():
        assert command.epilog and "llmslo " + name.split()[0] in command.epilog, name
        missing = [a.option_strings or a.dest for a in command._actions if not a.help and a.dest != "help"]
        assert not missing, (name, missing)
        assert isinstance(command, argparse.ArgumentParser)


def test_report_errors_are_one_line_and_exit_2(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from collector.cli import main

    config = tmp_path / "llmslo.yaml"
    config.write_text(f"data_dir: {tmp_path}\n")
    for args, expected in (
        (["--week", "2025-W53"], "report: week '2025-W53': 2025 has no ISO week 53"),
        (["--timezone", "Mars/Olympus"], "report: unknown time zone 'Mars/Olympus'"),
        (["--start", "yesterday", "--end", "2026-11-30"], "report: 'yesterday': expected unix seconds"),
    ):
        assert main(["report", "--config", str(config), *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith(expected), err

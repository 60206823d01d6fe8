"""Generated alerts/: up to date, well-formed, and passing the real promtool and amtool."""

from __future__ import annotations

import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from collector.cli import main
from collector.generate.files import generate
from collector.generate.promql import GENERATED_HEADER, le_matcher, num
from collector.slo.spec import load_rules
from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "alerts"


def promtool() -> str:
    path = shutil.which("promtool")
    require(path is not None, "Debian's promtool (package prometheus) is not installed")
    assert path is not None
    return path


def test_committed_alerts_are_what_the_rules_generate(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "generate",
        "--rules",
        str(ROOT / "rules"),
        "--out",
        str(ALERTS),
        "--dashboards-out",
        str(ROOT / "dashboards"),
        "--check",
    ]
    assert main(args) == 0


def test_check_fails_on_a_hand_edited_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, dash = tmp_path / "alerts", tmp_path / "dashboards"
    args = ["generate", "--rules", str(ROOT / "rules"), "--out", str(out), "--dashboards-out", str(dash)]
    assert main(args) == 0
    edited = out / "llmslo-alerts.rules.yml"
    edited.write_text(edited.read_text().replace("14.4", "15"))
    (dash / "llmslo-overview.json").write_text("{}")
    assert main([*args, "--check"]) == 1
    err = capsys.readouterr().err
    assert "llmslo-alerts.rules.yml: differs" in err and "llmslo-overview.json: differs" in err


def test_a_generated_file_the_rules_no_longer_give_is_stale_and_removed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A renamed test file must not linger (promtool would still run the old one); a file of the
    user's own beside the generated ones is left alone."""
    out, dash = tmp_path / "alerts", tmp_path / "dashboards"
    args = ["generate", "--rules", str(ROOT / "rules"), "--out", str(out), "--dashboards-out", str(dash)]
    assert main(args) == 0
    old = out / "tests" / "llmslo-burn-rate-old.test.yml"
    old.write_text((out / "tests" / "llmslo-burn-rate.test.yml").read_text())
    mine = out / "tests" / "team.test.yml"
    mine.write_text("rule_files: [../llmslo-alerts.rules.yml]\ntests: []\n")
    capsys.readouterr()
    assert main([*args, "--check"]) == 1
    err = capsys.readouterr().err
    assert "llmslo-burn-rate-old.test.yml: generated, but the rules no longer give it" in err
    assert "team.test.yml" not in err
    assert main(args) == 0
    assert "removed tests/llmslo-burn-rate-old.test.yml" in capsys.readouterr().out
    assert not old.exists() and mine.exists()
    assert main([*args, "--check"]) == 0


def test_every_file_has_the_header_and_no_float_noise() -> None:
    files = generate(load_rules(ROOT / "rules").rules)
    for name, text in files.items():
        assert GENERATED_HEADER.strip("# \n") in text.split("\n", 1)[0], name
        assert not re.search(r"\d\.\d{7,}", text), f"float noise (more than 6 decimals) in {name}"


def test_every_alert_carries_routing_labels_annotations_and_a_runbook_section() -> None:
    runbook = (ALERTS / "RUNBOOK.md").read_text()
    doc = yaml.safe_load((ALERTS / "llmslo-alerts.rules.yml").read_text())
    alerts = [r for g in doc["groups"] for r in g["rules"]]
    assert len(alerts) > 40
    for rule in alerts:
        assert rule["labels"]["severity"] in ("page", "ticket")
        if rule["alert"] in ("LLMSLOTargetDown", "LLMSLOTargetRestarted", "LLMSLOCollectorSkippingScrapes"):
            # per target (the business_type label comes from the target's own relabelled labels),
            # or per llmslo collector: its default route
            assert "business_type" not in rule["labels"] and "instance" in rule["annotations"]["description"]
        else:
            assert "business_type" in rule["labels"]
        assert set(rule["annotations"]) == {"summary", "description", "runbook_url", "dashboard_url"}
        anchor = rule["annotations"]["runbook_url"].rsplit("#", 1)[1]
        assert f"## {rule['alert']}" in runbook and anchor == rule["alert"].lower()
        assert "for" not in rule or not rule["alert"].endswith("BudgetBurn"), "burn-rate alerts have no `for`"


def test_thresholds_are_formatted_deliberately() -> None:
    assert [num(x) for x in (14.4 * 0.05, 6 * 0.01, 0.066, 1.0, 2560.0)] == ["0.72", "0.06", "0.066", "1", "2560"]
    assert le_matcher(1.0) == "1|1\\\\.0" and le_matcher(0.5) == "0\\\\.5"


def test_promtool_checks_the_rules() -> None:
    files = sorted(str(p) for p in ALERTS.glob("*.rules.yml"))
    proc = subprocess.run([promtool(), "check", "rules", *files], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 140 rules found" in proc.stdout


def test_generated_promtool_tests_pass() -> None:
    tool = promtool()
    tests = sorted(ALERTS.glob("tests/*.test.yml"))

    def run(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([tool, "test", "rules", str(path)], capture_output=True, text=True, cwd=path.parent)

    with ThreadPoolExecutor(max_workers=2) as pool:
        for proc in pool.map(run, tests):
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_a_missing_le_bound_is_caught_by_the_generated_tests(tmp_path: Path) -> None:
    """vLLM's TTFT has no le="2.0": a rule selecting it yields nothing and could never fire.
    The generated SLI check must fail on such a rule."""
    tool = promtool()
    out = tmp_path / "alerts"
    shutil.copytree(ALERTS, out)
    rec = out / "llmslo-recording.rules.yml"
    rec.write_text(rec.read_text().replace('le=~"1|1\\\\.0"', 'le="2.0"', 1))
    assert rec.read_text() != (ALERTS / "llmslo-recording.rules.yml").read_text()
    suite = yaml.safe_load((out / "tests" / "llmslo-burn-rate.test.yml").read_text())
    suite["tests"] = [t for t in suite["tests"] if t["name"].startswith("chat-ttft: fires")]
    pristine = tmp_path / "pristine"
    shutil.copytree(ALERTS, pristine)
    for tree in (out, pristine):
        (tree / "tests" / "only.test.yml").write_text(yaml.safe_dump(suite))

    def run(tree: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [tool, "test", "rules", "only.test.yml"], capture_output=True, text=True, cwd=tree / "tests"
        )

    good = run(pristine)
    assert good.returncode == 0, good.stdout + good.stderr
    broken = run(out)
    assert broken.returncode != 0 and "FAILED" in broken.stdout + broken.stderr


def test_every_alert_links_to_the_generated_dashboard() -> None:
    import json

    dashboard = json.loads((ROOT / "dashboards" / "llmslo-overview.json").read_text())
    assert dashboard["description"].startswith("Generated by `llmslo generate`")
    for name in ("llmslo-alerts.rules.yml", "llmslo-drift.rules.yml"):
        doc = yaml.safe_load((ALERTS / name).read_text())
        for rule in (r for g in doc["groups"] for r in g["rules"] if "alert" in r):
            url = rule["annotations"]["dashboard_url"]
            assert f"/d/{dashboard['uid']}/" in url and "from=now-6h" in url, url

from __future__ import annotations

from pathlib import Path

import pytest

from collector.cli import main
from collector.sim.scenario import BUILTIN, ScenarioError, load_scenario, parse_scenario

GOOD = Path(__file__).resolve().parents[3] / "collector" / "data" / "scenario-healthy.yaml"


@pytest.mark.parametrize("name", BUILTIN)
def test_builtin_scenarios_load(name: str) -> None:
    sc = load_scenario(name)
    assert sc.replica_names and sc.profiles


def test_every_problem_is_reported_with_its_location() -> None:
    text = GOOD.read_text().replace("requests_per_second: 3", "requests_per_second: -1").replace(
        "business_types: [code_completion]", "business_types: [code_complete]"
    ).replace("    replicas: 2\n", "    replicas: 2\n    colour: blue\n") + (
        "incidents:\n  - {kind: meteor_strike, start: 1m, duration: 1m}\n"
        "  - {kind: overload, start: soon, duration: 1m, factor: 2}\n"
    )
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text, "s.yaml")
    problems = "\n".join(info.value.problems)
    lines = text.split("\n")
    rps_line = next(i for i, line in enumerate(lines, 1) if "requests_per_second: -1" in line)
    assert f"s.yaml:{rps_line}: workload.requests_per_second" in problems
    assert "deployments[0].colour: unknown key" in problems
    assert "incidents[0].kind" in problems and "meteor_strike" in problems
    assert "incidents[1].start" in problems and "'soon'" in problems
    assert len(info.value.problems) == 4


def test_cross_checks_name_their_keys() -> None:
    text = GOOD.read_text().replace("business_types: [code_completion]", "business_types: [code_complete]").replace(
        "gpu_memory_gb: 80", "gpu_memory_gb: 16"
    ) + (
        "incidents:\n  - {kind: replica_down, start: 1m, duration: 1m, target: chat-7}\n"
        "  - {kind: overload, start: 1m, duration: 1m}\n"
    )
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text, "s.yaml")
    problems = "\n".join(info.value.problems)
    assert "deployments[2].business_types[0]: unknown business type 'code_complete'" in problems
    assert "business_types.code_completion: no deployment serves it" in problems
    assert "deployments[3]: the KV cache holds 0 tokens" in problems
    assert "incidents[0].target: 'chat-7' is not a deployment or replica" in problems
    assert "incidents[1]: overload needs a factor other than 1" in problems


def test_an_incident_may_start_with_the_scenario_but_not_last_no_time() -> None:
    text = GOOD.read_text() + "incidents:\n  - {kind: replica_down, start: 0s, duration: 1m, target: chat-0}\n"
    (incident,) = parse_scenario(text, "s.yaml").incidents
    assert incident.start == 0.0 and incident.active(0.0) and not incident.active(60.0)
    with pytest.raises(ScenarioError, match=r"incidents\[0\]\.duration"):
        parse_scenario(text.replace("duration: 1m, target", "duration: 0s, target"), "s.yaml")


@pytest.mark.parametrize("text", ["", "- a\n- b\n", "version: v1\n", "version: v2\nworkload: 3\n", "{[", "\x00"])
def test_garbage_never_crashes(text: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text, "bad.yaml")
    assert all(p.startswith("bad.yaml") for p in info.value.problems)


def test_simulate_command_reports_problems_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: v1\nworkload: {requests_per_second: 0}\n")
    assert main(["simulate", "--scenario", str(bad), "--duration", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "problem(s) in the scenario" in err and f"{bad}:2: workload.requests_per_second" in err
    assert main(["simulate", "--scenario", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err

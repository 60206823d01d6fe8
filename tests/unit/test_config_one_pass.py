"""A configuration's problems in one pass (field errors and the checks across fields), and
built-in scenario names that a local folder does not shadow."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.config import ConfigError, load_settings
from collector.sim.scenario import ScenarioError, load_scenario


def test_every_problem_in_one_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "llmslo.yaml"
    path.write_text(
        "rules: ./nowhere\n"
        "targets:\n"
        '  - {name: a, url: "http://127.0.0.1:8000/metrics", business_type: nope}\n'
        '  - {name: a, url: "http://127.0.0.1:8001/metrics", interval: banana}\n'
    )
    with pytest.raises(ConfigError) as err:
        load_settings(path, environ={})
    problems = err.value.problems
    assert len(problems) == 4, problems
    text = "\n".join(problems)
    assert f"{path}:4: targets[1].interval" in text
    assert f"{path}:1: rules: './nowhere' does not exist" in text
    assert f"{path}:3: targets[0].business_type: unknown business type 'nope'" in text
    assert f"{path}:4: targets[1].name: duplicate target name 'a'" in text
    # with the field fixed, the same checks still run (on the validated settings)
    path.write_text(path.read_text().replace("interval: banana", "interval: 15s"))
    with pytest.raises(ConfigError) as err:
        load_settings(path, environ={})
    assert len(err.value.problems) == 3


def test_a_builtin_scenario_name_wins_over_a_local_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo").mkdir()
    assert load_scenario("demo").spec.deployments  # the built-in one
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario("./demo")  # asked for as a path: the folder

from __future__ import annotations

from pathlib import Path

import pytest

from collector.cli import main
from collector.config import ConfigError, format_duration, load_settings, parse_duration

GOOD = """\
database_url: sqlite:///tmp/x.db
scrape:
  interval: 15s
  timeout: 5s
windows: [1m, 5m, 1h]
targets:
  - name: vllm-a
    url: http://127.0.0.1:8000/metrics
    labels: {cluster: local}
    business_type: chat
    models:
      codellama: code_completion
  - name: vllm-b
    url: http://127.0.0.1:8001/metrics
    interval: 30s
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "llmslo.yaml"
    path.write_text(text)
    return path


def test_a_good_file_loads_with_defaults_filled_in(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, GOOD), environ={})
    assert [t.name for t in s.targets] == ["vllm-a", "vllm-b"]
    assert s.windows == [60.0, 300.0, 3600.0]
    assert s.target_interval(s.targets[0]) == 15.0 and s.target_interval(s.targets[1]) == 30.0
    assert s.targets[0].business_type_of("codellama") == "code_completion"
    assert s.targets[0].business_type_of("other") == "chat"
    assert s.targets[1].business_type_of("other") is None
    assert s.scrape.max_body_bytes == 10 * 1024 * 1024


def test_default_database_is_sqlite_in_the_data_dir() -> None:
    s = load_settings(None, environ={"LLMSLO_DATA_DIR": "/var/lib/llmslo"})
    assert s.resolved_database_url == "sqlite:////var/lib/llmslo/llmslo.db"


def test_environment_overrides_nested_keys(tmp_path: Path) -> None:
    env = {
        "LLMSLO_SERVER__PORT": "9999",
        "LLMSLO_DATABASE_URL": "postgresql+psycopg://u@h:5432/db",
        "LLMSLO_SCRAPE__TIMEOUT": "2s",
    }
    s = load_settings(write(tmp_path, GOOD), environ=env)
    assert s.server.port == 9999
    assert s.database_url == "postgresql+psycopg://u@h:5432/db"
    assert s.scrape.timeout == 2.0


def test_every_problem_is_reported_with_its_line(tmp_path: Path) -> None:
    bad = """\
scrape:
  interval: soon
windows: [90s]
targets:
  - name: a
    url: ftp://x
    colour: blue
  - name: a
    url: http://127.0.0.1:1/metrics
    business_type: chitchat
"""
    path = write(tmp_path, bad)
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ={})
    problems = info.value.problems
    text = "\n".join(problems)
    assert f"{path}:2: scrape.interval: expected a duration such as '15s' or '5m', got 'soon'" in text
    assert f"{path}:3: windows: " in text and "not whole minutes" in text
    assert f"{path}:6: targets[0].url" in text and "http://" in text
    assert f"{path}:7: targets[0].colour: unknown key" in text
    # and in the same pass, the checks across fields (they used to wait for a valid model)
    assert f"{path}:8: targets[1].name: duplicate target name 'a'" in text
    assert f"{path}:8: targets[1].business_type: unknown business type 'chitchat'" in text
    assert len(problems) == 6


def test_cross_checks_report_duplicates_and_unknown_business_types(tmp_path: Path) -> None:
    bad = """\
targets:
  - {name: a, url: "http://127.0.0.1:1/metrics"}
  - {name: a, url: "http://127.0.0.1:2/metrics", business_type: chitchat, models: {m: nope}}
  - {name: c, url: "http://127.0.0.1:3/metrics", interval: 5s, timeout: 10s}
"""
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, bad), environ={})
    text = "\n".join(info.value.problems)
    assert ":3: targets[1].name: duplicate target name 'a'" in text
    assert "unknown business type 'chitchat'" in text and "targets[1].models.m" in text
    assert "targets[2].timeout: 10s is longer than the scrape interval 5s" in text


def test_static_labels_must_be_valid_and_not_llmslos_own(tmp_path: Path) -> None:
    bad = """\
targets:
  - {name: a, url: "http://127.0.0.1:1/metrics", labels: {model: x, "bad-name": y}}
"""
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, bad), environ={})
    text = "\n".join(info.value.problems)
    assert "targets[0].labels" in text and "'bad-name' is not a valid Prometheus label name" in text


def test_other_llmslo_variables_are_not_settings() -> None:
    env = {"LLMSLO_VLLM_ENV": "/x", "LLMSLO_BENCH_SECONDS": "5", "LLMSLO_SERVER__PORT": "1"}
    assert load_settings(None, environ=env).server.port == 1


def test_env_problems_name_the_variable() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(None, environ={"LLMSLO_SERVER__PORT": "not-a-port"})
    assert info.value.problems[0].startswith("env LLMSLO_SERVER__PORT: server.port")


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, "targets:\n  - name: [unclosed\n"), environ={})
    assert "invalid YAML" in info.value.problems[0] and ":3" in info.value.problems[0]


def test_check_config_command_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", "--config", str(write(tmp_path, GOOD))]) == 0
    assert "2 target(s)" in capsys.readouterr().out
    assert main(["check-config", "--config", str(write(tmp_path, "windows: [7s]\nbogus: 1\n"))]) == 2
    err = capsys.readouterr().err
    assert "2 problem(s)" in err and "bogus: unknown key" in err


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("15s", 15.0), ("5m", 300.0), ("1h", 3600.0), ("500ms", 0.5), ("2d", 172800.0), (30, 30.0)],
)
def test_durations(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "5 minutes", "-1s", 0, True])
def test_bad_durations(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)


@pytest.mark.parametrize("zero", [0, "0", "0s", "0ms"])
def test_zero_is_a_duration_only_where_it_means_none(tmp_path: Path, zero: object) -> None:
    """scrape.commit_linger 0 commits each group at once and cluster.settle 0 judges a slice as
    soon as it ends; a zero scrape interval or timeout is still refused, naming the key."""
    text = GOOD + f"cluster: {{settle: {zero!r}}}\n".replace("'", '"')
    text = text.replace("  timeout: 5s\n", f"  timeout: 5s\n  commit_linger: {zero!r}\n".replace("'", '"'))
    s = load_settings(write(tmp_path, text), environ={})
    assert s.scrape.commit_linger == 0.0 and s.cluster.settle == 0.0
    env = {"LLMSLO_SCRAPE__COMMIT_LINGER": "0"}
    assert load_settings(write(tmp_path, GOOD), environ=env).scrape.commit_linger == 0.0
    with pytest.raises(ConfigError, match="interval"):
        load_settings(write(tmp_path, GOOD.replace("interval: 15s", f"interval: {zero!r}")), environ={})
    with pytest.raises(ConfigError, match="commit_linger"):
        negative = GOOD.replace("  timeout: 5s\n", "  timeout: 5s\n  commit_linger: -1s\n")
        load_settings(write(tmp_path, negative), environ={})


def test_format_duration() -> None:
    assert [format_duration(x) for x in (60, 300, 3600, 90, 0.5)] == ["1m", "5m", "1h", "90s", "0.5s"]


def test_the_example_configuration_is_valid() -> None:
    root = Path(__file__).resolve().parents[2]
    s = load_settings(root / "examples" / "llmslo.yaml", environ={})
    assert [t.name for t in s.targets] == ["vllm-chat-0", "vllm-batch-0", "gpu-node-0-dcgm"]
    assert s.traces.classification[0].business_type == "code_completion"
    assert [d.name for d in s.deployments] == ["chat-pool", "batch-pool"]
    assert s.deployments[1].hourly_gpu_price == pytest.approx(98.32 / 8)


def test_a_bad_classification_regex_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(
            write(tmp_path, "traces:\n  classification:\n    - {attribute: model, pattern: '(x'}\n"), environ={}
        )
    assert "traces.classification[0].pattern: invalid regular expression '(x'" in info.value.problems[0]

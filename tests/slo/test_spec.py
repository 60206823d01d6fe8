from __future__ import annotations

from pathlib import Path

import pytest

from collector.cli import main
from collector.slo.spec import RulesError, load_rules

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str, name: str = "r.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


MINIMAL = """\
version: v1
business_types:
  chat:
    models: ["chat-model"]
    objectives:
      - {name: ttft, sli: latency, metric: ttft, threshold: 1s, objective: 0.95}
      - {name: errors, sli: error_ratio, objective: 0.99}
"""


def test_shipped_defaults_pass_with_warnings_only_for_off_bucket_thresholds() -> None:
    loaded = load_rules(ROOT / "rules")
    names = {o.slo for o in loaded.rules.objectives}
    assert {
        "chat-ttft",
        "chat-tpot",
        "chat-errors",
        "customer-service-ttft",
        "code-completion-ttft",
        "batch-throughput",
        "batch-errors",
    } <= names
    text = "\n".join(loaded.warnings)
    assert "threshold 0.066s is not a bucket bound of vllm:request_time_per_output_token_seconds" in text
    assert "threshold 2s is not a bucket bound of vllm:time_to_first_token_seconds" in text
    assert "Only traces measure it exactly" in text
    assert "batch.objectives[2]: needs the cost model" in text
    assert len(loaded.warnings) == 3


def test_packaged_default_rules_match_rules_dir() -> None:
    assert (ROOT / "collector" / "data" / "default-rules.yaml").read_text() == (
        ROOT / "rules" / "default.yaml"
    ).read_text()


def test_the_workbook_table_is_data() -> None:
    rules = load_rules(ROOT / "rules").rules
    assert [(p.severity, p.long_seconds, p.short_seconds, p.factor) for p in rules.pairs] == [
        ("page", 3600, 300, 14.4),
        ("page", 21600, 1800, 6.0),
        ("ticket", 86400, 7200, 3.0),
        ("ticket", 259200, 21600, 1.0),
    ]


@pytest.mark.parametrize(
    ("mutation", "fragment"),
    [
        (lambda t: t.replace("version: v1", "version: v2"), "version: Input should be 'v1'"),
        (lambda t: t + "colour: blue\n", "colour: unknown key"),
        (lambda t: t.replace("threshold: 1s", "threshold: 0"), "objectives[0].threshold: duration must be positive"),
        (lambda t: t.replace("threshold: 1s", "threshold: -2s"), "objectives[0].threshold"),
        (lambda t: t.replace("objective: 0.95", "objective: 1.5"), "objectives[0].objective"),
        (lambda t: t.replace("objective: 0.99", "objective: 0"), "objectives[1].objective"),
        (lambda t: t.replace('models: ["chat-model"]', 'models: ["chat-(model"]'), "invalid regular expression"),
        (
            lambda t: t.replace("sli: latency, metric: ttft, threshold: 1s,", "sli: latency,"),
            "a latency SLI needs `metric` and `threshold`",
        ),
    ],
)
def test_bad_rules_are_reported_with_file_line_and_key(tmp_path: Path, mutation, fragment: str) -> None:  # type: ignore[no-untyped-def]
    path = write(tmp_path, mutation(MINIMAL))
    with pytest.raises(RulesError) as info:
        load_rules(path)
    text = "\n".join(info.value.problems)
    assert fragment in text
    assert all(p.startswith(str(path)) for p in info.value.problems)
    assert any(f"{path}:" in p and p.split(":")[1].strip().isdigit() for p in info.value.problems)


def test_overlapping_business_type_matchers_are_refused(tmp_path: Path) -> None:
    text = (
        MINIMAL
        + """\
  support:
    models: ["chat-model", "support-.*"]
    objectives:
      - {name: errors, sli: error_ratio, objective: 0.99}
"""
    )
    with pytest.raises(RulesError) as info:
        load_rules(write(tmp_path, text))
    assert "business_types.support.models: 'chat-model' overlaps 'chat-model'" in "\n".join(info.value.problems)


def test_business_types_repeated_across_files(tmp_path: Path) -> None:
    write(tmp_path, MINIMAL, "a.yaml")
    write(tmp_path, MINIMAL.replace("chat-model", "other"), "b.yaml")
    with pytest.raises(RulesError) as info:
        load_rules(tmp_path)
    assert "business_types.chat: also defined in" in "\n".join(info.value.problems)


def test_check_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(ROOT / "rules")]) == 0
    out = capsys.readouterr().out
    assert "OK: 4 business type(s)" in out and "warning:" in out
    bad = write(tmp_path, MINIMAL.replace("objective: 0.95", "objective: 2") + "extra: 1\n")
    assert main(["check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "2 problem(s)" in err and "extra: unknown key" in err

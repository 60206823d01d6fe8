"""Schemathesis against /openapi.json of a running llmslo serve (real HTTP on loopback, with
targets and traces in it): no 5xx for any generated request, responses match the schema."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from collector.api.app import create_app
from collector.config import Settings
from collector.runtime import Runtime
from tests.embedded import serving
from tests.real_vllm.conftest import free_port
from tests.targets import Behaviour, target_server, vllm_body


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    tmp = tmp_path_factory.mktemp("schemathesis")
    root = Path(__file__).resolve().parents[2]
    with target_server({"/metrics": Behaviour(vllm_body(lambda: 1))}) as srv:
        cfg = Settings.model_validate(
            {
                "data_dir": str(tmp),
                "rules": str(root / "rules"),
                "targets": [{"name": "chat-0", "url": srv.url("/metrics"), "business_type": "chat"}],
                "scrape": {"interval": 1, "timeout": 1},
            }
        )
        port = free_port()
        with serving(create_app(cfg, Runtime(cfg)), port):
            time.sleep(2)  # a couple of scrapes and an evaluation
            yield schemathesis.openapi.from_url(f"http://127.0.0.1:{port}/openapi.json")


def test_no_5xx_and_responses_match_the_schema(api_schema) -> None:  # type: ignore[no-untyped-def]
    """Every operation of the schema, with generated parameters and bodies (schemathesis' own
    checks: no server error, status codes, content types and bodies as the schema says)."""
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/api/v1/serving", "/api/v1/targets", "/api/v1/slos", "/metrics"}
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
        def check(case) -> None:  # type: ignore[no-untyped-def]
            # OTLP bodies are opaque protobuf/JSON to the schema: a "schema-valid" random body is
            # rightly refused with 400; every other check applies
            excluded = [positive_data_acceptance] if case.operation.path == "/v1/traces" else []
            case.call_and_validate(excluded_checks=excluded)

        check()

"""Per-target limits: a target exposing far more than a vLLM server does (100,000 model names)
is refused whole and quickly, with a clear reason, while the other targets go on."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from collector import conventions as conv
from collector.config import Settings
from collector.runtime import Runtime
from tests.targets import Behaviour, target_server, vllm_body


def many_models(n: int) -> bytes:
    lines = ["# TYPE vllm:num_requests_running gauge"]
    lines += [f'vllm:num_requests_running{{model_name="lora-{i:06d}"}} 1' for i in range(n)]
    return ("\n".join(lines) + "\n").encode()


def test_a_hostile_target_is_refused_whole_and_quickly_while_the_others_go_on(tmp_path: Path) -> None:
    hostile = many_models(120_000)  # 120,000 samples of as many models, about 7 MB
    routes = {
        "/ok": Behaviour(vllm_body(lambda: 1)),
        "/hostile": Behaviour(lambda: hostile),
        "/many-models": Behaviour(lambda: many_models(300)),
        "/long-name": Behaviour(lambda: many_models(1).replace(b"lora-000000", b"m" * 600)),
    }
    with target_server(routes) as srv:
        settings = Settings.model_validate(
            {
                "data_dir": str(tmp_path),
                "scrape": {"interval": 5, "timeout": 5},
                "targets": [
                    {"name": "ok", "url": srv.url("/ok"), "business_type": "chat"},
                    {"name": "hostile", "url": srv.url("/hostile")},
                    {"name": "many-models", "url": srv.url("/many-models")},
                    {"name": "allowed", "url": srv.url("/many-models"), "model_limit": 1000},
                    {"name": "long-name", "url": srv.url("/long-name")},
                ],
            }
        )
        rt = Runtime(settings)

        async def run() -> float:
            await rt.start()
            started = time.perf_counter()
            await rt.scrape_all_once()
            return time.perf_counter() - started

        elapsed = asyncio.run(run())
    st = {name: s.status for name, s in rt.scrapers.items()}
    assert st["ok"].up and st["allowed"].up
    assert st["hostile"].up is False and st["hostile"].last_error_reason == conv.REASON_SAMPLE_LIMIT
    assert "more than 100000 samples" in (st["hostile"].last_error or "")
    assert st["many-models"].up is False and st["many-models"].last_error_reason == conv.REASON_MODEL_LIMIT
    assert "300 distinct model_name values" in (st["many-models"].last_error or "")
    # a model name longer than the database keeps (PostgreSQL would refuse it on every scrape)
    assert st["long-name"].up is False and st["long-name"].last_error_reason == conv.REASON_LABEL_LIMIT
    assert "model_name value of 600 characters" in (st["long-name"].last_error or "")
    # nothing of a refused scrape is stored; the refusal is cheap
    assert rt.store.target_names() == ["allowed", "hostile", "long-name", "many-models", "ok"]
    stored = {sc.target for sc in rt.store.read_window(0, int(time.time()) + 120)}
    assert stored == {"ok", "allowed"}
    assert elapsed < 5.0
    asyncio.run(rt.close())

"""The cost and memory formulas against the seeds' worked examples and hand-computed values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collector.cost.arch import ArchError, arch_from_config, read_arch
from collector.cost.formulas import GIB, ApiPrices, break_even_requests, memory_fit, prompt_cache_savings, remedies

LLAMA2_70B = {
    "model_type": "llama",
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "hidden_size": 8192,
    "torch_dtype": "float16",
}


def test_llama2_70b_kv_per_token_and_the_seeds_40_gb_at_4096_x_32() -> None:
    arch = arch_from_config(LLAMA2_70B)
    assert arch.kv_bytes_per_token() == 2 * 80 * 8 * 128 * 2 == 327_680  # "~0.31 MB/token"
    assert arch.kv_bytes_per_token() / 2**20 == pytest.approx(0.3125)
    total = arch.kv_bytes_per_sequence(4096) * 32
    assert total / GIB == pytest.approx(40.0)  # "4096 context x 32 concurrency ~ 40 GB"
    # tensor parallel 8: one KV head per GPU
    assert arch.kv_bytes_per_token(8) == 40_960


def test_defaults_nesting_and_exceptions_of_config_json() -> None:
    # no num_key_value_heads: as many as attention heads; head_dim from hidden / heads
    mha = arch_from_config({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "dtype": "bfloat16"})
    assert (mha.kv_heads, mha.head_dim) == (4, 16)
    # an explicit head_dim wins (Gemma)
    assert arch_from_config({**LLAMA2_70B, "head_dim": 256}).head_dim == 256
    # multimodal: under text_config
    assert arch_from_config({"model_type": "llava", "text_config": LLAMA2_70B}).kv_bytes_per_token() == 327_680
    # fp8 KV cache halves it
    assert arch_from_config(LLAMA2_70B, kv_cache_dtype="fp8").kv_bytes_per_token() == 163_840
    # DeepSeek-V3 MLA: 61 x (512 + 64) x 2 bytes, no factor 2, same on every TP rank
    ds = arch_from_config(
        {
            "num_hidden_layers": 61,
            "num_attention_heads": 128,
            "hidden_size": 7168,
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
            "torch_dtype": "bfloat16",
        }
    )
    assert ds.kv_bytes_per_token() == 70_272 == ds.kv_bytes_per_token(8)
    # Mistral-7B v0.1: every layer keeps 4096 tokens at most
    mistral = arch_from_config(
        {
            "model_type": "mistral",
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "hidden_size": 4096,
            "sliding_window": 4096,
            "torch_dtype": "bfloat16",
        }
    )
    assert mistral.kv_bytes_per_sequence(32_000) == mistral.kv_bytes_per_sequence(4096) == 131_072 * 4096
    # Qwen2 ignores sliding_window unless use_sliding_window
    qwen = arch_from_config(
        {
            "model_type": "qwen2",
            "num_hidden_layers": 28,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "hidden_size": 3584,
            "sliding_window": 4096,
            "use_sliding_window": False,
            "torch_dtype": "bfloat16",
        }
    )
    assert qwen.kv_bytes_per_token() == 57_344 and qwen.kv_bytes_per_sequence(10_000) == 57_344 * 10_000
    # interleaved local/global layers: only the full ones grow past the window
    gemma = arch_from_config(
        {
            "num_hidden_layers": 4,
            "num_attention_heads": 8,
            "num_key_value_heads": 1,
            "head_dim": 256,
            "hidden_size": 2048,
            "sliding_window": 100,
            "torch_dtype": "bfloat16",
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        }
    )
    per_layer = 2 * 256 * 2
    assert gemma.kv_bytes_per_sequence(1000) == per_layer * (2 * 1000 + 2 * 100)
    # hybrid: linear-attention layers hold no per-token KV
    hybrid = arch_from_config(
        {
            "num_hidden_layers": 4,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "hidden_size": 512,
            "torch_dtype": "bfloat16",
            "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        }
    )
    assert hybrid.kv_bytes_per_token() == 2 * 2 * 64 * 2


def test_a_bad_config_names_the_file_and_field(tmp_path: Path) -> None:
    with pytest.raises(ArchError, match="num_hidden_layers: missing"):
        arch_from_config({"num_attention_heads": 4, "hidden_size": 64})
    with pytest.raises(ArchError, match="num_attention_heads: expected a positive integer"):
        arch_from_config({"num_hidden_layers": 2, "num_attention_heads": "four", "hidden_size": 64})
    with pytest.raises(ArchError, match="unknown dtype 'float12'"):
        arch_from_config({**LLAMA2_70B, "torch_dtype": "float12"})
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ArchError, match=str(bad)):
        read_arch(tmp_path)
    with pytest.raises(ArchError, match="cannot read"):
        read_arch(tmp_path / "missing.json")


def test_weights_from_the_checkpoint_index_or_parameters(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA2_70B))
    assert read_arch(tmp_path, parameters=70e9).weight_bytes() == 140e9  # fp16: 2 bytes/parameter
    assert read_arch(tmp_path, parameters=70e9).weight_bytes(0.5) == 35e9  # INT4 (the seeds' table)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 137_953_296_384}}))
    assert read_arch(tmp_path).weight_bytes() == 137_953_296_384


def test_memory_fit_max_concurrency_and_remedies() -> None:
    arch = arch_from_config(LLAMA2_70B, parameters=70e9)
    # 70B fp16 on 4 x L40S (48 GiB) at 0.9: 35 GB of weights per GPU + KV of 32 x 4096 over 4 GPUs
    fit = memory_fit(arch, 48 * GIB, 0.9, 4, 32, 4096, headroom=1.2)
    kv_per_gpu = 81_920 * 4096 * 32
    assert fit.kv_bytes == kv_per_gpu
    assert fit.needed_bytes == pytest.approx((35e9 + kv_per_gpu) * 1.2)
    assert fit.fits is False
    assert fit.max_concurrency == int((48 * GIB * 0.9 / 1.2 - 35e9) // (81_920 * 4096)) == 10
    advice = remedies(fit, arch, 4)
    assert any("--max-num-seqs" in a for a in advice) and any("fp8" in a for a in advice)
    # on 2 x 80 GiB the weights alone (70 GB per GPU, x 1.2) do not fit: no concurrency at all
    assert memory_fit(arch, 80 * GIB, 0.9, 2, 32, 4096).max_concurrency == 0
    roomy = memory_fit(arch, 80 * GIB, 0.9, 8, 32, 4096, headroom=1.2)
    assert roomy.fits is True and remedies(roomy, arch, 8) == []
    # no weights known: the check cannot decide
    assert memory_fit(arch_from_config(LLAMA2_70B), 80 * GIB, 0.9, 8, 32, 4096).fits is None


def test_the_seeds_prompt_caching_example() -> None:
    # 1M requests x 1000-token system prompt x $0.01/1K = $10,000/day; 90 % hits at $0.001/1K: $1,900/day
    prices = ApiPrices(input=10.0, output=0.0, cached_input=1.0)  # per million tokens
    saved = prompt_cache_savings(1_000_000, 1000, 0.9, prices)
    assert saved.without_cache == pytest.approx(10_000.0)
    assert saved.with_cache == pytest.approx(1_900.0)
    assert round(saved.saved_share * 100) == 81


def test_the_seeds_managed_api_example_and_break_even() -> None:
    # 100K requests/day, 1000 in + 300 out, $0.004/M in, $0.016/M out: $0.88/day
    prices = ApiPrices(input=0.004, output=0.016)
    per_request = prices.cost(1000, 0, 300)
    assert 100_000 * per_request == pytest.approx(0.88)
    # a GPU at $2/h is $48/day: the API is cheaper below 48 / per_request requests a day
    assert break_even_requests(48.0, per_request) == pytest.approx(48.0 / 8.8e-6)
    assert break_even_requests(48.0, 0.0) is None

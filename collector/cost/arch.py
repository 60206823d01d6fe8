"""A model's memory geometry from its Hugging Face `config.json`: KV-cache bytes per token and
weight bytes, the two terms of the seeds' memory formula.

    KV bytes per token = 2 x layers x kv_heads x head_dim x dtype bytes        (K and V)
    weights            = parameters x bytes per parameter  (or the checkpoint's own total size)

The field rules follow transformers' configuration classes and vLLM 0.32
(shared/reference/gpu-capacity-cost.md section 3): `num_key_value_heads` defaults to
`num_attention_heads`; `head_dim` to hidden_size / heads; multimodal configs nest the language
model under `text_config`; MLA models (DeepSeek-V2/V3) keep one latent of `kv_lora_rank +
qk_rope_head_dim` per layer, no factor 2, not sharded by tensor parallelism; sliding-window
layers hold at most `sliding_window` tokens per sequence; linear-attention and Mamba layers hold
no per-token KV at all.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DTYPE_BYTES = {
    "float32": 4.0,
    "float": 4.0,
    "float16": 2.0,
    "half": 2.0,
    "bfloat16": 2.0,
    "fp8": 1.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
    "float8_e4m3fn": 1.0,
    "int8": 1.0,
    "int4": 0.5,
}


class ArchError(ValueError):
    """A config.json llmslo cannot read a geometry from (the message names the file and field)."""


@dataclass(frozen=True, slots=True)
class ModelArch:
    layers: int  # layers holding per-token KV (attention layers)
    kv_heads: int
    head_dim: int
    kv_dtype_bytes: float
    dtype_bytes: float = 2.0  # of the weights (the config's dtype)
    mla_dim: int | None = None  # kv_lora_rank + qk_rope_head_dim (MLA: one latent per layer)
    window_layers: int = 0  # of `layers`, how many keep only the last `sliding_window` tokens
    sliding_window: int | None = None
    parameters: float | None = None  # when known (inventory or config)
    weights_bytes: float | None = None  # from model.safetensors.index.json when beside config.json

    def kv_bytes_per_token(self, tensor_parallel: int = 1) -> float:
        """Bytes of KV cache one token of context takes on one GPU (every layer counted, as for
        a context no longer than the sliding window)."""
        return self.kv_bytes_per_token_per_layer(tensor_parallel) * self.layers

    def kv_bytes_per_token_per_layer(self, tensor_parallel: int = 1) -> float:
        if self.mla_dim is not None:
            return self.mla_dim * self.kv_dtype_bytes  # the full latent on every rank
        heads = max(1, self.kv_heads // max(1, tensor_parallel))  # replicated when tp > kv heads
        return 2.0 * heads * self.head_dim * self.kv_dtype_bytes

    def kv_bytes_per_sequence(self, context_tokens: float, tensor_parallel: int = 1) -> float:
        """KV bytes one sequence of `context_tokens` holds on one GPU (windowed layers capped)."""
        per_layer = self.kv_bytes_per_token_per_layer(tensor_parallel)
        full = self.layers - self.window_layers
        capped = min(context_tokens, self.sliding_window) if self.sliding_window else context_tokens
        return per_layer * (full * context_tokens + self.window_layers * capped)

    def weight_bytes(self, bytes_per_parameter: float | None = None) -> float | None:
        """The checkpoint's size when known, else parameters x bytes per parameter."""
        if self.weights_bytes is not None and bytes_per_parameter is None:
            return self.weights_bytes
        if self.parameters is None:
            return self.weights_bytes
        return self.parameters * (bytes_per_parameter if bytes_per_parameter is not None else self.dtype_bytes)


def _int(config: dict[str, Any], where: str, *names: str) -> int | None:
    for name in names:
        value = config.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0 or value != int(value):
            raise ArchError(f"{where}: {name}: expected a positive integer, got {value!r}")
        return int(value)
    return None


def arch_from_config(
    config: dict[str, Any],
    where: str = "config.json",
    kv_cache_dtype: str | None = None,
    parameters: float | None = None,
    weights_bytes: float | None = None,
) -> ModelArch:
    """The geometry of a parsed config.json. `kv_cache_dtype` is vLLM's --kv-cache-dtype
    (`auto` = the model's dtype)."""
    if isinstance(config.get("text_config"), dict):
        config = {**config, **config["text_config"]}
    layers = _int(config, where, "num_hidden_layers", "n_layer", "num_layers")
    heads = _int(config, where, "num_attention_heads", "n_head")
    if layers is None:
        raise ArchError(f"{where}: num_hidden_layers: missing (needed for the KV cache size)")
    if heads is None:
        raise ArchError(f"{where}: num_attention_heads: missing (needed for the KV cache size)")
    kv_heads = _int(config, where, "num_key_value_heads", "n_head_kv", "num_kv_heads", "multi_query_group_num") or heads
    head_dim = _int(config, where, "head_dim")
    if head_dim is None:
        hidden = _int(config, where, "hidden_size", "n_embd")
        if hidden is None:
            raise ArchError(f"{where}: hidden_size: missing, and no head_dim")
        head_dim = hidden // heads
    model_dtype = str(config.get("dtype") or config.get("torch_dtype") or "bfloat16")
    if model_dtype not in DTYPE_BYTES:
        raise ArchError(f"{where}: dtype: unknown dtype {model_dtype!r} (known: {', '.join(sorted(DTYPE_BYTES))})")
    dtype_name = kv_cache_dtype if kv_cache_dtype and kv_cache_dtype != "auto" else model_dtype
    if dtype_name not in DTYPE_BYTES:
        raise ArchError(f"kv_cache_dtype: unknown dtype {dtype_name!r} (known: {', '.join(sorted(DTYPE_BYTES))})")
    mla: int | None = None
    if config.get("kv_lora_rank"):
        rope = _int(config, where, "qk_rope_head_dim") or 0
        mla = int(config["kv_lora_rank"]) + rope
    # which layers hold per-token KV, and which of them only a window
    attention_layers = layers
    window_layers = 0
    window = _int(config, where, "sliding_window")
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        attention_layers = sum(1 for t in layer_types if t in ("full_attention", "sliding_attention", "attention"))
        window_layers = sum(1 for t in layer_types if t == "sliding_attention")
    elif config.get("model_type") == "jamba":
        period = _int(config, where, "attn_layer_period") or 8
        offset = config.get("attn_layer_offset", 4)
        attention_layers = sum(1 for i in range(layers) if i % period == offset)
    elif window and (config.get("model_type") != "qwen2" or config.get("use_sliding_window")):
        window_layers = layers  # Mistral-style: every layer keeps the last `sliding_window` tokens
    if not window:
        window_layers = 0
    total_params = parameters
    if total_params is None and isinstance(config.get("num_parameters"), int | float):
        total_params = float(config["num_parameters"])
    return ModelArch(
        layers=attention_layers,
        kv_heads=1 if mla else kv_heads,
        head_dim=head_dim,
        kv_dtype_bytes=DTYPE_BYTES[dtype_name],
        dtype_bytes=DTYPE_BYTES[model_dtype],
        mla_dim=mla,
        window_layers=window_layers,
        sliding_window=window if window_layers else None,
        parameters=total_params,
        weights_bytes=weights_bytes,
    )


def read_arch(path: str | Path, kv_cache_dtype: str | None = None, parameters: float | None = None) -> ModelArch:
    """Read a config.json (a file, or a model directory holding one). The checkpoint's
    `model.safetensors.index.json` beside it, when present, gives the weights' exact size
    (`metadata.total_size`, bytes, quantisation scales included)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        config = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ArchError(f"{p}: cannot read: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArchError(f"{p}: not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ArchError(f"{p}: expected a JSON object")
    weights = None
    index = p.parent / "model.safetensors.index.json"
    if index.is_file():
        try:
            total = json.loads(index.read_text(encoding="utf-8")).get("metadata", {}).get("total_size")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ArchError(f"{index}: not JSON: {exc}") from None
        if isinstance(total, int | float) and math.isfinite(total) and total > 0:
            weights = float(total)
    return arch_from_config(config, str(p), kv_cache_dtype, parameters, weights)

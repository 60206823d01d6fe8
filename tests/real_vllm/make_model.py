"""Create a tiny random Llama with a freshly trained tokenizer, for a real vLLM server on CPU.

Run with the vLLM environment's Python (it has transformers and tokenizers):
    python make_model.py OUT_DIR
No weights are downloaded: the model is random and the BPE tokenizer is trained here.
"""

from __future__ import annotations

import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "latency",
    "token",
    "cache",
    "prefix",
    "server",
    "request",
    "model",
    "answer",
    "question",
    "customer",
    "service",
    "code",
    "completion",
    "batch",
    "summary",
    "system",
    "prompt",
    "user",
    "assistant",
    "alpha",
    "beta",
    "gamma",
    "delta",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
]


def corpus() -> list[str]:
    lines = []
    for i in range(2000):
        lines.append(" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(12)))
    return lines


def main(out: Path, layers: int = 2, heads: int = 2) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    special = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=512, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus(), trainer)
    from tokenizers import decoders

    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 1024

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=64 * heads,  # head_dim 64: vLLM's CPU attention rejects head_dim 16
        intermediate_size=128 * heads * (4 if heads > 2 else 1),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=1024,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    fast.save_pretrained(out)


if __name__ == "__main__":
    # optional: layers and attention heads (a larger, slower model for overload tests)
    main(Path(sys.argv[1]), *(int(x) for x in sys.argv[2:4]))

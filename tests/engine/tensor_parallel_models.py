"""The models and engine settings the tensor-parallel tests share."""

from __future__ import annotations

import random
from pathlib import Path

from loraplex.engine import LLM

TP = 2
# A small KV cache and token budget: prompts are prefilled in chunks and requests preempted.
SMALL = {"num_kv_blocks": 14, "block_size": 4, "max_num_batched_tokens": 7}
# Llama with one KV head (replicated on both ranks) and a vocabulary that does not divide by
# 2 (the last vocab shard is padded); Qwen2 with q/k/v biases, 2 KV heads, tied embeddings.
MODELS = {
    "llama-mqa": ("llama", {"num_heads": 4, "num_kv_heads": 1, "vocab_size": 501}),
    "qwen2-bias-tied": ("qwen2", {"num_kv_heads": 2, "tie_word_embeddings": True}),
}
PREEMPTION = {"llama-mqa": "swap", "qwen2-bias-tied": "recompute"}


def make_prompts() -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(5, 400) for _ in range(n)] for n in (3, 17, 40, 9, 1, 26)]


def make_llm(checkpoint: Path, tensor_parallel_size: int, **kwargs: object) -> LLM:
    """The base model alone (adapters under TP: test_tensor_parallel_lora.py)."""
    return LLM(
        str(checkpoint),
        device="cpu",
        dtype="float32",
        enable_lora=False,
        tensor_parallel_size=tensor_parallel_size,
        **kwargs,
    )

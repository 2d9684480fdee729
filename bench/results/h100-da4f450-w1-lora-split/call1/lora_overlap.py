"""kernels_bench's LoRA-per-layer table with the side-stream shrink up to 64 tokens (the
engine's OVERLAP_MAX_TOKENS) against up to 256 and always (run from the repo root)."""

import sys

import torch

import loraplex.engine.lora.lora_batch as lora_batch

sys.path.insert(0, "bench")
import kernels_bench as kb  # noqa: E402

torch.manual_seed(0)
kb.MAX_LORA_RANKS = (16,)
kb.LORA_TOKENS = (64, 256, 512, 2048)
pool = kb.create_adapter_pool(kb.DTYPE, kb.DEVICE)
for limit in (64, 256, 1 << 30, 64):
    lora_batch.OVERLAP_MAX_TOKENS = limit
    print(f"--- OVERLAP_MAX_TOKENS = {limit}")
    kb.time_lora(pool)

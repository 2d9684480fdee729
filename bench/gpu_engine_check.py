"""Engine correctness on CUDA: greedy outputs equal HF (+PEFT) with the Triton kernels.

Runs the tiny random Llama and Qwen2 checkpoints in float32 on the GPU, with mixed-adapter
batches, chunked prefill and forced preemption; prints PASS/FAIL per case. Usage:
    python bench/gpu_engine_check.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from loraplex.engine import LLM, LoRARequest, SamplingParams  # noqa: E402
from loraplex.platform.demo.tiny_checkpoint import write_random_checkpoint  # noqa: E402
from tests.engine.hf_reference import hf_greedy_on  # noqa: E402
from tests.engine.lora_adapters import write_peft_adapter  # noqa: E402

CASES = {
    "default": {},
    "chunked": {"max_num_batched_tokens": 7, "block_size": 16},
    "preempt-swap": {
        "num_kv_blocks": 10,
        "block_size": 16,
        "preemption_mode": "swap",
        "max_num_batched_tokens": 64,
    },
    "preempt-recompute": {
        "num_kv_blocks": 10,
        "block_size": 16,
        "max_num_batched_tokens": 64,
        "preemption_mode": "recompute",
    },
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    rng = random.Random(0)
    results = {}
    ok_all = True
    for arch in ("llama", "qwen2"):
        base = write_random_checkpoint(
            tmp / arch, arch, hidden_size=128, num_heads=4, num_kv_heads=2, head_dim=32
        )
        adapters = {
            f"a{r}": write_peft_adapter(base, tmp / f"{arch}-a{r}", r, mods, seed=r)
            for r, mods in (
                (4, ["q_proj", "v_proj"]),
                (16, ["o_proj", "down_proj"]),
                (64, ["q_proj", "k_proj", "gate_proj", "up_proj"]),
            )
        }
        names = [*adapters, None, *adapters, None]
        prompts = [[rng.randrange(5, 500) for _ in range(rng.randrange(3, 60))] for _ in names]
        expected = hf_greedy_on("cuda", base, prompts, 8, adapters=names, adapter_dirs=adapters)
        ids = {n: i + 1 for i, n in enumerate(adapters)}
        loras = [None if n is None else LoRARequest(n, ids[n], str(adapters[n])) for n in names]
        for case, kwargs in CASES.items():
            llm = LLM(str(base), device="cuda", dtype="float32", max_loras=2, **kwargs)
            outs = llm.generate(
                [{"prompt_token_ids": p} for p in prompts],
                SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
                lora_request=loras,
                use_tqdm=False,
            )
            got = [o.outputs[0].token_ids for o in outs]
            ok = got == expected
            ok_all &= ok
            stats = llm.engine.get_stats()
            results[f"{arch}/{case}"] = {
                "pass": ok,
                "preemptions": stats["num_preemptions"],
                "lora_gpu_evictions": stats.get("lora_gpu_evictions"),
            }
            print(
                f"{arch:6s} {case:18s} {'PASS' if ok else 'FAIL'}  "
                f"preemptions={stats['num_preemptions']} "
                f"lora_evictions={stats.get('lora_gpu_evictions')}",
                flush=True,
            )
            del llm
            torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    sys.exit(0 if ok_all else 1)


if __name__ == "__main__":
    main()

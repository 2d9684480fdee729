"""The engine on CPU with every Triton kernel run by the interpreter, each load and store
bounds-checked (tests/kernels/interpreter_memcheck.py): an FP8 or bf16 base of the `tiny`
shape, 8 adapters of rank 16 on all 7 modules, W1-like steps scaled down.

    PYTHONPATH=.:bench python bench/results/h100-1af5045-agreement-fp8-lora-crash/cpu-memcheck/\
memcheck_engine.py NUM_PROMPTS PROMPT_LEN OUTPUT_LEN TOKENS_PER_STEP {fp8,none}
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton

import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from workload import synthetic_prompts, write_random_adapter, write_shape_checkpoint  # noqa: E402

from loraplex.engine import LLM, LoRARequest, SamplingParams  # noqa: E402
from loraplex.kernels import dispatch, reference  # noqa: E402
from loraplex.kernels import triton as triton_kernels  # noqa: E402
from tests.kernels.interpreter_memcheck import bounds_checked  # noqa: E402


def use_triton_on_cpu() -> None:
    """Dispatch to the Triton kernels for CPU tensors too; ops without one keep the reference."""
    dispatch._use_triton = lambda t: True  # type: ignore[assignment]
    for name in reference.__all__:
        if not hasattr(triton_kernels, name):
            setattr(triton_kernels, name, getattr(reference, name))


def main() -> None:
    num_prompts, prompt_len, output_len, budget = (int(a) for a in sys.argv[1:5])
    quantization = None if sys.argv[5] == "none" else sys.argv[5]
    use_triton_on_cpu()
    tmp = Path(tempfile.mkdtemp())
    model_dir = write_shape_checkpoint("tiny", tmp / "tiny")
    config = json.loads((model_dir / "config.json").read_text())
    prompts = synthetic_prompts(num_prompts, prompt_len, prompt_len, config["vocab_size"])
    adapters = [
        LoRARequest(f"a{i}", i + 1, str(write_random_adapter(tmp / f"a{i}", config, 16, seed=i)))
        for i in range(8)
    ]
    llm = LLM(str(model_dir), device="cpu", dtype="bfloat16", load_format="dummy",
              max_num_seqs=256, max_num_batched_tokens=budget, enable_prefix_caching=False,
              max_lora_rank=16, max_cpu_loras=8, quantization=quantization)  # fmt: skip
    params = SamplingParams(
        max_tokens=output_len, temperature=0.0, ignore_eos=True, detokenize=False
    )
    loras = [adapters[i % 8] for i in range(num_prompts)]
    start = time.time()
    with torch.inference_mode(), bounds_checked():
        outs = llm.generate(
            [{"prompt_token_ids": p} for p in prompts], params, loras, use_tqdm=False
        )
    # A step whose kernel raised fails its requests (the engine lives): they come back short.
    short = [i for i, o in enumerate(outs) if len(o.outputs[0].token_ids) != output_len]
    if short:
        raise SystemExit(f"{len(short)} requests failed (see the log): an access out of bounds?")
    print(f"all {num_prompts} requests finished with {output_len} tokens, no out-of-bounds "
          f"access, {time.time() - start:.0f} s")  # fmt: skip


if __name__ == "__main__":
    main()

"""Host time of one eager forward (a step that no CUDA graph serves: W1's mixed prefill +
decode steps) at the Llama-3-8B shape, with and without 8 adapters: every Triton kernel is
stubbed and every tensor lives on the meta device, so what is timed is the Python and
PyTorch's host calls of the forward as the GPU path makes them (the Triton launchers, the
LoRA batch, cuBLAS calls' dispatch), without the kernels and without Triton's own launch path
(not measurable without a GPU; it comes on top, per launch).

PyTorch's ops on meta tensors run Python meta functions, which cost more than a CUDA op's C++
dispatch: the absolute figures overstate the torch ops' share; compare trees, and the
difference that adapters make (mostly this repo's Python), rather than the totals. Where an FP8
base with adapters is host-paced (bench/results/h100-fa6d785-host-prep-serve-clients), this is
the part of the host's step that the engine's own code decides.

    python bench/eager_step_host_cost.py [--fp8] [--repeats 20] [--profile 25]
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import pkgutil
import pstats
import time

import torch
from launcher_host_cost import ADAPTERS, META, NoLaunch, meta_lora_batch
from workload import SHAPES

import loraplex.kernels.triton as triton_pkg
from loraplex.engine.lora import lora_batch
from loraplex.engine.model.forward_context import AttentionMetadata, ForwardContext
from loraplex.engine.model.hf_config import ModelArchConfig
from loraplex.engine.model.llama import LlamaForCausalLM
from loraplex.engine.model.quant import fp8 as fp8_module
from loraplex.engine.model.quant.quant_config import Fp8Config
from loraplex.kernels import cuda as cuda_kernels
from loraplex.kernels import dispatch

BLOCK_SIZE = 16
# W1's steady mixed step: decodes of the running requests beside prefill chunks.
NUM_DECODES, NUM_PREFILLS, PROMPT_LEN, CONTEXT = 240, 15, 512, 600


def stub_triton() -> int:
    """Every Triton kernel of loraplex.kernels.triton replaced; the dispatchers send meta
    tensors to the Triton launchers. Returns the number of kernels stubbed."""
    import triton

    stubbed = 0
    for info in pkgutil.iter_modules(triton_pkg.__path__):
        module = importlib.import_module(f"{triton_pkg.__name__}.{info.name}")
        for name, value in list(vars(module).items()):
            # Launched kernels are private (`_..._kernel`); public @triton.jit helpers are
            # only called from kernels.
            if isinstance(value, triton.runtime.jit.JITFunction) and name.startswith("_"):
                setattr(module, name, NoLaunch())
                stubbed += 1
    dispatch._use_triton = lambda t: True  # type: ignore[assignment]
    dispatch._triton_serves = lambda device: True  # type: ignore[assignment]
    for name in ("lora_shrink", "lora_expand", "silu_and_mul_lora"):
        setattr(lora_batch, name, getattr(dispatch, name))
    # The FP8 GEMM is cuBLAS on CUDA, not a Triton kernel: its CUDA path (torch._scaled_mm,
    # which has a meta kernel) stands in for the dispatcher's, which takes only CUDA tensors.
    fp8_module.fp8_scaled_mm = cuda_kernels.fp8_scaled_mm
    return stubbed


def mixed_step(arch: ModelArchConfig, num_blocks: int) -> tuple[torch.Tensor, ForwardContext]:
    num_seqs = NUM_DECODES + NUM_PREFILLS
    num_tokens = NUM_DECODES + NUM_PREFILLS * PROMPT_LEN
    max_blocks = -(-max(CONTEXT, PROMPT_LEN) // BLOCK_SIZE)
    attn = AttentionMetadata(
        slot_mapping=torch.empty(num_tokens, dtype=torch.int64, device=META),
        block_tables=torch.empty(num_seqs, max_blocks, dtype=torch.int32, device=META),
        seq_lens=torch.empty(num_seqs, dtype=torch.int32, device=META),
        query_start_loc=torch.empty(num_seqs + 1, dtype=torch.int32, device=META),
        max_query_len=PROMPT_LEN,
        max_seq_len=CONTEXT,
        num_decode_seqs=NUM_DECODES,
    )
    head_dim = arch.hidden_size // arch.num_attention_heads
    kv_shape = (num_blocks, BLOCK_SIZE, arch.num_key_value_heads, head_dim)
    kv_caches = [
        (torch.empty(kv_shape, dtype=torch.bfloat16, device=META),) * 2
        for _ in range(arch.num_hidden_layers)
    ]
    return torch.empty(num_tokens, dtype=torch.int64, device=META), ForwardContext(attn, kv_caches)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--profile", type=int, default=0, help="print the N costliest functions")
    ap.add_argument("--fp8", action="store_true", help="an FP8 base (W8A8) instead of bf16")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"{stub_triton()} Triton kernels stubbed")
    arch = ModelArchConfig.from_dict({**SHAPES["llama3-8b"], "model_type": "llama"})
    model = LlamaForCausalLM(arch, torch.bfloat16, META, quant=Fp8Config() if args.fp8 else None)
    input_ids, ctx = mixed_step(arch, num_blocks=4096)
    positions = torch.empty_like(input_ids)
    print(
        f"step: {NUM_DECODES} decodes + {NUM_PREFILLS} x {PROMPT_LEN}-token prefill chunks "
        f"= {input_ids.shape[0]} tokens, {arch.num_hidden_layers} layers, "
        f"{'an FP8' if args.fp8 else 'a bf16'} base"
    )
    for label, lora in (("no adapters", None), (f"{ADAPTERS} adapters", "lora")):
        ctx.lora = (
            None if lora is None else meta_lora_batch(arch.num_hidden_layers, input_ids.shape[0])
        )
        with torch.inference_mode():
            for _ in range(3):
                model(input_ids, positions, ctx)
            start = time.perf_counter()
            for _ in range(args.repeats):
                model(input_ids, positions, ctx)
            per_step = (time.perf_counter() - start) / args.repeats
            NoLaunch.launches = 0
            model(input_ids, positions, ctx)
            print(
                f"{label:<12} {1e3 * per_step:7.2f} ms per forward, "
                f"{NoLaunch.launches} Triton launches",
                flush=True,
            )
            if args.profile:
                profile = cProfile.Profile()
                profile.runcall(model, input_ids, positions, ctx)
                pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    main()

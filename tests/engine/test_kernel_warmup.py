"""Kernel warm-up at start-up (engine/runner/kernel_warmup.py): its forwards write nothing, and
on CUDA no Triton kernel compiles once the engine serves."""

from __future__ import annotations

import random
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest
import torch
import triton

from loraplex.engine import LLM, LoRARequest, SamplingParams
from loraplex.engine.lora.step_mapping import map_step, slot_table_size
from loraplex.engine.runner.kernel_warmup import idle_lora_mapping, run_warmup_steps
from loraplex.kernels import triton as triton_kernels
from loraplex.kernels import warmup_decode_sizes, warmup_step_shapes
from loraplex.kernels.triton.lora_expand import _lora_expand_kernel
from loraplex.kernels.triton.lora_shrink import _lora_shrink_kernel
from loraplex.kernels.triton.silu_and_mul_lora import _silu_and_mul_lora_kernel
from tests.checkpoints import CheckpointFactory
from tests.engine.lora_adapters import write_peft_adapter
from tests.kernels.lora_inputs import lora_case, make_inputs
from tests.kernels.specialization_keys import recorded_keys


def test_warmup_forwards_leave_the_kv_cache_and_the_adapters_pages_alone(
    checkpoint_factory: CheckpointFactory, tmp_path: Path
) -> None:
    """The warm-up's forwards on CPU (the reference kernels; on CUDA the same forwards run the
    Triton ones), after an adapter took pages in the cache: every byte of the cache, adapter
    pages included, is as it was."""
    base = checkpoint_factory("llama")
    adapter = write_peft_adapter(base, tmp_path / "a", 8, ["q_proj", "down_proj"], seed=1)
    llm = LLM(str(base), device="cpu", num_kv_blocks=64, block_size=16)
    request = LoRARequest("a", 1, str(adapter))
    llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2), lora_request=request, use_tqdm=False)
    engine = llm.engine
    runner = engine.runner
    runner.kv_cache.copy_(torch.randn_like(runner.kv_cache))  # a pattern in every block
    before = runner.kv_cache.clone()
    shapes = [(1, None), (3, None), (40, 8), (70, 16)]
    run_warmup_steps(runner.model, runner.kv_caches, engine.lora_manager, shapes, [1, 5])
    assert torch.equal(runner.kv_cache, before)


def test_no_warmup_where_no_triton_kernel_runs() -> None:
    cpu = torch.device("cpu")
    assert warmup_step_shapes(cpu, 8192, [8, 16]) == []
    assert warmup_decode_sizes(cpu, 256, 8) == []


@pytest.mark.parametrize(("num_tokens", "num_adapters"), [(5, 3), (40, 10), (600, 9)])
def test_a_steps_lora_launches_are_the_warmup_steps_variants(
    num_tokens: int, num_adapters: int
) -> None:
    """The shrink, the expand and the fused SiLU with a step's own mapping (`map_step`) and with
    the warm-up's (no active slot) of the same slot table: the same specialization keys, so the
    warm-up compiled what the step launches (on CPU, Triton's interpreter and its own
    specialization function)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    table = slot_table_size(num_adapters, 256)
    case = lora_case([[8] * table] * 2, [num_tokens] + [0] * (table - 1), 0, 16, (24, 24), 256)
    inputs = make_inputs(case, torch.float32, device)
    hashes = [f"{t % num_adapters}" for t in range(num_tokens)]
    _, mapping = map_step(hashes, [1] * num_tokens, int, 256, device)
    assert mapping is not None
    keys = []
    for sorted_token_ids, slot_start_loc, slot_adapters, num_active_slots in (
        mapping.tensors(),
        idle_lora_mapping(num_tokens, table, device),
    ):
        steps = (slot_adapters, num_active_slots, sorted_token_ids, slot_start_loc)
        lora_out = torch.zeros(inputs.shape, device=device)
        y = torch.zeros(num_tokens, 48, device=device)
        b_tables = (inputs.pages, inputs.page_table, inputs.first_b, inputs.lora_ranks)
        kernels = (_lora_shrink_kernel, _lora_expand_kernel, _silu_and_mul_lora_kernel)
        with ExitStack() as stack:
            recorded = [stack.enter_context(recorded_keys(kernel)) for kernel in kernels]
            a_tables = (inputs.pages, inputs.page_table, inputs.first_a, inputs.lora_ranks)
            triton_kernels.lora_shrink(inputs.x, *a_tables, *steps, lora_out)
            triton_kernels.lora_expand(lora_out, *b_tables, inputs.scalings, *steps, y, 0, (24, 24))
            triton_kernels.silu_and_mul_lora(y, lora_out, *b_tables, inputs.scalings, *steps)
        keys.append(recorded)
    assert all(len(k) == 1 for k in keys[0]) and keys[0] == keys[1]


def compiled_triton_variants() -> int:
    """Kernel variants Triton holds compiled in this process (every device), over loraplex's
    kernels."""
    count = 0
    for name, module in list(sys.modules.items()):
        if name.startswith("loraplex.kernels.triton."):
            for value in vars(module).values():
                if isinstance(value, triton.runtime.jit.JITFunction):
                    # per device: (kernel cache, ...); its first entry maps keys to kernels
                    count += sum(len(entry[0]) for entry in value.device_caches.values())
    return count


@pytest.mark.gpu
def test_steps_of_every_size_and_adapter_count_compile_nothing_after_start_up(
    checkpoint_factory: CheckpointFactory, tmp_path: Path
) -> None:
    """12 adapters (slot tables of 8 and 16), prompts of 3 to 400 tokens: prefill steps past
    every tile row's bound (2,048 tokens and more), mixed steps, decode steps."""
    base = checkpoint_factory("llama")
    names = [f"a{i}" for i in range(12)]
    modules = (["q_proj", "v_proj"], ["o_proj", "down_proj"], ["gate_proj", "up_proj", "k_proj"])
    loras = [
        LoRARequest(n, i + 1, str(write_peft_adapter(base, tmp_path / n, 8, modules[i % 3], i)))
        for i, n in enumerate(names)
    ]
    llm = LLM(str(base), device="cuda", dtype="float32", max_num_seqs=16)
    after_start = compiled_triton_variants()
    assert after_start > 0
    rng = random.Random(3)
    for batch in (loras, loras[:3] + [None] * 5, [None] * 16):
        prompts = [[rng.randrange(5, 500) for _ in range(rng.randrange(3, 400))] for _ in batch]
        params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
        llm.generate(
            [{"prompt_token_ids": p} for p in prompts], params, lora_request=batch,
            use_tqdm=False,
        )  # fmt: skip
    assert compiled_triton_variants() == after_start
    del llm
    torch.cuda.empty_cache()

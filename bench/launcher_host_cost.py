"""Host time of the Triton launchers themselves (checks, grid math, argument lists), without
their kernels: each launcher's `@triton.jit` kernel is replaced by a launch that does nothing, so
what is timed is this repo's Python per launch, at W1's prefill-step shapes (4,096 tokens, the
Llama-3-8B layer, 8 adapters of rank 16). Triton's own launch path comes on top of it on a GPU
(not measurable here); one layer's `LoRABatch` calls (4 projections, 7 launches) time the
engine's own path into them. Also times `LLMEngine.add_request` for 512-token prompts on a tiny
random model (host work the engine loop does between two steps for every request that arrives).

Runs on the CPU with the CPU build of torch; no GPU.

    python bench/launcher_host_cost.py [--repeats 5000]
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from workload import LORA_MODULES, write_random_adapter, write_shape_checkpoint

from loraplex.engine.lora import lora_batch
from loraplex.engine.lora.adapter_pool import AdapterTables
from loraplex.engine.lora.lora_batch import LoRABatch, LoRAWorkspace

TOKENS, HIDDEN, RANK, ADAPTERS = 4096, 4096, 16, 8
QKV_SIZES = (4096, 1024, 1024)


META = torch.device("meta")


class NoLaunch:
    """Stands in for a `@triton.jit` kernel: `kernel[grid](*args)` only counts the launch."""

    launches = 0

    def __getitem__(self, grid: object) -> Callable[..., None]:
        return self._launch

    @staticmethod
    def _launch(*args: object, **kwargs: object) -> None:
        NoLaunch.launches += 1


def meta_lora_batch(num_layers: int, num_tokens: int) -> LoRABatch:
    """A step's LoRABatch on the meta device: ADAPTERS adapters of rank RANK on every module,
    one slot each, for a model of `num_layers` layers of HIDDEN width."""
    pages = torch.empty(num_layers, 256, HIDDEN, dtype=torch.bfloat16, device=META)
    return LoRABatch(
        AdapterTables(pages, ADAPTERS, 64),
        LoRAWorkspace(num_layers, RANK, META),
        sorted_token_ids=torch.empty(num_tokens, dtype=torch.int32, device=META),
        slot_start_loc=torch.empty(ADAPTERS + 1, dtype=torch.int32, device=META),
        slot_adapters=torch.empty(ADAPTERS, dtype=torch.int32, device=META),
        num_active_slots=torch.empty(1, dtype=torch.int32, device=META),
        modules=set(LORA_MODULES),
    )


def stub_kernels() -> dict[str, object]:
    """The launcher modules with their kernels stubbed."""
    modules = {}
    for name, kernel in (
        ("lora_shrink", "_lora_shrink_kernel"),
        ("lora_expand", "_lora_expand_kernel"),
        ("rms_norm", "_rms_norm_kernel"),
        ("silu_and_mul_lora", "_silu_and_mul_lora_kernel"),
    ):
        module = importlib.import_module(f"loraplex.kernels.triton.{name}")
        setattr(module, kernel, NoLaunch())
        modules[name] = module
    return modules


def per_call_us(fn: Callable[[], object], repeats: int) -> float:
    for _ in range(min(100, repeats)):
        fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return 1e6 * (time.perf_counter() - start) / repeats


def launcher_calls() -> dict[str, Callable[[], object]]:
    m = stub_kernels()
    x = torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16)
    pages = torch.zeros(64, HIDDEN, dtype=torch.bfloat16)
    page_table = torch.zeros(ADAPTERS, 8, dtype=torch.int32)
    num_slices = len(QKV_SIZES)
    first_page = torch.zeros(num_slices, ADAPTERS, dtype=torch.int32)
    ranks = torch.full((num_slices, ADAPTERS), RANK, dtype=torch.int32)
    scalings = torch.ones(ADAPTERS, dtype=torch.float32)
    slot_adapters = torch.arange(ADAPTERS, dtype=torch.int32)
    num_active = torch.tensor([ADAPTERS], dtype=torch.int32)
    sorted_ids = torch.arange(TOKENS, dtype=torch.int32)
    slot_start = torch.linspace(0, TOKENS, ADAPTERS + 1).to(torch.int32)
    lora_out = torch.zeros(num_slices, TOKENS, RANK, dtype=torch.float32)
    y = torch.zeros(TOKENS, sum(QKV_SIZES), dtype=torch.bfloat16)
    residual = torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16)
    weight = torch.ones(HIDDEN, dtype=torch.bfloat16)
    mapping = (slot_adapters, num_active, sorted_ids, slot_start)
    return {
        "LoRABatch, one layer": lora_layer_call(m),
        "lora_shrink (q/k/v)": lambda: m["lora_shrink"].lora_shrink(
            x, pages, page_table, first_page, ranks, *mapping, lora_out, zero_out=False
        ),
        "lora_expand (q/k/v)": lambda: m["lora_expand"].lora_expand(
            lora_out, pages, page_table, first_page, ranks, scalings, *mapping, y, 0, QKV_SIZES
        ),
        # Allocates its outputs: on a CPU that costs more than the caching allocator's CUDA
        # blocks would.
        "fused_add_rms_norm": lambda: m["rms_norm"].fused_add_rms_norm(x, residual, weight, 1e-5),
    }


def lora_layer_call(modules: dict[str, object]) -> Callable[[], object]:
    """One decoder layer's LoRA work in an eager prefill step, as the model's projections run
    it: `LoRABatch.begin` / `finish` around q/k/v, o (into the residual), gate/up (into the
    activation) and down (into the residual), with the Triton launchers and stubbed kernels.
    Tensors live on the meta device: no memory is touched, so buffer zeroing costs only its
    host calls, as on a GPU."""
    lora_batch.lora_shrink = modules["lora_shrink"].lora_shrink
    lora_batch.lora_expand = modules["lora_expand"].lora_expand
    lora_batch.silu_and_mul_lora = modules["silu_and_mul_lora"].silu_and_mul_lora
    layers, intermediate = 32, 14336
    batch = meta_lora_batch(layers, TOKENS)
    x = torch.empty(TOKENS, HIDDEN, dtype=torch.bfloat16, device=META)
    x_down = torch.empty(TOKENS, intermediate, dtype=torch.bfloat16, device=META)
    y_qkv = torch.empty(TOKENS, sum(QKV_SIZES), dtype=torch.bfloat16, device=META)
    y_gate_up = torch.empty(TOKENS, 2 * intermediate, dtype=torch.bfloat16, device=META)
    residual = torch.empty(TOKENS, HIDDEN, dtype=torch.bfloat16, device=META)
    layer = iter(range(1 << 62))  # a new layer each call, as a forward walks them

    def one_layer() -> None:
        i = next(layer) % layers
        qkv = batch.begin(i, ("q_proj", "k_proj", "v_proj"), QKV_SIZES, x)
        batch.finish(qkv, y_qkv)
        o = batch.begin(i, ("o_proj",), (HIDDEN,), x, delta_into=residual)
        batch.finish(o, residual)
        gate_up = batch.begin(
            i, ("gate_proj", "up_proj"), (intermediate, intermediate), x, all_slices=True
        )
        assert gate_up is not None
        batch.silu_and_mul(gate_up, y_gate_up)
        down = batch.begin(i, ("down_proj",), (HIDDEN,), x_down, delta_into=residual)
        batch.finish(down, residual)

    return one_layer


def add_request_us(repeats: int) -> float:
    from loraplex.engine.llm import LLM
    from loraplex.engine.request import LoRARequest, SamplingParams

    tmp = Path(tempfile.mkdtemp(prefix="loraplex-host-cost-"))
    model = write_shape_checkpoint("tiny", tmp / "tiny")
    config = json.loads((model / "config.json").read_text())
    adapter = write_random_adapter(tmp / "a0", config, RANK, seed=0, modules=LORA_MODULES)
    llm = LLM(str(model), load_format="dummy", enable_lora=True, enable_prefix_caching=False)
    lora = LoRARequest("a0", 1, str(adapter))
    params = SamplingParams(max_tokens=128, temperature=0.0, ignore_eos=True)
    rng = random.Random(0)
    prompts = [[rng.randrange(config["vocab_size"]) for _ in range(512)] for _ in range(repeats)]
    engine = llm.engine
    engine.add_request("warm", {"prompt_token_ids": prompts[0]}, params, lora)
    engine.abort_request("warm")
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", {"prompt_token_ids": prompt}, params, lora if i % 2 else None)
    return 1e6 * (time.perf_counter() - start) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5000)
    ap.add_argument("--requests", type=int, default=256, help="add_request calls timed")
    args = ap.parse_args()
    torch.set_num_threads(1)
    for name, call in launcher_calls().items():
        print(f"{name:<24} {per_call_us(call, args.repeats):7.1f} us per call", flush=True)
    print(f"{'add_request (512 tokens)':<24} {add_request_us(args.requests):7.1f} us", flush=True)


if __name__ == "__main__":
    main()

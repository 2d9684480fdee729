"""LoRABatch captured in a CUDA graph and replayed with other mappings and other adapters.

As the engine's decode graphs run it (engine/runner/cuda_graph.py): the batch comes from
`LoRAManager.create_graph_batch` over static mapping buffers, every projection of every layer
calls `begin` (the shrink; on the side stream at <= 64 tokens), the base GEMM, then `finish`,
and o_proj's and down_proj's deltas go into a residual stream. After capture the test copies new
mappings into the buffers and loads other adapters into the slots (one into a slot that was
empty at capture), dirties the step workspace (the captured memset must zero it), replays, and
compares every projection with the reference kernels on the new state.

Llama-3-8B projections (two layers), 8 slots (4 in use); all slot storage starts NaN, so only
what `LoRASlots.load` writes may be read.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from loraplex.engine.config import LoRAConfig
from loraplex.engine.lora.adapter import LoRAAdapter, lora_module_shapes
from loraplex.engine.lora.lora_batch import LoRABatch
from loraplex.engine.lora.lora_manager import LoRAManager
from loraplex.engine.lora.lora_slots import LoRASlots
from loraplex.kernels import build_lora_mapping
from loraplex.kernels.reference import lora as reference
from tests.kernels.llama3_shapes import GPU_DTYPES, ROUNDED, assert_close

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
NAN = float("nan")
ALL_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MAX_LORAS = 8  # as the kernel tests: the same compiled kernels serve both
INTO_RESIDUAL = {("o_proj",), ("down_proj",)}  # MergedLinear passes them the residual stream


@dataclass(frozen=True)
class Llama3Layers:
    """Two layers of Llama-3-8B (an `ArchLike`)."""

    model_type: str = "llama"
    hidden_size: int = 4096
    intermediate_size: int = 14336
    num_hidden_layers: int = 2
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128


ARCH = Llama3Layers()
SHAPES = lora_module_shapes(ARCH)


def random_adapter(rank: int, target_modules: tuple[str, ...], seed: int) -> LoRAAdapter:
    """Weights scaled so that each delta is O(1) for O(1) inputs."""
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for layer in range(ARCH.num_hidden_layers):
        for module in target_modules:
            in_dim, out_dim = SHAPES[module]
            a = torch.randn(rank, in_dim, generator=gen) / in_dim**0.5
            b = torch.randn(out_dim, rank, generator=gen) / rank**0.5
            weights[(layer, module)] = (a, b)
    return LoRAAdapter(
        rank=rank,
        lora_alpha=2.0 * rank,
        scaling=0.5 + seed / 4,
        target_modules=target_modules,
        weights=weights,
        content_hash=f"hash-{seed}",
        size_bytes=0,
        base_model_name_or_path=None,
    )


def cycle(num_tokens: int, slots: list[int]) -> torch.Tensor:
    """Token -> slot (-1: no adapter), `slots` repeated over the step."""
    return torch.tensor([slots[t % len(slots)] for t in range(num_tokens)], device=CUDA)


class DecodeProjections:
    """One forward's adaptable projections over static buffers, as MergedLinear runs them."""

    def __init__(self, slots: LoRASlots, num_tokens: int, dtype: torch.dtype) -> None:
        self.slots = slots
        self.x: dict[tuple[str, ...], torch.Tensor] = {}  # [num_tokens, in_dim]
        self.weight: dict[tuple[str, ...], torch.Tensor] = {}  # [out_dim, in_dim]
        # Per (layer, projection): the base GEMM's output y, and for o_proj / down_proj the
        # residual stream their deltas go into (with its value before the step).
        self.y: dict[tuple[int, tuple[str, ...]], torch.Tensor] = {}
        self.residual: dict[tuple[int, tuple[str, ...]], torch.Tensor] = {}
        self.residual_before: dict[tuple[int, tuple[str, ...]], torch.Tensor] = {}
        for names, group in slots.groups.items():
            in_dim, out_dim = group.lora_a.shape[-1], sum(group.slice_sizes)
            self.x[names] = torch.randn(num_tokens, in_dim, device=CUDA).to(dtype)
            weight = torch.randn(out_dim, in_dim, device=CUDA) / in_dim**0.5
            self.weight[names] = weight.to(dtype)
            for layer in range(slots.num_layers):
                key = (layer, names)
                self.y[key] = torch.zeros(num_tokens, out_dim, device=CUDA, dtype=dtype)
                if names in INTO_RESIDUAL:
                    before = torch.randn(num_tokens, out_dim, device=CUDA).to(dtype)
                    self.residual_before[key] = before
                    self.residual[key] = before.clone()

    def reset_residuals(self) -> None:
        for key, before in self.residual_before.items():
            self.residual[key].copy_(before)

    def run(self, batch: LoRABatch) -> None:
        """begin, base GEMM, finish for every projection (o_proj and down_proj pass their
        residual stream as `delta_into`)."""
        for layer in range(self.slots.num_layers):
            for names, group in self.slots.groups.items():
                key = (layer, names)
                x, y, into = self.x[names], self.y[key], self.residual.get(key)
                shrunk = batch.begin(layer, names, group.slice_sizes, x, delta_into=into)
                torch.matmul(x, self.weight[names].T, out=y)
                batch.finish(shrunk, y)

    def check(self, sorted_token_ids: torch.Tensor, slot_start_loc: torch.Tensor) -> None:
        """Every projection's deltas against the reference kernels on the slots' state: in y,
        or in the residual stream (y then holds the base output alone)."""
        for (layer, names), y in self.y.items():
            group = self.slots.groups[names]
            mapping = (sorted_token_ids, slot_start_loc, group.ranks)
            lora_out = torch.zeros(len(names), y.shape[0], self.slots.max_lora_rank, device=CUDA)
            reference.lora_shrink(self.x[names], group.lora_a[layer], *mapping, lora_out)
            base = torch.matmul(self.x[names], self.weight[names].T)
            actual, expected = y, base.clone()
            if names in INTO_RESIDUAL:
                assert_close(y, base, ROUNDED[y.dtype])
                actual, expected = (
                    self.residual[(layer, names)],
                    self.residual_before[(layer, names)].clone(),
                )
            args = (self.slots.scalings, expected, 0, group.slice_sizes)
            reference.lora_expand(lora_out, group.lora_b[layer], *mapping, *args)
            assert_close(actual, expected, ROUNDED[y.dtype])


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("num_tokens", [8, 64, 128])  # side stream up to 64 tokens
def test_lora_batch_graph_replays_new_mappings_and_adapters(
    num_tokens: int, dtype: torch.dtype
) -> None:
    torch.manual_seed(0)
    config = LoRAConfig(max_loras=MAX_LORAS, max_lora_rank=64, max_cpu_loras=MAX_LORAS)
    manager = LoRAManager(config, ARCH, dtype, CUDA)
    slots = manager.slots
    for group in slots.groups.values():
        group.lora_a.fill_(NAN)
        group.lora_b.fill_(NAN)
    slots.scalings.fill_(NAN)
    slots.load(0, random_adapter(16, ALL_MODULES, seed=0))
    slots.load(1, random_adapter(8, ("q_proj", "v_proj", "down_proj"), seed=1))
    slots.load(2, random_adapter(64, ("o_proj", "gate_proj", "up_proj"), seed=2))
    sorted_token_ids = torch.zeros(num_tokens, dtype=torch.int32, device=CUDA)
    slot_start_loc = torch.zeros(MAX_LORAS + 1, dtype=torch.int32, device=CUDA)

    def set_mapping(token_slots: torch.Tensor) -> None:
        ids, loc = build_lora_mapping(token_slots, MAX_LORAS)
        sorted_token_ids.copy_(ids)
        slot_start_loc.copy_(loc)

    set_mapping(cycle(num_tokens, [0, 1, 2, -1]))
    batch = manager.create_graph_batch(sorted_token_ids, slot_start_loc)
    step = DecodeProjections(slots, num_tokens, dtype)
    for _ in range(2):  # warm-up, as CUDAGraphRunner.capture does: Triton compiles
        step.run(batch)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step.run(batch)

    replays = [
        # slot 1 now holds another adapter (rank 32 on other modules); most tokens on slot 2
        (1, random_adapter(32, ("k_proj", "up_proj", "down_proj"), seed=3), [2, 2, 1, 2, -1]),
        # slot 3, empty at capture, gets an adapter; slot 0 alone otherwise
        (3, random_adapter(4, ("q_proj", "o_proj"), seed=4), [3, -1, 0, 3, 3]),
    ]
    for slot, adapter, token_slots in replays:
        slots.load(slot, adapter)
        set_mapping(cycle(num_tokens, token_slots))
        workspace = slots.step_workspace(num_tokens)
        assert workspace is not None
        workspace.fill_(NAN)  # left by a previous step: the captured memset must zero it
        step.reset_residuals()
        graph.replay()
        torch.cuda.synchronize()
        step.check(sorted_token_ids, slot_start_loc)

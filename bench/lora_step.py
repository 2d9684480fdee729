"""The LoRA work of a Llama-3-8B step, for bench/kernels_bench.py (gate_up unfused: see below).

By default 8 adapters of rank 16 on all 7 modules of all 32 layers (an `AdapterMix` sets the
count, the ranks taken in turn and the modules), resident in an AdapterPool over a pages tensor
of exactly the blocks they take (the KV cache's blocks at block_size 16: pages of
2 x 16 x 8 KV heads x 128 = 32768 elements, so every row of A and B^T fits a page). Each
projection of each layer runs as MergedLinear.forward runs it: `LoRABatch.begin` (the shrink; on
the side stream at <= 64 tokens), the base GEMM, `LoRABatch.finish`, with o_proj's and
down_proj's deltas going into the residual stream. The engine's gate_up_proj instead hands its
deltas to the activation (`LoRABatch.silu_and_mul`); here it takes the expand into y, so these
figures leave out the activation (bench/silu_lora_tiles.py times the fused kernel).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Final

import torch

from loraplex.engine.kv_cache import KVCacheManager
from loraplex.engine.lora.adapter import LoRAAdapter, lora_module_shapes
from loraplex.engine.lora.adapter_loader import CpuAdapter
from loraplex.engine.lora.adapter_pool import AdapterPool
from loraplex.engine.lora.lora_batch import LoRABatch, LoRAWorkspace
from loraplex.engine.lora.page_layout import SLICES, plan_layout, stage_adapter
from loraplex.kernels.lora_mapping import build_lora_mapping
from loraplex.kernels.reference import lora as reference

try:
    from loraplex.engine.lora.step_mapping import slot_table_size
except ImportError:  # an engine whose tables always held max_batch_loras slots (h200_run.sh ab)

    def slot_table_size(num_adapters: int, max_batch_loras: int) -> int:
        return max_batch_loras


NUM_LAYERS = 32
NUM_ADAPTERS = 8
# Batch slots, as the engine sizes a step's mapping tables (max_num_seqs 256, no per-step cap):
# the step's adapters fill the first slots, the rest are empty.
MAX_BATCH_LORAS = 256
ADAPTER_RANK = 16
BLOCK_SIZE = 16
GROUPS = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",))
INTO_RESIDUAL = {("o_proj",), ("down_proj",)}  # MergedLinear passes them the residual stream
UPLOAD_TIMEOUT_S = 120.0

Projection = tuple[str, ...]


@dataclass(frozen=True)
class AdapterMix:
    """The adapters of a step: `num_adapters` distinct ones, ranks taken in turn from `ranks`,
    on `modules`; each one's tokens are every num_adapters-th token of the step."""

    num_adapters: int = NUM_ADAPTERS
    ranks: tuple[int, ...] = (ADAPTER_RANK,)
    modules: tuple[str, ...] = SLICES

    def rank(self, i: int) -> int:
        return self.ranks[i % len(self.ranks)]

    @property
    def groups(self) -> tuple[Projection, ...]:
        """The projections (GROUPS) that some module of the mix adapts."""
        return tuple(g for g in GROUPS if set(g) & set(self.modules))

    def weight_bytes(self, dtype: torch.dtype) -> int:
        """Bytes of every adapter's A and B over all layers: what one step must read at least."""
        per_rank = sum(sum(SHAPES[m]) for m in self.modules) * NUM_LAYERS * dtype.itemsize
        return sum(self.rank(i) * per_rank for i in range(self.num_adapters))


EIGHT_RANK_16: Final = AdapterMix()


@dataclass(frozen=True)
class Llama3Arch:
    """Llama-3-8B's shape, as engine/lora/adapter.py's ArchLike."""

    model_type: str = "llama"
    hidden_size: int = 4096
    intermediate_size: int = 14336
    num_hidden_layers: int = NUM_LAYERS
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128


LLAMA3_8B = Llama3Arch()
SHAPES = lora_module_shapes(LLAMA3_8B)  # (in_dim, out_dim) per module
PAGE_SIZE = 2 * BLOCK_SIZE * LLAMA3_8B.num_key_value_heads * LLAMA3_8B.head_dim


def group_slices(names: Projection) -> slice:
    """The projection's rows of the pool's per-slice tables."""
    first = SLICES.index(names[0])
    return slice(first, first + len(names))


def group_sizes(names: Projection) -> tuple[int, ...]:
    return tuple(SHAPES[m][1] for m in names)


def adapter_hash(i: int) -> str:
    return f"bench-adapter-{i}"


def random_adapter(rank: int, modules: tuple[str, ...]) -> LoRAAdapter:
    """`rank` on `modules` of every layer, scaled so that each delta is O(1)."""
    weights = {}
    for layer in range(NUM_LAYERS):
        for module in modules:
            in_dim, out_dim = SHAPES[module]
            a = torch.randn(rank, in_dim) / in_dim**0.5
            b = torch.randn(out_dim, rank) / rank**0.5
            weights[(layer, module)] = (a, b)
    return LoRAAdapter(
        rank=rank,
        lora_alpha=2.0 * rank,
        scaling=1.0,
        target_modules=modules,
        weights=weights,
        content_hash="bench-weights",
        size_bytes=0,
        base_model_name_or_path=None,
    )


def create_adapter_pool(
    dtype: torch.dtype, device: torch.device, mix: AdapterMix = EIGHT_RANK_16
) -> AdapterPool:
    """The mix's adapters uploaded into a pool of exactly the blocks they take, ready. Those of
    one rank share one random adapter's staged pages (packing hundreds of adapters would take
    long) with a scaling each, so every adapter's deltas are its own."""
    layouts = {r: plan_layout(r, mix.modules, SHAPES, PAGE_SIZE) for r in set(mix.ranks)}
    num_blocks = sum(layouts[mix.rank(i)].num_pages for i in range(mix.num_adapters))
    kv = KVCacheManager(num_blocks, BLOCK_SIZE)
    pages = torch.empty((NUM_LAYERS, num_blocks, PAGE_SIZE), dtype=dtype, device=device)
    max_pages = max(layout.num_pages for layout in layouts.values())
    pool = AdapterPool(kv, pages, max_resident=mix.num_adapters, max_pages=max_pages)
    packed = {
        r: stage_adapter(random_adapter(r, mix.modules), layout, NUM_LAYERS, PAGE_SIZE, dtype)
        for r, layout in layouts.items()
    }
    for i in range(mix.num_adapters):
        rank, scaling = mix.rank(i), 0.5 + (i % 8) / 8
        cpu = CpuAdapter(adapter_hash(i), layouts[rank], packed[rank], scaling, load_seconds=0.0)
        assert pool.upload(cpu, keep=())
    deadline = time.monotonic() + UPLOAD_TIMEOUT_S
    while not all(pool.is_ready(adapter_hash(i)) for i in range(mix.num_adapters)):
        assert time.monotonic() < deadline, "adapter uploads did not finish"
        time.sleep(1e-3)
    return pool


def num_slots(num_adapters: int) -> int:
    """Slots in the mapping tables of a step of `num_adapters` adapters, as the engine has them."""
    return slot_table_size(num_adapters, MAX_BATCH_LORAS)


def batch_slot_adapters(pool: AdapterPool, num_adapters: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([num_slots] int32: batch slot s -> the resident id of adapter num_adapters - 1 - s, the
    rest 0; num_active_slots [1] = num_adapters)."""
    ids = [pool.resident_id(adapter_hash(num_adapters - 1 - s)) for s in range(num_adapters)]
    ids += [0] * (num_slots(num_adapters) - num_adapters)
    device = pool.device
    active = torch.tensor([num_adapters], dtype=torch.int32, device=device)
    return torch.tensor(ids, dtype=torch.int32, device=device), active


def create_base_weights(
    dtype: torch.dtype, device: torch.device
) -> list[dict[Projection, torch.Tensor]]:
    """Per layer, each fused projection's weight [out_dim, in_dim] (all layers: GEMMs read HBM)."""
    shapes = {names: (sum(group_sizes(names)), SHAPES[names[0]][0]) for names in GROUPS}
    return [
        {
            names: torch.empty(shape, device=device, dtype=dtype).normal_(0.0, shape[1] ** -0.5)
            for names, shape in shapes.items()
        }
        for _ in range(NUM_LAYERS)
    ]


class LoRAStep:
    """One step of `num_tokens` tokens, round robin over the mix's adapters' batch slots (at
    most one adapter per token: with fewer tokens than adapters, only the first ones run)."""

    def __init__(
        self,
        pool: AdapterPool,
        workspace: LoRAWorkspace,
        num_tokens: int,
        weights: list[dict[Projection, torch.Tensor]],
        mix: AdapterMix = EIGHT_RANK_16,
    ) -> None:
        device, dtype = pool.device, pool.pages.dtype
        self.pool = pool
        self.workspace = workspace
        self.weights = weights
        self.groups = mix.groups
        num_active = min(mix.num_adapters, num_tokens)
        token_slots = torch.arange(num_tokens, device=device) % num_active
        self.sorted_token_ids, self.slot_start_loc = build_lora_mapping(
            token_slots, num_slots(num_active)
        )
        self.slot_adapters, self.num_active_slots = batch_slot_adapters(pool, num_active)
        mapping = (
            self.sorted_token_ids, self.slot_start_loc, self.slot_adapters, self.num_active_slots
        )  # fmt: skip
        self.batch = LoRABatch(pool, workspace, *mapping, set(mix.modules))
        self.x: dict[Projection, torch.Tensor] = {}
        self.y: dict[Projection, torch.Tensor] = {}
        for names in self.groups:
            in_dim, out_dim = SHAPES[names[0]][0], sum(group_sizes(names))
            self.x[names] = torch.randn(num_tokens, in_dim, device=device, dtype=dtype)
            self.y[names] = torch.zeros(num_tokens, out_dim, device=device, dtype=dtype)
        hidden = SHAPES["o_proj"][1]
        self.residual = torch.zeros(num_tokens, hidden, device=device, dtype=dtype)

    def run(self, lora: bool, gemms: bool, num_layers: int | None = None) -> None:
        """The step's projections (of the first `num_layers` layers, default all): base GEMMs,
        LoRA, or both (begin, GEMM, finish)."""
        for layer in range(num_layers or NUM_LAYERS):
            for names in self.groups:
                x, y, sizes = self.x[names], self.y[names], group_sizes(names)
                into = self.residual if names in INTO_RESIDUAL else None
                shrunk = self.batch.begin(layer, names, sizes, x, delta_into=into) if lora else None
                if gemms:
                    torch.matmul(x, self.weights[layer][names].T, out=y)
                if lora:
                    self.batch.finish(shrunk, y)

    def sanity_check(self) -> bool:
        """Layer 0's deltas from y = 0 and residual = 0 against the reference kernels on the
        pool's tables: qkv's and gate_up's in y, o's plus down's in the residual (through a
        bf16 intermediate, so within two bf16 steps of the largest delta)."""
        self.residual.zero_()
        for y in self.y.values():
            y.zero_()
        self.run(lora=True, gemms=False, num_layers=1)
        torch.cuda.synchronize()
        ok = True
        pool = self.pool
        residual = torch.zeros_like(self.residual, dtype=torch.float32)
        mapping = (
            self.slot_adapters, self.num_active_slots, self.sorted_token_ids, self.slot_start_loc
        )  # fmt: skip
        for names in self.groups:
            rows = group_slices(names)
            shape = (len(names), self.x[names].shape[0], self.workspace.max_rank)
            lora_out = torch.zeros(shape, device=residual.device)
            a_tables = (pool.pages[0], pool.page_table, pool.first_a[rows], pool.ranks[rows])
            reference.lora_shrink(self.x[names], *a_tables, *mapping, lora_out)
            expected = torch.zeros_like(self.y[names], dtype=torch.float32)
            b_tables = (pool.pages[0], pool.page_table, pool.first_b[rows], pool.ranks[rows])
            args = (expected, 0, group_sizes(names))
            reference.lora_expand(lora_out, *b_tables, pool.scalings, *mapping, *args)
            if names in INTO_RESIDUAL:
                residual += expected
                expected.zero_()
            ok &= torch.allclose(self.y[names].float(), expected, atol=2e-2, rtol=2e-2)
        return ok and torch.allclose(self.residual.float(), residual, atol=1 / 16, rtol=2e-2)

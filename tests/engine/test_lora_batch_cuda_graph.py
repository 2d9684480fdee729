"""LoRABatch captured in a CUDA graph and replayed with other mappings and other adapters.

As the engine's decode graphs run it (engine/runner/cuda_graph.py): the batch comes from
`LoRAManager.create_graph_batch` over static mapping buffers (sorted_token_ids, slot_start_loc,
slot_adapters, num_active_slots), every projection of every layer calls `begin` (the shrink; on the side stream at
<= 64 tokens), the base GEMM, then `finish`, and o_proj's and down_proj's deltas go into a
residual stream. After capture the test changes the manager's AdapterPool: it evicts an adapter
and uploads another, which takes the evicted one's resident id (its row of the tables), then one
into a row no adapter had at capture; uploads run asynchronously on the pool's copy stream, so it
waits until the pool reports them ready, as the scheduler does. It copies new mappings into the
buffers (batch slots mapped to other resident ids), dirties the step workspace (the captured
memset must zero it), replays, and checks every projection against float64 deltas computed from
the adapters' own weights (rounded to the model's dtype, as the pages hold them).

Llama-3-8B projections (two layers), 8 batch slots; the pages (the KV cache's blocks) start
NaN, so only what the pool uploads may be read.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import pytest
import torch

from loraplex.engine.config import LoRAConfig
from loraplex.engine.kv_cache import KVCacheManager
from loraplex.engine.lora.adapter import LoRAAdapter, lora_module_shapes
from loraplex.engine.lora.adapter_loader import CpuAdapter
from loraplex.engine.lora.adapter_pool import AdapterPool
from loraplex.engine.lora.lora_batch import LoRABatch
from loraplex.engine.lora.lora_manager import LoRAManager
from loraplex.engine.lora.page_layout import SLICES, plan_layout, stage_adapter
from loraplex.kernels import build_lora_mapping
from tests.kernels.llama3_shapes import GPU_DTYPES, ROUNDED, Tolerance, assert_close

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
NAN = float("nan")
MAX_BATCH_LORAS = 8  # batch slots: the graph's slot_start_loc / slot_adapters buffers
BLOCK_SIZE = 16
NUM_BLOCKS = 512  # the adapters below take about 200
GROUPS = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",))
INTO_RESIDUAL = {("o_proj",), ("down_proj",)}  # MergedLinear passes them the residual stream
UPLOAD_TIMEOUT_S = 60.0

Group = tuple[str, ...]


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
SHAPES = lora_module_shapes(ARCH)  # (in_dim, out_dim) per module
PAGE_SIZE = 2 * BLOCK_SIZE * ARCH.num_key_value_heads * ARCH.head_dim  # one KV block: 32768


@functools.cache
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


def upload(pool: AdapterPool, adapter: LoRAAdapter, dtype: torch.dtype) -> CpuAdapter:
    """Start the adapter's upload (staged as AdapterLoader stages it: pinned, the model's
    dtype); returns the staged adapter, which the caller keeps alive as LoRAManager's CPU cache does."""
    layout = plan_layout(adapter.rank, adapter.target_modules, SHAPES, PAGE_SIZE)
    packed = stage_adapter(adapter, layout, ARCH.num_hidden_layers, PAGE_SIZE, dtype)
    if pool.device.type == "cuda":
        packed = packed.pin_memory()
    cpu = CpuAdapter(adapter.content_hash, layout, packed, adapter.scaling, 0.0)
    assert pool.upload(cpu, keep=())
    return cpu


def wait_until_ready(pool: AdapterPool, adapters: list[LoRAAdapter]) -> None:
    """Poll the pool (never blocks the compute stream), as the scheduler's gate does."""
    deadline = time.monotonic() + UPLOAD_TIMEOUT_S
    while not all(pool.is_ready(a.content_hash) for a in adapters):
        assert time.monotonic() < deadline, "uploads did not finish"
        time.sleep(1e-3)


def cycle(num_tokens: int, slots: list[int]) -> torch.Tensor:
    """Token -> batch slot (-1: no adapter), `slots` repeated over the step."""
    return torch.tensor([slots[t % len(slots)] for t in range(num_tokens)], device=CUDA)


def expected_delta(
    token_adapters: list[LoRAAdapter | None],
    layer: int,
    names: Group,
    x: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Per token, scaling * x @ A.T @ B.T of its adapter for every slice the adapter targets,
    in float64 from the weights rounded to `dtype`: [num_tokens, sum of out_dims]."""
    sizes = [SHAPES[m][1] for m in names]
    delta = torch.zeros(x.shape[0], sum(sizes), dtype=torch.float64, device=x.device)
    by_hash = {a.content_hash: a for a in token_adapters if a is not None}
    for adapter in by_hash.values():
        tokens = [t for t, a in enumerate(token_adapters) if a is adapter]
        rows = torch.tensor(tokens, device=x.device)
        xs = x[rows].double()
        start = 0
        for module, size in zip(names, sizes, strict=True):
            if module in adapter.target_modules:
                a, b = (w.to(dtype).double().to(x.device) for w in adapter.weights[(layer, module)])
                delta[rows, start : start + size] = adapter.scaling * (xs @ a.T) @ b.T
            start += size
    return delta


class DecodeProjections:
    """One forward's adaptable projections over static buffers, as MergedLinear runs them."""

    def __init__(self, num_tokens: int, dtype: torch.dtype) -> None:
        self.x: dict[Group, torch.Tensor] = {}  # [num_tokens, in_dim]
        self.weight: dict[Group, torch.Tensor] = {}  # [out_dim, in_dim]
        # Per (layer, projection): the base GEMM's output y, and for o_proj / down_proj the
        # residual stream their deltas go into (with its value before the step).
        self.y: dict[tuple[int, Group], torch.Tensor] = {}
        self.residual: dict[tuple[int, Group], torch.Tensor] = {}
        self.residual_before: dict[tuple[int, Group], torch.Tensor] = {}
        for names in GROUPS:
            in_dim, out_dim = SHAPES[names[0]][0], sum(SHAPES[m][1] for m in names)
            self.x[names] = torch.randn(num_tokens, in_dim, device=CUDA).to(dtype)
            weight = torch.randn(out_dim, in_dim, device=CUDA) / in_dim**0.5
            self.weight[names] = weight.to(dtype)
            for layer in range(ARCH.num_hidden_layers):
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
        for layer in range(ARCH.num_hidden_layers):
            for names in GROUPS:
                key = (layer, names)
                x, y, into = self.x[names], self.y[key], self.residual.get(key)
                sizes = tuple(SHAPES[m][1] for m in names)
                shrunk = batch.begin(layer, names, sizes, x, delta_into=into)
                torch.matmul(x, self.weight[names].T, out=y)
                batch.finish(shrunk, y)

    def check(self, token_adapters: list[LoRAAdapter | None]) -> None:
        """Every projection's deltas, in y or in the residual stream (y then holds the base
        output alone)."""
        for (layer, names), y in self.y.items():
            x = self.x[names]
            base = torch.matmul(x, self.weight[names].T)
            actual, before = y, base
            if names in INTO_RESIDUAL:
                assert_close(y, base, ROUNDED[y.dtype])
                actual, before = self.residual[(layer, names)], self.residual_before[(layer, names)]
            expected = before.double() + expected_delta(token_adapters, layer, names, x, y.dtype)
            assert_close(actual.double(), expected, DELTA_ADDED[y.dtype])


# y after the expand: the base output's rounding plus the delta's, whose rank-r intermediate the
# kernel casts to the weights' dtype for the tensor-core dot (up to rank 64 here), then y's
# rounding again: in bf16 a few units in the last place of values up to ~4.
DELTA_ADDED = {**ROUNDED, torch.bfloat16: Tolerance(atol=5e-2, rtol=2e-2)}


class GraphMapping:
    """The graph's static mapping buffers, and what the test last wrote into them."""

    def __init__(self, num_tokens: int) -> None:
        self.sorted_token_ids = torch.zeros(num_tokens, dtype=torch.int32, device=CUDA)
        self.slot_start_loc = torch.zeros(MAX_BATCH_LORAS + 1, dtype=torch.int32, device=CUDA)
        self.slot_adapters = torch.zeros(MAX_BATCH_LORAS, dtype=torch.int32, device=CUDA)
        self.num_active_slots = torch.zeros(1, dtype=torch.int32, device=CUDA)
        self.token_adapters: list[LoRAAdapter | None] = []

    def set(self, pool: AdapterPool, slots: list[LoRAAdapter], token_slots: torch.Tensor) -> None:
        """Batch slot s serves slots[s] (as LoRAManager.prepare builds it: unused slots 0)."""
        ids, loc = build_lora_mapping(token_slots, MAX_BATCH_LORAS)
        self.sorted_token_ids.copy_(ids)
        self.slot_start_loc.copy_(loc)
        resident = [pool.resident_id(a.content_hash) for a in slots]
        resident += [0] * (MAX_BATCH_LORAS - len(slots))
        self.slot_adapters.copy_(torch.tensor(resident, dtype=torch.int32))
        self.num_active_slots.fill_(len(slots))
        self.token_adapters = [None if s < 0 else slots[s] for s in token_slots.tolist()]


def capture(step: DecodeProjections, batch: LoRABatch) -> torch.cuda.CUDAGraph:
    """Warm up (Triton compiles), as CUDAGraphRunner.capture does, then capture one forward."""
    for _ in range(2):
        step.run(batch)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step.run(batch)
    return graph


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("num_tokens", [8, 64, 128])  # side stream up to 64 tokens
def test_lora_batch_graph_replays_new_mappings_and_adapters(
    num_tokens: int, dtype: torch.dtype
) -> None:
    torch.manual_seed(0)
    kv = KVCacheManager(NUM_BLOCKS, BLOCK_SIZE)
    pages = torch.full(
        (ARCH.num_hidden_layers, NUM_BLOCKS, PAGE_SIZE), NAN, device=CUDA, dtype=dtype
    )
    config = LoRAConfig(max_lora_rank=64, max_cpu_loras=8, max_gpu_loras=8)
    manager = LoRAManager(config, ARCH, dtype, kv, pages, max_batch_loras=MAX_BATCH_LORAS)
    pool = manager.pool
    a0 = random_adapter(16, SLICES, seed=0)
    a1 = random_adapter(8, ("q_proj", "v_proj", "down_proj"), seed=1)
    a2 = random_adapter(64, ("o_proj", "gate_proj", "up_proj"), seed=2)
    packed = [upload(pool, a, dtype) for a in (a0, a1, a2)]  # resident ids 0, 1, 2
    wait_until_ready(pool, [a0, a1, a2])
    mapping = GraphMapping(num_tokens)
    # Slot s is not resident id s: slots (a2, a0, a1) -> ids (2, 0, 1).
    mapping.set(pool, [a2, a0, a1], cycle(num_tokens, [0, 1, 2, -1]))
    batch = manager.create_graph_batch(
        mapping.sorted_token_ids,
        mapping.slot_start_loc,
        mapping.slot_adapters,
        mapping.num_active_slots,
    )
    step = DecodeProjections(num_tokens, dtype)
    graph = capture(step, batch)

    a3 = random_adapter(32, ("k_proj", "up_proj", "down_proj"), seed=3)
    a4 = random_adapter(4, ("q_proj", "o_proj"), seed=4)
    replays: list[tuple[list[LoRAAdapter], list[LoRAAdapter], list[LoRAAdapter], list[int]]] = [
        # (evict, upload, batch slots, token -> slot pattern)
        # the captured state itself
        ([], [], [a2, a0, a1], [0, 1, 2, -1]),
        # a3 takes a1's resident id; most tokens on a3's slot
        ([a1], [a3], [a3, a2], [0, 0, 1, 0, -1]),
        # a4 takes resident id 3, a row nobody had at capture; a0 in a new slot
        ([], [a4], [a4, a0], [0, -1, 1, 0, 0]),
    ]
    for evict, uploads, slots, pattern in replays:
        for adapter in evict:
            pool.evict(adapter.content_hash)
        packed += [upload(pool, a, dtype) for a in uploads]
        wait_until_ready(pool, uploads)
        mapping.set(pool, slots, cycle(num_tokens, pattern))
        workspace = manager.workspace.for_step(num_tokens)
        assert workspace is not None
        workspace.fill_(NAN)  # left by a previous step: the captured memset must zero it
        step.reset_residuals()
        graph.replay()
        torch.cuda.synchronize()
        step.check(mapping.token_adapters)
    assert pool.resident_id(a3.content_hash) == 1 and pool.resident_id(a4.content_hash) == 3
    pool.check_integrity()
    manager.shutdown()

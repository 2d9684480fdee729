"""LoRABatch: begin/finish add each token's adapter deltas, read from the adapters' pages.

Steps that fit the step workspace and steps that take a buffer per layer must give the same
deltas, forward after forward: the workspace is zeroed at each forward's first launch, and a
layer's buffer is new for each layer and each forward, so nothing one forward left in either
may leak into the next one.
"""

from __future__ import annotations

import pytest
import torch

from loraplex.engine.kv_cache import KVCacheManager
from loraplex.engine.lora import lora_batch
from loraplex.engine.lora.adapter import LoRAAdapter
from loraplex.engine.lora.adapter_loader import CpuAdapter
from loraplex.engine.lora.adapter_pool import AdapterPool
from loraplex.engine.lora.lora_batch import LoRABatch, LoRAWorkspace
from loraplex.engine.lora.page_layout import SLICES, plan_layout, stage_adapter
from loraplex.kernels import build_lora_mapping
from tests.engine.lora_units import ARCH, SHAPES, make_adapter

ALL_MODULES = SLICES
GROUPS = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",))
PAGE_SIZE = 40  # rows of 48 take two pages: both placements are exercised
CPU = torch.device("cpu")

# resident adapter -> (rank, target modules); "qv+full" has k_proj targeted, "qv+mlp" leaves a
# hole at k, "down-only" makes down_proj the first (and only) launch of a forward.
ADAPTER_SETS: dict[str, dict[int, tuple[int, tuple[str, ...]]]] = {
    "qv+full": {0: (4, ("q_proj", "v_proj")), 2: (8, ALL_MODULES)},
    "qv+mlp": {0: (4, ("q_proj", "v_proj")), 1: (8, ("up_proj", "down_proj"))},
    "v-only": {1: (2, ("v_proj",))},
    "down-only": {2: (4, ("down_proj",))},
}
# Tokens a step may have and still use the workspace: a step of 8 tokens fits, 4 do not.
WORKSPACE_SIZES = {"step-workspace": 64, "buffer-per-layer": 4}


def pick_device(kernels: str, monkeypatch: pytest.MonkeyPatch) -> torch.device:
    """The device to run LoRABatch on, with its kernel launchers set to `kernels`."""
    if kernels == "reference":
        return CPU
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        return torch.device("cuda")  # the dispatchers pick Triton for CUDA tensors
    # The Triton launchers on CPU tensors (TRITON_INTERPRET=1, tests/conftest.py).
    from loraplex.kernels import triton as triton_kernels

    monkeypatch.setattr(lora_batch, "lora_shrink", triton_kernels.lora_shrink)
    monkeypatch.setattr(lora_batch, "lora_expand", triton_kernels.lora_expand)
    return CPU


def load_adapters(
    adapter_set: str, device: torch.device
) -> tuple[AdapterPool, dict[int, LoRAAdapter]]:
    """The set's adapters resident in a pool, uploaded in an order that gives each its key as
    resident id."""
    kv = KVCacheManager(256, block_size=4)
    pages = torch.full((ARCH.num_hidden_layers, 256, PAGE_SIZE), float("nan"), device=device)
    pool = AdapterPool(kv, pages, max_resident=3, max_pages=160)
    adapters = {}
    for rid in range(3):
        rank, modules = ADAPTER_SETS[adapter_set].get(rid, (1, ("q_proj",)))
        adapter = make_adapter(rank, modules, seed=rid)
        layout = plan_layout(rank, modules, SHAPES, PAGE_SIZE)
        packed = stage_adapter(adapter, layout, ARCH.num_hidden_layers, PAGE_SIZE, torch.float32)
        assert pool.upload(CpuAdapter(adapter.content_hash, layout, packed, adapter.scaling, 0), ())
        assert pool.resident_id(adapter.content_hash) == rid
        if rid in ADAPTER_SETS[adapter_set]:
            adapters[rid] = adapter
    return pool, adapters


def expected_delta(
    adapters: dict[int, LoRAAdapter],
    token_adapters: list[int],
    layer: int,
    names: tuple[str, ...],
    x: torch.Tensor,
) -> torch.Tensor:
    """Per-token scaling * x @ A.T @ B.T for every slice its adapter targets, in float64."""
    widths = [SHAPES[m][1] for m in names]
    delta = torch.zeros(x.shape[0], sum(widths), dtype=torch.float64)
    for t, rid in enumerate(token_adapters):
        if rid < 0:
            continue
        adapter, start = adapters[rid], 0
        for module, width in zip(names, widths, strict=True):
            if module in adapter.target_modules:
                a, b = (w.double() for w in adapter.weights[(layer, module)])
                delta[t, start : start + width] = adapter.scaling * (x[t].double() @ a.T @ b.T)
            start += width
    return delta


def check_forward(
    batch: LoRABatch,
    adapters: dict,
    token_adapters: list[int],
    device: torch.device,
    layers: range = range(ARCH.num_hidden_layers),
) -> None:
    """One forward: every layer's projections in model order, `begin` before a stand-in base
    matmul and `finish` after it, deltas checked against float64. o_proj and down_proj pass a
    residual stream as `delta_into`, as MergedLinear does: their deltas must land there, and y
    must stay the base output."""
    for layer in layers:
        for names in GROUPS:
            sizes = tuple(SHAPES[m][1] for m in names)
            x = torch.randn(len(token_adapters), SHAPES[names[0]][0])
            y0 = torch.randn(len(token_adapters), sum(sizes))
            r0 = torch.randn(len(token_adapters), sum(sizes))
            residual = r0.to(device, copy=True) if names[0] in ("o_proj", "down_proj") else None
            shrunk = batch.begin(layer, names, sizes, x.to(device), delta_into=residual)
            y = y0.to(device, copy=True)  # the base GEMM's output, after begin
            batch.finish(shrunk, y)
            delta = expected_delta(adapters, token_adapters, layer, names, x)
            if residual is not None:
                torch.testing.assert_close(y.cpu(), y0)
                y, y0 = residual, r0
            torch.testing.assert_close(y.cpu().double() - y0.double(), delta, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kernels", ["reference", "triton"])
@pytest.mark.parametrize("workspace", list(WORKSPACE_SIZES))
@pytest.mark.parametrize("adapter_set", list(ADAPTER_SETS))
def test_begin_finish_add_each_adapters_deltas(
    kernels: str, workspace: str, adapter_set: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    device = pick_device(kernels, monkeypatch)
    torch.manual_seed(0)
    pool, adapters = load_adapters(adapter_set, device)
    rids = list(adapters)
    token_adapters = [-1, *rids, *reversed(rids), -1, rids[0]]
    # Batch slots in order of first appearance, as LoRAManager.prepare builds them.
    slot_adapters = torch.tensor(rids + [0] * (4 - len(rids)), dtype=torch.int32, device=device)
    slot_of = {rid: slot for slot, rid in enumerate(rids)}
    token_slots = torch.tensor([slot_of.get(r, -1) for r in token_adapters], device=device)
    ids, loc = build_lora_mapping(token_slots, 4)
    ws = LoRAWorkspace(ARCH.num_hidden_layers, 8, device, max_tokens=WORKSPACE_SIZES[workspace])
    modules = set().union(*(a.target_modules for a in adapters.values()))
    num_active = torch.tensor([len(rids)], dtype=torch.int32, device=device)
    batch = LoRABatch(pool, ws, ids, loc, slot_adapters, num_active, modules)
    uses_workspace = workspace == "step-workspace"
    assert (ws.for_step(len(token_adapters)) is not None) == uses_workspace
    for forward in range(2):  # replays of one batch, as a CUDA graph does
        if forward == 1 and uses_workspace:
            ws.for_step(len(token_adapters)).fill_(7.0)  # dirty; must be re-zeroed
        check_forward(batch, adapters, token_adapters, device)
    # Forwards of one layer: a step too large for the workspace shrinks into one buffer per
    # layer, and the next forward's layer 0 must not add into the last one's.
    for _ in range(2):
        check_forward(batch, adapters, token_adapters, device, layers=range(1))


def test_workspace_views_and_size_cap() -> None:
    ws = LoRAWorkspace(ARCH.num_hidden_layers, 8, CPU, max_tokens=4)
    assert ws.max_tokens == 4 and ws.for_step(5) is None
    buf = ws.for_step(4)
    assert buf is not None and buf.shape == (2, 7, 4, 8) and buf.dtype == torch.float32
    assert buf.is_contiguous()

"""LoRASlots' stacked storage and LoRABatch's launches against per-token LoRA deltas.

Steps that fit the step workspace and steps that take a buffer per launch must give the same
deltas, forward after forward: the workspace is zeroed once per forward, at its first launch,
so a dirty workspace left by the previous forward must not leak into the next one.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from loraplex.engine.lora import lora_batch
from loraplex.engine.lora.adapter import LoRAAdapter, lora_module_shapes
from loraplex.engine.lora.lora_batch import LoRABatch
from loraplex.engine.lora.lora_slots import SLICE_GROUPS, LoRASlots
from loraplex.kernels import build_lora_mapping

ALL_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Arch:
    model_type: str = "llama"
    hidden_size: int = 32
    intermediate_size: int = 48
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 8


ARCH = Arch()
CPU = torch.device("cpu")
SHAPES = lora_module_shapes(ARCH)


def make_adapter(rank: int, target_modules: tuple[str, ...], seed: int) -> LoRAAdapter:
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for layer in range(ARCH.num_hidden_layers):
        for module in target_modules:
            in_dim, out_dim = SHAPES[module]
            a = torch.randn(rank, in_dim, generator=gen)
            b = torch.randn(out_dim, rank, generator=gen)
            weights[(layer, module)] = (a, b)
    return LoRAAdapter(
        rank=rank,
        lora_alpha=2.0 * rank,
        scaling=2.0 + seed,
        target_modules=target_modules,
        weights=weights,
        content_hash=f"hash-{seed}",
        size_bytes=0,
        base_model_name_or_path=None,
    )


def test_load_fills_stacked_groups_and_clear_resets_ranks() -> None:
    slots = LoRASlots(ARCH, max_loras=3, max_lora_rank=8, dtype=torch.float32, device=CPU)
    adapter = make_adapter(4, ("q_proj", "v_proj", "down_proj"), seed=0)
    slots.load(1, adapter)
    qkv = slots.groups[("q_proj", "k_proj", "v_proj")]
    assert qkv.slice_sizes == (32, 16, 16)
    assert qkv.lora_a.shape == (2, 3, 3, 8, 32) and qkv.lora_b.shape == (2, 3, 64, 8)
    a_v, b_v = adapter.weights[(1, "v_proj")]
    assert torch.equal(qkv.lora_a[1, 1, 2, :4], a_v)
    assert torch.equal(qkv.lora_b[1, 1, 48:64, :4], b_v)
    assert qkv.ranks.tolist() == [[0, 4, 0], [0, 0, 0], [0, 4, 0]]
    assert [g.first_slice for g in slots.groups.values()] == [0, 3, 4, 6]
    assert slots.groups[("down_proj",)].ranks.tolist() == [[0, 4, 0]]
    assert float(slots.scalings[1]) == adapter.scaling
    assert slots.modules_in_use({1}) == {"q_proj", "v_proj", "down_proj"}
    assert slots.modules_in_use({0, 2}) == set()
    slots.clear(1)
    assert all(int(g.ranks.abs().sum()) == 0 for g in slots.groups.values())
    assert slots.host_ranks["q_proj"] == [0, 0, 0]


def expected_delta(
    adapters: dict[int, LoRAAdapter],
    token_slots: list[int],
    layer: int,
    names: tuple[str, ...],
    x: torch.Tensor,
) -> torch.Tensor:
    """Per-token scaling * x @ A.T @ B.T for every slice its adapter targets, in float64."""
    widths = [SHAPES[m][1] for m in names]
    delta = torch.zeros(x.shape[0], sum(widths), dtype=torch.float64)
    for t, slot in enumerate(token_slots):
        if slot < 0:
            continue
        adapter, start = adapters[slot], 0
        for module, width in zip(names, widths, strict=True):
            if module in adapter.target_modules:
                a, b = (w.double() for w in adapter.weights[(layer, module)])
                delta[t, start : start + width] = adapter.scaling * (x[t].double() @ a.T @ b.T)
            start += width
    return delta


# slot -> (rank, target modules); "qv+full" has k_proj targeted, "qv+mlp" leaves a hole at k,
# "down-only" makes down_proj the first (and only) launch of a forward.
ADAPTER_SETS: dict[str, dict[int, tuple[int, tuple[str, ...]]]] = {
    "qv+full": {0: (4, ("q_proj", "v_proj")), 2: (8, ALL_MODULES)},
    "qv+mlp": {0: (4, ("q_proj", "v_proj")), 1: (8, ("up_proj", "down_proj"))},
    "v-only": {1: (2, ("v_proj",))},
    "down-only": {2: (4, ("down_proj",))},
}
# Tokens a step may have and still use the workspace: a step of 8 tokens fits, 64 do not.
WORKSPACE_SIZES = {"step-workspace": 64, "buffer-per-launch": 4}


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


def load_adapter_set(
    adapter_set: str, device: torch.device, max_workspace_tokens: int = 64
) -> tuple[LoRASlots, dict]:
    slots = LoRASlots(ARCH, 3, 8, torch.float32, device, max_workspace_tokens=max_workspace_tokens)
    adapters = {
        slot: make_adapter(rank, modules, seed=slot)
        for slot, (rank, modules) in ADAPTER_SETS[adapter_set].items()
    }
    for slot, adapter in adapters.items():
        slots.load(slot, adapter)
    return slots, adapters


def check_forward(
    batch: LoRABatch, adapters: dict, token_slots: list[int], device: torch.device
) -> None:
    """One forward: every layer's projections in model order, `begin` before a stand-in base
    matmul and `finish` after it, deltas checked against float64.

    o_proj and down_proj pass a residual stream as `delta_into`, as MergedLinear does: their
    deltas must land there, and y must stay the base output."""
    for layer in range(ARCH.num_hidden_layers):
        for names in SLICE_GROUPS:
            sizes = tuple(SHAPES[m][1] for m in names)
            x = torch.randn(len(token_slots), SHAPES[names[0]][0])
            y0 = torch.randn(len(token_slots), sum(sizes))
            r0 = torch.randn(len(token_slots), sum(sizes))
            residual = None
            if names in (("o_proj",), ("down_proj",)):
                residual = r0.to(device, copy=True)
            shrunk = batch.begin(layer, names, sizes, x.to(device), delta_into=residual)
            y = y0.to(device, copy=True)  # the base GEMM's output, after begin
            batch.finish(shrunk, y)
            delta = expected_delta(adapters, token_slots, layer, names, x)
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
    slots, adapters = load_adapter_set(adapter_set, device, WORKSPACE_SIZES[workspace])
    token_slots = [-1, *adapters, *reversed(list(adapters)), -1, next(iter(adapters))]
    ids, loc = build_lora_mapping(torch.tensor(token_slots, device=device), slots.max_loras)
    batch = LoRABatch(slots, ids, loc, slots.modules_in_use(set(adapters)))
    uses_workspace = workspace == "step-workspace"
    assert (slots.step_workspace(len(token_slots)) is not None) == uses_workspace
    for forward in range(2):  # replays of one batch, as a CUDA graph does
        if forward == 1 and uses_workspace:
            slots.step_workspace(len(token_slots)).fill_(7.0)  # dirty; must be re-zeroed
        check_forward(batch, adapters, token_slots, device)


def test_workspace_views_and_size_cap() -> None:
    slots, _ = load_adapter_set("qv+full", CPU, max_workspace_tokens=4)
    assert slots.max_workspace_tokens == 4
    assert slots.step_workspace(5) is None
    ws = slots.step_workspace(4)
    assert ws is not None and ws.shape == (2, 7, 4, 8) and ws.dtype == torch.float32
    assert ws.is_contiguous()

"""Decode-sized LoRA, per layer of a Llama-3-8B shape, 8 adapters of rank 16 on all 7
projections, tokens sorted by adapter (equal segments). Three ways:

- seg: the engine's kernels (lora_shrink x4 groups, lora_expand for q/k/v, o, down, and gate/up's
  expand inside silu_and_mul_lora, counted as its time beyond plain silu_and_mul);
- dense: x @ A_all^T over all 8 adapters (cuBLAS), times a per-token mask, then y += lo @ B_all
  (B_all block-diagonal over slices); gate/up: addmm into the [T, 2I] output (plain SiLU after);
- grouped: torch._grouped_mm over the adapters' segments (CUTLASS grouped GEMM), shrink then
  expand into a temporary, added into y.
Each line also checks dense and grouped against a float reference on the same weights."""

import functools
import sys

sys.path.insert(0, "bench")
import torch  # noqa: E402
from kernel_timing import graph_us  # noqa: E402
from lora_step import (  # noqa: E402
    ADAPTER_RANK,
    GROUPS,
    NUM_ADAPTERS,
    SHAPES,
    batch_slot_adapters,
    create_adapter_pool,
    group_sizes,
    group_slices,
    num_slots,
)

from loraplex.kernels import (
    silu_and_mul,  # noqa: E402
    silu_and_mul_lora,  # noqa: E402
)
from loraplex.kernels.lora_mapping import build_lora_mapping  # noqa: E402
from loraplex.kernels.triton.lora_expand import EXPAND_TILES, launch_lora_expand  # noqa: E402
from loraplex.kernels.triton.lora_shrink import SHRINK_TILES, launch_lora_shrink  # noqa: E402

R = ADAPTER_RANK
G = NUM_ADAPTERS


def dense_shrink(x, a_all, mask, lo):
    torch.mm(x, a_all.t(), out=lo)
    lo.mul_(mask)


def dense_layer_group(x, a_all, mask, lo, y, b_all):
    dense_shrink(x, a_all, mask, lo)
    y.addmm_(lo, b_all)


def grouped_group(x, a_g, offs, b_g, y):
    lo = torch._grouped_mm(x, a_g, offs=offs)  # [T, s*R]
    y.add_(torch._grouped_mm(lo, b_g, offs=offs))


def main() -> None:
    device, dtype = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    pool = create_adapter_pool(dtype, device)
    slot_adapters, num_active = batch_slot_adapters(pool, NUM_ADAPTERS)
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    for num_tokens in (64, 128, 256, 512):
        # tokens sorted by adapter: equal segments
        slots = torch.arange(num_tokens, device=device) * G // num_tokens
        ids, loc = build_lora_mapping(slots.to(torch.int32), num_slots(NUM_ADAPTERS))
        mapping = (slot_adapters, num_active, ids, loc)
        s_tiles, e_tiles = SHRINK_TILES.lookup(num_tokens), EXPAND_TILES.lookup(num_tokens)
        counts = torch.bincount(slots, minlength=G)
        offs = counts.cumsum(0).to(torch.int32)
        t = {k: 0.0 for k in ("seg_s", "seg_e", "seg_act", "den", "den_s", "grp", "grp_err")}
        errs = []
        for names in GROUPS:
            rows = group_slices(names)
            k = SHAPES[names[0]][0]
            sizes = group_sizes(names)
            n_total = sum(sizes)
            s = len(names)
            width = G * s * R
            x = torch.randn(num_tokens, k, device=device, dtype=dtype)
            lo32 = torch.zeros(s, num_tokens, R, device=device)
            a = (pool.pages[0], pool.page_table, pool.first_a[rows], pool.ranks[rows])
            t["seg_s"] += graph_us(
                functools.partial(launch_lora_shrink, x, *a, *mapping, lo32, True, s_tiles)
            )
            y = torch.randn(num_tokens, n_total, device=device, dtype=dtype)
            b = (pool.pages[0], pool.page_table, pool.first_b[rows], pool.ranks[rows])
            if names == ("gate_proj", "up_proj"):
                plain = graph_us(functools.partial(silu_and_mul, y))
                fused = graph_us(
                    functools.partial(silu_and_mul_lora, y, lo32, *b, pool.scalings, *mapping)
                )
                t["seg_act"] += fused - plain
            else:
                t["seg_e"] += graph_us(
                    functools.partial(
                        launch_lora_expand, lo32, *b, pool.scalings, *mapping, y, 0, sizes,
                        e_tiles,
                    )
                )  # fmt: skip
            # dense weights: adapter-major, slice, rank
            a_w = torch.randn(G, s, R, k, device=device, dtype=dtype) / k**0.5
            b_w = torch.randn(G, s, R, max(sizes), device=device, dtype=dtype) / R**0.5
            a_all = a_w.reshape(width, k)
            b_all = torch.zeros(G, s, R, n_total, device=device, dtype=dtype)
            col = 0
            for i, size in enumerate(sizes):
                b_all[:, i, :, col : col + size] = b_w[:, i, :, :size]
                col += size
            b_all = b_all.reshape(width, n_total)
            mask = torch.zeros(num_tokens, G, s * R, device=device, dtype=dtype)
            mask[torch.arange(num_tokens, device=device), slots] = 1.0
            mask = mask.reshape(num_tokens, width)
            lo = torch.empty(num_tokens, width, device=device, dtype=dtype)
            y.normal_()  # the segmented timing left its deltas in y
            y0 = y.clone()
            dense_layer_group(x, a_all, mask, lo, y, b_all)
            # reference in float32
            ref = torch.zeros(num_tokens, n_total, device=device)
            for gi in range(G):
                sel = slots == gi
                lo_g = x[sel].float() @ a_w[gi].reshape(s * R, k).float().t()
                ref[sel] = lo_g @ b_all.view(G, s * R, n_total)[gi].float()
            errs.append(((y.float() - y0.float()) - ref).abs().max().item())
            y.copy_(y0)
            t["den"] += graph_us(functools.partial(dense_layer_group, x, a_all, mask, lo, y, b_all))
            t["den_s"] += graph_us(functools.partial(dense_shrink, x, a_all, mask, lo))
            try:
                a_g = a_w.reshape(G, s * R, k).transpose(1, 2)  # [G, k, s*R] (column-major)
                b_g = b_all.view(G, s * R, n_total)
                y.copy_(y0)
                grouped_group(x, a_g, offs, b_g, y)
                t["grp_err"] = max(
                    t["grp_err"], ((y.float() - y0.float()) - ref).abs().max().item()
                )
                t["grp"] += graph_us(functools.partial(grouped_group, x, a_g, offs, b_g, y))
            except Exception as e:  # noqa: BLE001
                print("grouped_mm failed:", type(e).__name__, str(e)[:300], flush=True)
                t["grp"] = float("nan")
        seg = t["seg_s"] + t["seg_e"] + t["seg_act"]
        print(
            f"T {num_tokens:4d}: seg shrink {t['seg_s']:6.1f} expand {t['seg_e']:6.1f} "
            f"act+ {t['seg_act']:5.1f} = {seg:6.1f} | dense {t['den']:6.1f} (shrink+mask "
            f"{t['den_s']:5.1f}) | grouped {t['grp']:6.1f} us/layer | max err dense "
            f"{max(errs):.3g} grouped {t['grp_err']:.3g}",
            flush=True,
        )


if __name__ == "__main__":
    main()

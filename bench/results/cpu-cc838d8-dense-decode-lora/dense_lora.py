"""Decode-sized LoRA: the segmented kernels against dense cuBLAS over all active adapters.

Per layer of a Llama-3-8B shape, 8 adapters of rank 16 on all 7 projections, tokens taking the
adapters in turn. Segmented: the engine's lora_shrink of every group and lora_expand of q/k/v, o
and down (gate/up's expand lives in the activation). Dense: shrink = x @ A_all^T (A_all: every
active adapter's A of the group stacked, [8 * slices * 16, in]) then a multiply by a per-token
mask that keeps the token's own adapter's columns (and its scaling); expand = y += lo @ B_all
(B_all [8 * slices * 16, out], each slice's rows nonzero only in its columns). Times only."""

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

from loraplex.kernels.lora_mapping import build_lora_mapping  # noqa: E402
from loraplex.kernels.triton.lora_expand import EXPAND_TILES, launch_lora_expand  # noqa: E402
from loraplex.kernels.triton.lora_shrink import SHRINK_TILES, launch_lora_shrink  # noqa: E402

EXPANDED = (GROUPS[0], GROUPS[1], GROUPS[3])


def dense_shrink(x, a_all, mask, lo):
    torch.mm(x, a_all.t(), out=lo)
    lo.mul_(mask)


def dense_shrink_gather(x, a_all, lo, rows, own, out):
    """The token's own adapter's columns into the segmented kernels' [slices, T, rank] layout."""
    torch.mm(x, a_all.t(), out=lo)
    out.copy_(
        lo.view(lo.shape[0], NUM_ADAPTERS, -1)[rows, own]
        .view(out.shape[1], out.shape[0], -1)
        .transpose(0, 1)
    )


def main() -> None:
    device, dtype = torch.device("cuda"), torch.bfloat16
    pool = create_adapter_pool(dtype, device)
    slot_adapters, num_active = batch_slot_adapters(pool, NUM_ADAPTERS)
    for num_tokens in (64, 128, 256, 512):
        slots = torch.arange(num_tokens, device=device) % NUM_ADAPTERS
        ids, loc = build_lora_mapping(slots.to(torch.int32), num_slots(NUM_ADAPTERS))
        mapping = (slot_adapters, num_active, ids, loc)
        s_tiles, e_tiles = SHRINK_TILES.lookup(num_tokens), EXPAND_TILES.lookup(num_tokens)
        seg_s = seg_e = den_s = den_e = den_g = 0.0
        for names in GROUPS:
            rows = group_slices(names)
            k = SHAPES[names[0]][0]
            n_total = sum(group_sizes(names))
            width = NUM_ADAPTERS * len(names) * ADAPTER_RANK
            x = torch.randn(num_tokens, k, device=device, dtype=dtype)
            out = torch.empty(len(names), num_tokens, ADAPTER_RANK, device=device)
            a = (pool.pages[0], pool.page_table, pool.first_a[rows], pool.ranks[rows])
            seg_s += graph_us(
                functools.partial(launch_lora_shrink, x, *a, *mapping, out, True, s_tiles)
            )
            a_all = torch.randn(width, k, device=device, dtype=dtype) * 0.01
            mask = torch.zeros(num_tokens, width, device=device, dtype=dtype)
            for t in range(num_tokens):
                first = int(slots[t]) * len(names) * ADAPTER_RANK
                mask[t, first : first + len(names) * ADAPTER_RANK] = 2.0
            lo = torch.empty(num_tokens, width, device=device, dtype=dtype)
            den_s += graph_us(functools.partial(dense_shrink, x, a_all, mask, lo))
            own = slots.long()
            rows_t = torch.arange(num_tokens, device=device)
            out_g = torch.empty(len(names), num_tokens, ADAPTER_RANK, device=device, dtype=dtype)
            den_g += graph_us(
                functools.partial(dense_shrink_gather, x, a_all, lo, rows_t, own, out_g)
            )
            if names in EXPANDED:
                b = (pool.pages[0], pool.page_table, pool.first_b[rows], pool.ranks[rows])
                lora_out = torch.randn(len(names), num_tokens, ADAPTER_RANK, device=device)
                y = torch.randn(num_tokens, n_total, device=device, dtype=dtype)
                sizes = group_sizes(names)
                seg_e += graph_us(
                    functools.partial(
                        launch_lora_expand, lora_out, *b, pool.scalings, *mapping, y, 0, sizes,
                        e_tiles,
                    )
                )  # fmt: skip
                b_all = torch.randn(width, n_total, device=device, dtype=dtype) * 0.01
                den_e += graph_us(functools.partial(y.addmm_, lo, b_all))
        print(
            f"T {num_tokens:4d}: segmented shrink {seg_s:6.1f} expand {seg_e:6.1f} | "
            f"dense shrink+mask {den_s:6.1f} expand {den_e:6.1f} | dense shrink+gather {den_g:6.1f}"
            " us/layer",
            flush=True,
        )


if __name__ == "__main__":
    main()

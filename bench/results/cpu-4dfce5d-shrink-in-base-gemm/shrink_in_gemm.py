"""The LoRA shrink as extra output rows of the base GEMM, against the segmented shrink.

Per projection group of one Llama-3-8B layer (q/k/v, o, gate/up, down) and per step size, with
8 adapters of rank 16 on all 7 projections:

- base: cuBLAS x @ W^T, W being the first N rows of a [N + extra, K] buffer (what a step without
  adapters would run, unchanged);
- base + A rows: the same GEMM over all N + extra rows, where the extra rows are every active
  adapter's A for the group's slices (extra = 8 adapters x slices x 16). One GEMM then yields y
  and every adapter's shrink of every token;
- segmented: the engine's lora_shrink of the group (its tile table), the launch the extra rows
  would replace.

- gather: each token's own adapter's columns of the wide output, copied into the fp32
  [slices, T, rank] buffer that today's expand kernels read (torch.gather with a per-step index,
  then a copy): what the simplest engine form adds back;
- strided: the next op reading y as the wide output's strided view instead of a contiguous
  tensor (fused_add_rms_norm after o and down, silu_and_mul after gate/up; q/k/v are views
  already), against the same op on a contiguous y.

The extra rows cost what the GEMM takes for its extra output columns; the segmented shrink is
a launch of its own that reads x again. Prints us per group and per layer (CUDA-graph replays,
L2 flushed before each: bench/kernel_timing.graph_us). Times only: the results of the two forms
are compared by a check of the extra columns against x @ A^T on one size."""

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

from loraplex.kernels import fused_add_rms_norm, silu_and_mul  # noqa: E402
from loraplex.kernels.lora_mapping import build_lora_mapping  # noqa: E402
from loraplex.kernels.triton.lora_shrink import SHRINK_TILES, launch_lora_shrink  # noqa: E402


def gather_lora_out(wide: torch.Tensor, n: int, index: torch.Tensor, out: torch.Tensor) -> None:
    """out [slices, T, rank] float32 <- each token's columns of wide[:, n:] (index [T, s * r])."""
    own = torch.gather(wide[:, n:], 1, index)  # [T, slices * rank]
    out.copy_(own.view(out.shape[1], out.shape[0], -1).transpose(0, 1))


def next_op(names: tuple[str, ...], y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor):
    """The op that reads the projection's output next in the decoder (None: q/k/v's views)."""
    if names[0] == "gate_proj":
        return functools.partial(silu_and_mul, y)
    if names[0] in ("o_proj", "down_proj"):
        return functools.partial(fused_add_rms_norm, y, residual, weight, 1e-5)
    return None


def main() -> None:
    device, dtype = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    pool = create_adapter_pool(dtype, device)
    slot_adapters, num_active = batch_slot_adapters(pool, NUM_ADAPTERS)
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    weights = {}
    for names in GROUPS:
        k = SHAPES[names[0]][0]
        n = sum(group_sizes(names))
        extra = NUM_ADAPTERS * len(names) * ADAPTER_RANK
        weights[names] = (torch.randn(n + extra, k, device=device, dtype=dtype) * 0.02, n, extra)
    for num_tokens in (64, 128, 256, 512, 4096):
        # decode steps: the adapters' tokens interleaved; prefill: runs of 512 tokens
        run = 1 if num_tokens <= 512 else 512
        slots = (torch.arange(num_tokens, device=device) // run) % NUM_ADAPTERS
        ids, loc = build_lora_mapping(slots.to(torch.int32), num_slots(NUM_ADAPTERS))
        mapping = (slot_adapters, num_active, ids, loc)
        tiles = SHRINK_TILES.lookup(num_tokens)
        totals = [0.0, 0.0, 0.0, 0.0, 0.0]
        cells = []
        for names in GROUPS:
            w, n, extra = weights[names]
            k = w.shape[1]
            x = torch.randn(num_tokens, k, device=device, dtype=dtype)
            base = graph_us(functools.partial(torch.mm, x, w[:n].t()))
            full = graph_us(functools.partial(torch.mm, x, w.t()))
            rows = group_slices(names)
            out = torch.zeros(len(names), num_tokens, ADAPTER_RANK, device=device)
            a = (pool.pages[0], pool.page_table, pool.first_a[rows], pool.ranks[rows])
            seg = graph_us(functools.partial(launch_lora_shrink, x, *a, *mapping, out, True, tiles))
            wide = torch.mm(x, w.t())
            if num_tokens == 64:  # the extra columns are x @ A^T, as one GEMM of the A rows
                alone = torch.mm(x, w[n:].t())
                assert torch.allclose(wide[:, n:].float(), alone.float(), atol=2e-2, rtol=2e-2)
            width = len(names) * ADAPTER_RANK
            index = slots[:, None] * width + torch.arange(width, device=device)[None, :]
            gather = graph_us(functools.partial(gather_lora_out, wide, n, index, out))
            if num_tokens == 64:  # each token got its own adapter's columns, slice by slice
                for t in (0, 1, 63):
                    first = n + int(slots[t]) * width
                    own = (x[t] @ w[first : first + width].t()).view(len(names), -1)
                    assert torch.allclose(out[:, t].float(), own.float(), atol=2e-2, rtol=2e-2)
            strided = 0.0
            residual = torch.randn(num_tokens, n, device=device, dtype=dtype)
            weight = torch.ones(n, device=device, dtype=dtype)
            op_wide = next_op(names, wide[:, :n], residual, weight)
            op_dense = next_op(names, wide[:, :n].contiguous(), residual, weight)
            if op_wide is not None and op_dense is not None:
                strided = graph_us(op_wide) - graph_us(op_dense)
            for i, us in enumerate((base, full, seg, gather, strided)):
                totals[i] += us
            cells.append(f"{names[0]} {base:7.1f} +{full - base:5.1f} vs {seg:5.1f}")
        print(
            f"T {num_tokens:5d}: base GEMMs {totals[0]:7.1f} us/layer, A rows add "
            f"{totals[1] - totals[0]:6.1f}, segmented shrinks {totals[2]:6.1f}, gathers "
            f"{totals[3]:5.1f}, strided reads add {totals[4]:5.1f} | " + " | ".join(cells),
            flush=True,
        )


if __name__ == "__main__":
    main()

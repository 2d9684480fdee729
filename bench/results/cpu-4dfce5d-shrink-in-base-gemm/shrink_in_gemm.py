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

from loraplex.kernels.lora_mapping import build_lora_mapping  # noqa: E402
from loraplex.kernels.triton.lora_shrink import SHRINK_TILES, launch_lora_shrink  # noqa: E402


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
        totals = [0.0, 0.0, 0.0]
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
            if num_tokens == 64:  # the extra columns are x @ A^T, as one GEMM of the A rows
                both = torch.mm(x, w.t())
                alone = torch.mm(x, w[n:].t())
                assert torch.allclose(both[:, n:].float(), alone.float(), atol=2e-2, rtol=2e-2)
            for i, us in enumerate((base, full, seg)):
                totals[i] += us
            cells.append(f"{names[0]} {base:7.1f} +{full - base:5.1f} vs {seg:5.1f}")
        print(
            f"T {num_tokens:5d}: base GEMMs {totals[0]:7.1f} us/layer, A rows add "
            f"{totals[1] - totals[0]:6.1f}, segmented shrinks {totals[2]:6.1f} | "
            + " | ".join(cells),
            flush=True,
        )


if __name__ == "__main__":
    main()

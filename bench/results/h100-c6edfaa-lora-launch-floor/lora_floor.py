"""Per-layer LoRA time (us) of bench/lora_step.py's step, CUDA graph of 32 layers, against the
same launches with no active slot (every program returns after its first loads) and against a
chain of do-nothing Triton launches: where a decode step's LoRA time goes."""

import functools
import json
import sys

sys.path.insert(0, "bench")
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from kernel_timing import graph_us  # noqa: E402
from lora_step import NUM_LAYERS, LoRAStep, create_adapter_pool, create_base_weights  # noqa: E402

from loraplex.engine.lora.lora_batch import LoRAWorkspace  # noqa: E402


@triton.jit
def _nothing(x_ptr, n):
    if tl.program_id(0) >= n:
        return
    tl.store(x_ptr + tl.program_id(0), 1.0)


dev, dt = torch.device("cuda"), torch.bfloat16
buf = torch.zeros(1 << 16, device=dev)


def chain(launches: int, programs: int) -> None:
    for _ in range(launches):
        _nothing[(programs,)](buf, 0)


res = {}
for programs in (1, 1024, 8192):
    us = graph_us(functools.partial(chain, 7 * NUM_LAYERS, programs)) / NUM_LAYERS
    res[f"7 empty launches of {programs} programs"] = us
    print(f"7 do-nothing launches of {programs:5d} programs: {us:6.1f} us per layer", flush=True)
pool = create_adapter_pool(dt, dev)
weights = create_base_weights(dt, dev)
ws = LoRAWorkspace(NUM_LAYERS, 64, dev)
for t in (64, 256, 512, 4096):
    step = LoRAStep(pool, ws, t, weights)
    assert step.sanity_check(), t
    run = functools.partial(step.run, lora=True, gemms=False)
    full = min(graph_us(run) for _ in range(3)) / NUM_LAYERS
    step.num_active_slots.zero_()
    empty = min(graph_us(run) for _ in range(3)) / NUM_LAYERS
    res[f"T {t}"] = {"lora_us": full, "no_active_slot_us": empty}
    print(f"T {t:5d}  lora {full:7.1f}  no active slot {empty:7.1f} us/layer", flush=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step.num_active_slots.fill_(8 if t >= 8 else t)
        for _ in range(3):
            run()
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=8)
    print(table, flush=True)
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        json.dump(res, f)

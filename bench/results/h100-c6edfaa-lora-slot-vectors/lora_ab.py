"""LoRA alone per layer (us) at several step sizes: 8 adapters x rank 16, max_lora_rank 64,
32 layers in one CUDA graph (bench/lora_step.py's LoRAStep); A/B of two wheels by PYTHONPATH."""

import functools
import json
import sys

sys.path.insert(0, "bench")
import torch  # noqa: E402
from kernel_timing import graph_us  # noqa: E402
from lora_step import NUM_LAYERS, LoRAStep, create_adapter_pool, create_base_weights  # noqa: E402

import loraplex  # noqa: E402
from loraplex.engine.lora.lora_batch import LoRAWorkspace  # noqa: E402

dev, dt = torch.device("cuda"), torch.bfloat16
print("loraplex from", loraplex.__path__)
pool = create_adapter_pool(dt, dev)
weights = create_base_weights(dt, dev)
ws = LoRAWorkspace(NUM_LAYERS, 64, dev)
res = {}
for t in (64, 256, 512, 2048, 4096):
    step = LoRAStep(pool, ws, t, weights)
    assert step.sanity_check(), t
    lora = min(graph_us(functools.partial(step.run, lora=True, gemms=False)) for _ in range(3))
    res[t] = lora / NUM_LAYERS
    print(f"T {t:5d}  lora {res[t]:7.1f} us/layer", flush=True)
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        json.dump(res, f)

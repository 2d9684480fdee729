"""Host time of a step's preparation on this machine's CPU: the token -> adapter mapping
(`map_step`) and the forward's flat input tensors (`prepare_inputs`), for W1's step shapes.

With async scheduling the host prepares step N+1 while the GPU runs step N, so this time is
hidden only while it stays under the GPU's step; FP8 bases with adapters were measured
host-paced (bench/results/h100-7c51dda-serve-all-slices-fp8). The device is the CPU here (no
copies to a GPU): what is timed is the Python and the host tensors.

    python bench/host_step_prep.py [--repeats 300]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from loraplex.engine.lora.step_mapping import map_step
from loraplex.engine.request import Request, SamplingParams
from loraplex.engine.runner.input_batch import prepare_inputs
from loraplex.engine.scheduler.output import ScheduledRequest

BLOCK_SIZE = 16
NUM_ADAPTERS = 8


def w1_step(num_prefills: int, prompt_len: int, num_decodes: int, context: int) -> list:
    """A step of W1's shape: `num_decodes` one-token decodes at `context`, then
    `num_prefills` whole prompts of `prompt_len` (the scheduler puts decodes first)."""
    scheduled = []
    next_block = 0
    for i in range(num_decodes + num_prefills):
        decode = i < num_decodes
        length = context + 1 if decode else prompt_len
        request = Request(f"r{i}", list(range(length)), SamplingParams(max_tokens=128))
        num_blocks = -(-length // BLOCK_SIZE)
        block_ids = list(range(next_block, next_block + num_blocks))
        next_block += num_blocks
        start = context if decode else 0
        scheduled.append(ScheduledRequest(request, length - start, block_ids, start, True))
    return scheduled


def per_call_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return 1000 * (time.perf_counter() - start) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=300)
    args = ap.parse_args()
    torch.set_num_threads(1)  # the engine's host thread; small tensors stay on one core anyway
    device = torch.device("cpu")
    steps = {
        "prefill-carrying (200 decodes + 8 x 512)": w1_step(8, 512, 200, 560),
        "prefill (16 x 512)": w1_step(16, 512, 0, 0),
        "decode (256 x 1)": w1_step(0, 512, 256, 560),
    }
    for name, scheduled in steps.items():
        hashes = [f"a{i % NUM_ADAPTERS}" for i in range(len(scheduled))]
        tokens = [s.num_new_tokens for s in scheduled]
        inputs_ms = per_call_ms(
            lambda s=scheduled: prepare_inputs(s, BLOCK_SIZE, device), args.repeats
        )
        mapping_ms = per_call_ms(
            lambda h=hashes, t=tokens: map_step(h, t, lambda a: int(a[1:]), 256, device),
            args.repeats,
        )
        print(
            f"{name:<42} {sum(tokens):6d} tokens: prepare_inputs {inputs_ms:6.3f} ms, "
            f"map_step {mapping_ms:6.3f} ms",
            flush=True,
        )


if __name__ == "__main__":
    main()

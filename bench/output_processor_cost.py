"""Host time of the engine's output processing per step, as completions grow long: cumulative
outputs (what `LLM` returns) against deltas (what the engine core sends the server), for a
batch of running requests that each gain one token per step.

Drives `OutputProcessor` alone, with the demo-sized tokenizer of a tiny random checkpoint: what
is timed is the Python of detokenizing, building outputs, and (for deltas) slicing off what is
new. Runs on the CPU; no model.

    python bench/output_processor_cost.py [--requests 256] [--lengths 128,1024,4096]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from loraplex.engine.output_processor import OutputProcessor
from loraplex.engine.request import Request, RequestStatus, SamplingParams
from loraplex.engine.tokenizer import Tokenizer
from loraplex.platform.demo.tiny_checkpoint import write_random_checkpoint


def step_ms(tokenizer: Tokenizer, deltas: bool, num_requests: int, length: int) -> float:
    """Mean ms of a `process` call over the steps in which the outputs grow from length - 64
    to length tokens (the requests generated up to there first, untimed)."""
    processor = OutputProcessor(tokenizer, deltas=deltas)
    rng = random.Random(0)
    requests = []
    for i in range(num_requests):
        params = SamplingParams(max_tokens=length + 1, ignore_eos=True)
        request = Request(f"r{i}", [5, 6, 7], params, status=RequestStatus.RUNNING)
        processor.add(request.request_id, None, [request])
        requests.append(request)
    seconds = 0.0
    for step in range(length):
        for request in requests:
            request.output_token_ids.append(rng.randrange(3, 500))
        start = time.perf_counter()
        processor.process(requests, {})
        processor.flush()  # what the engine runs while the next forward is on the GPU
        if step >= length - 64:
            seconds += time.perf_counter() - start
    return seconds / 64 * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--lengths", default="128,1024,4096")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = Tokenizer.from_model_dir(write_random_checkpoint(Path(tmp) / "m"))
        print(f"{args.requests} running requests, ms of output processing per step:")
        for length in (int(n) for n in args.lengths.split(",")):
            cumulative = step_ms(tokenizer, False, args.requests, length)
            delta = step_ms(tokenizer, True, args.requests, length)
            print(
                f"  outputs of {length:5d} tokens: cumulative {cumulative:6.2f} ms, "
                f"deltas {delta:6.2f} ms",
                flush=True,
            )


if __name__ == "__main__":
    main()

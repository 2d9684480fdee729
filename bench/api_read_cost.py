"""Host time per step on the server's side of the engine (`AsyncEngine`): applying a step's
output deltas to each request and each reader taking its output, as completions grow long.
Cumulative reads (every output holds the whole completion so far) against delta reads (what the
server's `EngineStream` asks for: only what came since the last read), and delta reads of a
caller that does not stream (`stream=False`: woken for the first output and the last only; the
figure is the collector's own work; the pump's and the handler's wake-ups it saves come on top).

Drives AsyncEngine's per-request state (`RequestOutputCollector`) alone, with the engine core's
own message types, for a batch of running requests that each gain one token (4 characters) per
step and a reader that keeps up. Runs on the CPU; no model, no event loop.

    python bench/api_read_cost.py [--requests 256] [--lengths 128,1024,4096]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from loraplex.engine.engine_core import CompletionDelta, OutputDelta
from loraplex.engine.output_collector import RequestOutputCollector


def step_ms(delta: bool, num_requests: int, length: int, stream: bool = True) -> float:
    """Mean ms of one step (apply every request's delta, then read every request that has an
    output to read) over the steps in which the outputs grow from length - 64 to length
    tokens; the last step finishes the requests."""
    loop = asyncio.new_event_loop()
    try:
        requests = [
            RequestOutputCollector(None, [5, 6, 7], loop.create_future(), delta, stream)
            for _ in range(num_requests)
        ]
        seconds = 0.0
        for step in range(length):
            start = time.perf_counter()
            last = step == length - 1
            for i, request in enumerate(requests):
                piece = CompletionDelta(0, [step % 500], "tok ", None, None, None)
                request.apply(OutputDelta(f"r{i}", [piece], last, 0, None))
            for i, request in enumerate(requests):
                if request.has_output:
                    request.read(f"r{i}")
            if step >= length - 64:
                seconds += time.perf_counter() - start
        return seconds / 64 * 1e3
    finally:
        loop.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--lengths", default="128,1024,4096")
    args = ap.parse_args()
    print(f"{args.requests} running requests, ms per step of applying deltas and reading:")
    for length in (int(n) for n in args.lengths.split(",")):
        cumulative = step_ms(False, args.requests, length)
        delta = step_ms(True, args.requests, length)
        quiet = step_ms(True, args.requests, length, stream=False)
        print(
            f"  {length:>5} tokens: cumulative {cumulative:6.2f} ms, delta {delta:6.2f} ms"
            f" ({cumulative / delta:.1f}x), delta not streamed {quiet:6.2f} ms"
        )


if __name__ == "__main__":
    main()

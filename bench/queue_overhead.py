"""Host time of the per-step adapter bookkeeping as the waiting queue grows.

Every engine step advances adapter loads for the head of the waiting queue (`LoRAManager.poll`)
and fails requests whose adapter failed or can never fit beside it
(`LLMEngine._fail_adapter_requests`). Both run on the host while the GPU waits, so their cost
must not grow with a queue of thousands. This times the two together, per step, with N requests
waiting over 8 adapters (tiny model on the CPU: the bookkeeping does not depend on the model).

    python bench/queue_overhead.py --waiting 500,2000 [--out bench/results/cpu-<commit>]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from workload import SHAPES, synthetic_prompts, write_random_adapter, write_shape_checkpoint

from loraplex.engine import LLM, LoRARequest, SamplingParams


def bookkeeping_ms(checkpoint: Path, adapters: list[Path], num_requests: int, steps: int) -> float:
    engine = LLM(
        str(checkpoint), load_format="dummy", enable_prefix_caching=False, max_num_seqs=64
    ).engine
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    prompts = synthetic_prompts(num_requests, 16, 32, SHAPES["tiny"]["vocab_size"])
    for i, prompt in enumerate(prompts):
        k = i % len(adapters)
        lora = LoRARequest(f"a{k}", k + 1, str(adapters[k]))
        engine.add_request(str(i), {"prompt_token_ids": prompt}, params, lora_request=lora)
    for _ in range(20):  # adapters loaded, the first batch running
        engine.step()
    manager = engine.lora_manager
    assert manager is not None
    start = time.perf_counter()
    for _ in range(steps):
        failures = manager.poll(engine.scheduler.waiting, len(engine.scheduler.running))
        engine._fail_adapter_requests(failures)
    return (time.perf_counter() - start) / steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--waiting", default="500,2000", help="queue lengths (requests)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", type=Path, help="a results folder for queue_overhead.json")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    checkpoint = write_shape_checkpoint("tiny", tmp / "model")
    adapters = [
        write_random_adapter(tmp / f"a{i}", SHAPES["tiny"], 8, i, ("q_proj", "v_proj"))
        for i in range(8)
    ]
    results = []
    for n in (int(x) for x in args.waiting.split(",")):
        ms = bookkeeping_ms(checkpoint, adapters, n, args.steps)
        results.append({"requests": n, "bookkeeping_ms_per_step": round(ms, 4)})
        print(f"{n:6d} requests queued: {ms:.3f} ms of adapter bookkeeping per step")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "queue_overhead.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()

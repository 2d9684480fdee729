"""CPU demo, long prompts: no tenant blocks another.

1. Prefill of one 3,000-token prompt: Loraplex (LLM.generate, max_tokens=1, the CPU's default
   chunked-prefill budget) against HF transformers' forward of the same tokens (SDPA
   attention, logits of the last position only), on the same model and machine. The two
   alternate for `--rounds` rounds, so that load from elsewhere hits both alike; wall and CPU
   seconds of each are reported.
2. Head-of-line blocking: a standard-tier request of 3,000 prompt tokens starts prefilling; a
   2-token interactive request (another tenant, ~20 prompt tokens) is submitted `--delays`
   seconds later; its latency from submission to its last token, and whether the long prefill
   was still running when it finished.

    python bench/cpu_prefill.py                       # the demo model, results printed
    python bench/cpu_prefill.py --out bench/results/cpu-<commit>
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
from pathlib import Path

import torch

from loraplex.engine import LLM, AsyncEngine, SamplingParams
from loraplex.platform.demo.checkpoint import ensure_demo_checkpoint
from loraplex.platform.settings import Settings


def timed(fn: object) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of `fn()`."""
    assert callable(fn)
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def engine_kwargs(args: argparse.Namespace) -> dict[str, object]:
    kwargs: dict[str, object] = {"device": "cpu", "dtype": "float32"}
    kwargs["enable_prefix_caching"] = False  # every round prefills in full
    if args.max_num_batched_tokens:  # else the CPU's default
        kwargs["max_num_batched_tokens"] = args.max_num_batched_tokens
    return kwargs


def prompt(num_tokens: int, seed: int, vocab: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, vocab) for _ in range(num_tokens)]


def prefill_rounds(model: str, args: argparse.Namespace) -> dict[str, object]:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    vocab = hf.config.vocab_size
    llm = LLM(model=model, **engine_kwargs(args))
    budget = llm.engine.config.scheduler.max_num_batched_tokens
    params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
    with torch.inference_mode():  # warm both up once (allocator, thread pools)
        hf(torch.tensor([prompt(64, 0, vocab)]), logits_to_keep=1)
    llm.generate([{"prompt_token_ids": prompt(64, 0, vocab)}], params, use_tqdm=False)
    rounds = []
    for r in range(args.rounds):
        ids = prompt(args.prompt_tokens, 100 + r, vocab)
        with torch.inference_mode():
            hf_wall, hf_cpu = timed(lambda ids=ids: hf(torch.tensor([ids]), logits_to_keep=1))
        lpx_wall, lpx_cpu = timed(
            lambda ids=ids: llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
        )
        rounds.append(
            {
                "hf_wall_s": hf_wall,
                "hf_cpu_s": hf_cpu,
                "loraplex_wall_s": lpx_wall,
                "loraplex_cpu_s": lpx_cpu,
                "ratio_wall": lpx_wall / hf_wall,
            }
        )
        print(
            f"round {r}: HF forward {hf_wall:.2f} s (cpu {hf_cpu:.2f}), Loraplex prefill "
            f"{lpx_wall:.2f} s (cpu {lpx_cpu:.2f}) = {lpx_wall / hf_wall:.2f}x",
            flush=True,
        )
    return {
        "prompt_tokens": args.prompt_tokens,
        "max_num_batched_tokens": budget,
        "rounds": rounds,
        "median_ratio_wall": statistics.median(r["ratio_wall"] for r in rounds),
    }


async def finish_time(
    engine: AsyncEngine, ids: list[int], request_id: str, priority: int, tenant: str
) -> float:
    """Run one 2-token request (tenant `tenant` at `priority`); when it finished."""
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    async for out in engine.generate(
        {"prompt_token_ids": ids},
        params,
        request_id,
        priority=priority,
        fairness_key=tenant,
        cache_salt=tenant,
    ):
        if out.finished:
            return time.perf_counter()
    raise AssertionError("no final output")


async def interactive_latency(model: str, args: argparse.Namespace) -> list[dict[str, object]]:
    engine = AsyncEngine.from_engine_args(model, **engine_kwargs(args))
    await engine.start()
    vocab = engine.engine.runner.arch.vocab_size
    results: list[dict[str, object]] = []
    try:
        for i, delay in enumerate(args.delays):
            started = time.perf_counter()
            long_ids = prompt(args.prompt_tokens, 200 + i, vocab)
            long_task = asyncio.create_task(finish_time(engine, long_ids, f"long{i}", 1, "a"))
            await asyncio.sleep(delay)
            submitted = time.perf_counter()
            finished = await finish_time(engine, prompt(20, 300 + i, vocab), f"short{i}", 0, "b")
            long_finished = await long_task
            results.append(
                {
                    "submitted_after_s": submitted - started,
                    "interactive_latency_s": finished - submitted,
                    "long_prefill_total_s": long_finished - started,
                    "long_still_running_when_interactive_done": long_finished > finished,
                }
            )
            print(
                f"interactive request submitted {submitted - started:.2f} s into the prefill: "
                f"done in {finished - submitted:.2f} s (long request done after "
                f"{long_finished - started:.2f} s)",
                flush=True,
            )
        results.append({"num_preemptions": engine.get_stats().num_preemptions})
    finally:
        await engine.shutdown()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="checkpoint directory (default: the demo model)")
    parser.add_argument("--prompt-tokens", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--delays", type=float, nargs="+", default=[0.5, 2.0, 4.0])
    parser.add_argument("--max-num-batched-tokens", type=int, help="default: the CPU's")
    parser.add_argument("--out", type=Path, help="write cpu_prefill.json here")
    args = parser.parse_args()
    model = args.model or str(ensure_demo_checkpoint(Settings().cache_dir))
    print(f"model {model}, torch threads {torch.get_num_threads()}", flush=True)
    results = {
        "model": model,
        "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),  # other work on the machine skews timings
        "prefill": prefill_rounds(model, args),
        "interactive": asyncio.run(interactive_latency(model, args)),
    }
    results["load_average_at_end"] = os.getloadavg()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "cpu_prefill.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()

"""Mixed priorities: a flood of batch-tier requests plus a trickle of interactive ones.

Prints the interactive requests' time to first token (p50 / p90 / max) and the overall output
throughput, with `scheduling_policy="priority"` and with `"fcfs"`, in one run:

    python bench/priority_latency.py                       # tiny random model, CPU
    python bench/priority_latency.py --shape llama3-8b --device cuda --flood 256 --trickle 16
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch  # noqa: E402
from workload import synthetic_prompts, write_shape_checkpoint  # noqa: E402

from loraplex.engine import AsyncEngine, SamplingParams  # noqa: E402


async def run(engine: AsyncEngine, args: argparse.Namespace, vocab: int) -> dict:
    flood = synthetic_prompts(args.flood, args.flood_prompt, args.flood_prompt, vocab, seed=1)
    trickle = synthetic_prompts(args.trickle, 32, 32, vocab, seed=2)
    batch_params = SamplingParams(
        max_tokens=args.flood_output, temperature=0.0, ignore_eos=True, detokenize=False
    )
    urgent_params = SamplingParams(
        max_tokens=16, temperature=0.0, ignore_eos=True, detokenize=False
    )
    ttfts: list[float] = []
    num_tokens = 0

    async def one(
        request_id: str, prompt: list[int], params: SamplingParams, priority: int, measure: bool
    ) -> None:
        nonlocal num_tokens
        start = time.perf_counter()
        first = True
        async for out in engine.generate(
            {"prompt_token_ids": prompt},
            params,
            request_id,
            priority=priority,
            fairness_key=request_id[:5],
        ):
            if first and out.outputs[0].token_ids:
                if measure:
                    ttfts.append(time.perf_counter() - start)
                first = False
            if out.finished:
                num_tokens += len(out.outputs[0].token_ids)

    start = time.perf_counter()
    tasks = [
        asyncio.create_task(one(f"batch{i}", p, batch_params, 2, False))
        for i, p in enumerate(flood)
    ]
    for i, prompt in enumerate(trickle):
        await asyncio.sleep(args.interval)
        tasks.append(asyncio.create_task(one(f"inter{i}", prompt, urgent_params, 0, True)))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    ttfts.sort()
    return {
        "ttft_p50_s": statistics.median(ttfts),
        "ttft_p90_s": ttfts[int(0.9 * (len(ttfts) - 1))],
        "ttft_max_s": ttfts[-1],
        "output_tok_s": num_tokens / elapsed,
        "seconds": elapsed,
        "preemptions": engine.get_stats().num_preemptions,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model")
    ap.add_argument("--shape", choices=["llama3-8b"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype")
    ap.add_argument("--flood", type=int, default=48)
    ap.add_argument("--flood-prompt", type=int, default=64)
    ap.add_argument("--flood-output", type=int, default=48)
    ap.add_argument("--trickle", type=int, default=8)
    ap.add_argument("--interval", type=float, default=0.3, help="seconds between interactive")
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--preemption-mode", default="swap")
    ap.add_argument("--json")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="loraplex-prio-"))
    if args.shape:
        model_dir = write_shape_checkpoint(args.shape, tmp / args.shape)
    elif args.model:
        model_dir = Path(args.model)
    else:
        from loraplex.platform.demo.tiny_checkpoint import write_random_checkpoint

        model_dir = write_random_checkpoint(
            tmp / "tiny", "llama", hidden_size=256, num_layers=4, intermediate_size=512
        )
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    results = {"model": args.shape or str(model_dir), "device": args.device, "args": vars(args)}
    for policy in ("priority", "fcfs"):

        async def go(policy: str = policy) -> dict:
            engine = AsyncEngine.from_engine_args(
                str(model_dir),
                device=args.device,
                dtype=dtype,
                scheduling_policy=policy,
                max_num_seqs=args.max_num_seqs,
                preemption_mode=args.preemption_mode,
                load_format="dummy" if args.shape else "auto",
                enable_lora=False,
                gpu_memory_utilization=0.45,
            )
            await engine.start()
            try:
                return await run(engine, args, vocab)
            finally:
                await engine.shutdown()

        r = asyncio.run(go())
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()
        results[policy] = r
        print(
            f"{policy:8s}: interactive TTFT p50 {r['ttft_p50_s'] * 1000:8.1f} ms, "
            f"p90 {r['ttft_p90_s'] * 1000:8.1f} ms, max {r['ttft_max_s'] * 1000:8.1f} ms; "
            f"throughput {r['output_tok_s']:8.1f} output tok/s; "
            f"preemptions {r['preemptions']}",
            flush=True,
        )
    fcfs, prio = results["fcfs"], results["priority"]
    print(
        f"interactive TTFT, fcfs / priority: p50 {fcfs['ttft_p50_s'] / prio['ttft_p50_s']:.1f}x, "
        f"p90 {fcfs['ttft_p90_s'] / prio['ttft_p90_s']:.1f}x, "
        f"max {fcfs['ttft_max_s'] / prio['ttft_max_s']:.1f}x; throughput priority / fcfs "
        f"{prio['output_tok_s'] / fcfs['output_tok_s']:.2f}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

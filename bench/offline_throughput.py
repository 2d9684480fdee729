"""Offline throughput: Loraplex vs HF transformers `generate` on the same model, same run.

    python bench/offline_throughput.py                       # demo model (SmolLM2-135M), CPU
    python bench/offline_throughput.py --shape llama3-8b --device cuda --dtype bfloat16 \\
        --num-prompts 64 --min-prompt 512 --max-prompt 512 --output-len 128 --adapters 0,1,8,64

HF runs static batches of `--hf-batch-size` prompts, left-padded (its usual offline use);
Loraplex gets every prompt at once (continuous batching). With `--adapters`, the engine runs the
same workload once per adapter count (requests spread round-robin over random rank
`--lora-rank` adapters on all 7 projections) and prints each run's ratio to the no-adapter run.
`--repeats N` times N rounds that interleave the adapter counts and reports each count's median
(with every round's figure), so one noisy run cannot make or break a ratio.

`--quantization fp8|awq|gptq` runs the engine on a quantized base (with `--shape`: random
weights in that format, 4-bit with group size 128; with `--model`: the checkpoint's own or
online FP8) and skips HF. Every run reports the bytes of the model's weights (`weights_bytes`,
and `linear_weights_bytes` for the decoder's linear layers alone, quantized or not).

`--tensor-parallel-size N` shards the engine's model and adapters over N devices
(docs/tensor_parallel.md; no quantization with N > 1 yet); the weight bytes are then rank 0's
shard, and on CUDA `gpu_peak_bytes_rank0` is rank 0's peak memory. Not run on GPUs yet.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

import torch
from step_breakdown import step_breakdown  # noqa: E402
from torch_profiles import kernel_totals_run, torch_profile_decode  # noqa: E402
from workload import synthetic_prompts, write_random_adapter, write_shape_checkpoint  # noqa: E402

from loraplex.engine import LLM, LoRARequest, SamplingParams  # noqa: E402
from loraplex.engine.model.linear import MergedLinear  # noqa: E402


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run_hf(
    model_dir: Path,
    prompts: list[list[int]],
    output_len: int,
    batch_size: int,
    device: str,
    dtype: torch.dtype,
    dummy: bool,
) -> float:
    from transformers import AutoConfig, AutoModelForCausalLM

    if dummy:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(
                AutoConfig.from_pretrained(model_dir), dtype=dtype
            )
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
    model.eval()
    start = time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        batch = prompts[i : i + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
        with torch.no_grad():
            model.generate(
                ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=output_len,
                min_new_tokens=output_len,
                pad_token_id=0,
            )
    sync(device)
    elapsed = time.perf_counter() - start
    del model
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return elapsed


# The caching allocator's counters that mean a device-wide wait or a driver call: a retry frees
# the cache (synchronizing the device) and allocates again.
ALLOCATOR_EVENTS = ("num_alloc_retries", "num_device_alloc", "num_device_free")


def allocator_events(device: str) -> dict[str, int]:
    """The CUDA caching allocator's counters of ALLOCATOR_EVENTS so far (empty off CUDA)."""
    if device != "cuda":
        return {}
    stats = torch.cuda.memory_stats()
    return {name: stats.get(name, 0) for name in ALLOCATOR_EVENTS}


def run_engine(
    llm: LLM,
    prompts: list[list[int]],
    output_len: int,
    loras: list[LoRARequest | None],
    device: str,
    warm_up: bool = True,
) -> tuple[float, dict[str, float], dict[str, int]]:
    """(seconds of one timed run, the engine's counters over it (`engine_counters`), the
    allocator's `allocator_events` during the run)."""
    params = SamplingParams(
        max_tokens=output_len, temperature=0.0, ignore_eos=True, detokenize=False
    )
    requests = [{"prompt_token_ids": p} for p in prompts]
    if warm_up:  # the same workload once, so every kernel shape is compiled before timing
        llm.generate(requests, params, lora_request=loras, use_tqdm=False)
    sync(device)
    before = engine_counters(llm)
    events = allocator_events(device)
    start = time.perf_counter()
    outs = llm.generate(requests, params, lora_request=loras, use_tqdm=False)
    sync(device)
    seconds = time.perf_counter() - start
    assert all(len(o.outputs[0].token_ids) == output_len for o in outs)
    events = {k: v - events[k] for k, v in allocator_events(device).items()}
    counters = {k: v - before[k] for k, v in engine_counters(llm).items()}
    return seconds, counters, events


def engine_counters(llm: LLM) -> dict[str, float]:
    """Where the engine's step time went: waiting on the GPU's tokens, preparing and launching
    steps (inputs, LoRA mapping, the forward's kernel launches), and its number of steps."""
    stats = llm.engine.get_stats()
    return {
        "steps": stats.num_steps,
        "step_seconds": stats.step_seconds,
        "result_wait_seconds": stats.result_wait_seconds,
        "launch_seconds": stats.launch_seconds,
    }


def weights_bytes(llm: LLM) -> tuple[int, int]:
    """(all weights, the decoder's linear layers only) in bytes: parameters and buffers."""
    model = llm.engine.runner.model
    total = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    linear = sum(
        t.numel() * t.element_size()
        for m in model.modules()
        if isinstance(m, MergedLinear)
        for t in (*m.parameters(), *m.buffers())
    )
    return total, linear


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", help="HF checkpoint dir (default: the demo model)")
    ap.add_argument(
        "--shape", choices=["llama3-8b", "llama3-70b", "tiny"], help="random weights at a shape"
    )
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--min-prompt", type=int, default=16)
    ap.add_argument("--max-prompt", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--hf-batch-size", type=int, default=8)
    ap.add_argument(
        "--max-num-seqs", type=int, default=None, help="default: the engine's for the device"
    )
    ap.add_argument("--max-num-batched-tokens", type=int, default=4096)
    ap.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=None,
        help="default: the engine's (0.9) with --skip-hf, else 0.6 (HF's run shares the device)",
    )
    ap.add_argument("--adapters", default="", help="adapter counts, e.g. 0,1,8,64")
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument(
        "--max-loras", type=int, default=None, help="per-step adapter cap (default: none)"
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="timed rounds over all adapter counts, interleaved; medians reported",
    )
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument(
        "--skip-breakdown",
        action="store_true",
        help="no per-step breakdown run after the timed rounds (saves one run per count)",
    )
    ap.add_argument(
        "--quantization",
        choices=["none", "fp8", "awq", "gptq"],
        default="none",
        help="quantized base for the engine (HF is skipped)",
    )
    ap.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="shard the engine's model over N devices (no quantization with N > 1)",
    )
    ap.add_argument(
        "--no-async-scheduling",
        action="store_true",
        help="run one step at a time (the host waits for each step's tokens before the next)",
    )
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--torch-profile", help="write a torch.profiler table of one run here")
    ap.add_argument(
        "--kernel-totals", help="write the GPU kernel time of one whole run, per kernel, here"
    )
    ap.add_argument("--decode-profile", help="write cProfile tables of the decode steps here")
    ap.add_argument(
        "--prefill-profile", help="write cProfile tables of the prefill-carrying steps here"
    )
    args = ap.parse_args()
    if args.gpu_memory_utilization is None:
        args.gpu_memory_utilization = 0.9 if args.skip_hf else 0.6
    # The runner's start-up lines: CUDA-graph capture and kernel warm-up, each with its time.
    logging.basicConfig(format="%(message)s")
    logging.getLogger("loraplex.engine.runner").setLevel(logging.INFO)

    dtype_name = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    dtype = getattr(torch, dtype_name)
    tmp = Path(tempfile.mkdtemp(prefix="loraplex-bench-"))
    dummy = args.shape is not None
    if dummy:
        model_dir = write_shape_checkpoint(args.shape, tmp / args.shape)
    elif args.model:
        model_dir = Path(args.model)
    else:
        from loraplex.platform.demo.checkpoint import ensure_demo_checkpoint

        model_dir = ensure_demo_checkpoint(tmp)
    config = json.loads((model_dir / "config.json").read_text())
    prompts = synthetic_prompts(
        args.num_prompts, args.min_prompt, args.max_prompt, config["vocab_size"]
    )
    num_out = args.num_prompts * args.output_len
    results: dict = {
        "model": args.shape or str(model_dir),
        "device": args.device,
        "dtype": dtype_name,
        "num_prompts": args.num_prompts,
        "prompt_len": [args.min_prompt, args.max_prompt],
        "output_len": args.output_len,
        "quantization": args.quantization,
        "tensor_parallel_size": args.tensor_parallel_size,
        "async_scheduling": not args.no_async_scheduling,
        "runs": {},
    }
    if args.device == "cuda":
        results["gpu"] = torch.cuda.get_device_name()

    quantization = None if args.quantization == "none" else args.quantization
    if not args.skip_hf and quantization is None:
        hf_s = run_hf(
            model_dir, prompts, args.output_len, args.hf_batch_size, args.device, dtype, dummy
        )
        results["runs"]["hf"] = {"seconds": hf_s, "output_tok_s": num_out / hf_s}
        print(
            f"HF transformers generate (static batches of {args.hf_batch_size}): "
            f"{num_out / hf_s:9.1f} output tok/s ({hf_s:.2f} s)",
            flush=True,
        )

    counts = [int(c) for c in args.adapters.split(",")] if args.adapters else [0]
    start_up = time.perf_counter()
    llm = LLM(
        str(model_dir),
        device=args.device,
        dtype=dtype_name,
        load_format="dummy" if dummy else "auto",
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enable_prefix_caching=False,
        enable_lora=max(counts) > 0,
        max_loras=args.max_loras,
        max_lora_rank=max(args.lora_rank, 8),
        max_cpu_loras=max(max(counts), 1),
        quantization=quantization,
        tensor_parallel_size=args.tensor_parallel_size,
        async_scheduling=not args.no_async_scheduling,
    )
    start_up = time.perf_counter() - start_up
    results["start_up_seconds"] = start_up
    print(f"engine start-up (load, graphs, kernel warm-up): {start_up:.1f} s", flush=True)
    total_bytes, linear_bytes = weights_bytes(llm)
    results["weights_bytes"], results["linear_weights_bytes"] = total_bytes, linear_bytes
    print(
        f"weights ({args.quantization}, rank 0 of {args.tensor_parallel_size}): "
        f"{total_bytes / 2**30:.2f} GiB, of which the decoder's "
        f"linear layers {linear_bytes / 2**30:.2f} GiB",
        flush=True,
    )
    workloads: dict[int, list[LoRARequest | None]] = {}
    for count in counts:
        loras: list[LoRARequest | None] = [None] * len(prompts)
        if count:
            reqs = [
                LoRARequest(
                    f"a{i}",
                    i + 1,
                    str(write_random_adapter(tmp / f"adapter{i}", config, args.lora_rank, seed=i)),
                )
                for i in range(count)
            ]
            loras = [reqs[i % count] for i in range(len(prompts))]
        workloads[count] = loras
    # Rounds interleave the adapter counts (0, 1, 8, 0, 1, 8, ...) so that a drift of the
    # machine (clocks, other tenants) hits each alike; each count reports its median.
    order = [c for _ in range(args.repeats) for c in counts]
    timings: dict[int, list[float]] = {count: [] for count in counts}
    allocs: dict[int, list[dict[str, int]]] = {count: [] for count in counts}
    counters: dict[int, list[dict[str, float]]] = {count: [] for count in counts}
    breakdowns: dict[int, dict] = {}
    for i, count in enumerate(order):
        seconds, round_counters, events = run_engine(
            llm, prompts, args.output_len, workloads[count], args.device, warm_up=not timings[count]
        )
        timings[count].append(seconds)
        counters[count].append(round_counters)
        allocs[count].append(events)
        if count in order[i + 1 :] or args.skip_breakdown:
            continue
        # This count's last round: its per-step breakdown, while its adapters are resident.
        profiles = {"decode": args.decode_profile, "prefill": args.prefill_profile}
        breakdowns[count] = step_breakdown(
            llm, prompts, args.output_len, workloads[count], args.device, profiles,
            f"{count} adapters",
        )  # fmt: skip
    base_tok_s = None
    for count in counts:
        loras = workloads[count]
        seconds = statistics.median(timings[count])
        tok_s = num_out / seconds
        base_tok_s = base_tok_s or tok_s
        breakdown = breakdowns.get(count, {})
        if args.kernel_totals and args.device == "cuda":
            with open(args.kernel_totals, "a") as f:
                f.write(f"=== {count} adapters: one whole run ===\n")
                f.write(kernel_totals_run(llm, prompts, args.output_len, loras) + "\n")
        if args.torch_profile:
            with open(args.torch_profile, "a") as f:
                f.write(f"=== {count} adapters ===\n")
                f.write(torch_profile_decode(llm, prompts, loras, args.device) + "\n")
        results["runs"][f"loraplex_{count}_adapters"] = {
            "seconds": seconds,
            "output_tok_s": tok_s,
            "ratio_to_no_adapter": tok_s / base_tok_s,
            "seconds_each_round": timings[count],
            "result_wait_seconds_each_round": [c["result_wait_seconds"] for c in counters[count]],
            "engine_counters_each_round": counters[count],
            "allocator_events_each_round": allocs[count],
            **breakdown,
        }
        line = f"Loraplex, {count:3d} adapters (rank {args.lora_rank}): {tok_s:9.1f} output tok/s"
        line += f" ({seconds:.2f} s), {tok_s / base_tok_s:.3f}x the no-adapter run"
        if "hf" in results["runs"]:
            line += f", {tok_s / results['runs']['hf']['output_tok_s']:.2f}x HF"
        print(line, flush=True)
        if args.repeats > 1:
            rounds = ", ".join(f"{num_out / t:.0f}" for t in timings[count])
            print(f"    median of {args.repeats} rounds (tok/s each: {rounds})", flush=True)
        # Waiting on the GPU's tokens. A high share means the GPU set the pace; a low one alone
        # does not mean the host did: a launch blocked on CUDA's full launch queue counts as
        # host time (compare the round with its GPU kernel time, --kernel-totals).
        shares = ", ".join(
            f"{c['result_wait_seconds'] / t:.2f}"
            for c, t in zip(counters[count], timings[count], strict=True)
        )
        print(f"    share of each round waiting on the device: {shares}", flush=True)
        # A step's host time, split: preparing and launching it, and the rest (scheduling, the
        # step before's outputs). Above the GPU's step time, the host sets the pace.
        per_step = ", ".join(
            f"{1000 * c['launch_seconds'] / c['steps']:.1f} + "
            f"{1000 * (c['step_seconds'] - c['launch_seconds'] - c['result_wait_seconds']) / c['steps']:.1f}"
            for c in counters[count]
        )
        print(f"    host ms per step (launch + rest), each round: {per_step}", flush=True)
        if args.device == "cuda":  # a retry or a driver call inside a timed round
            print(f"    allocator events in each round: {allocs[count]}", flush=True)
        if breakdown:
            print(
                f"    steps: {breakdown['prefill_steps']} with prefill "
                f"({breakdown['prefill_s']:.2f} s), {breakdown['decode_steps']} decode-only "
                f"({breakdown['decode_step_ms']:.2f} ms each)",
                flush=True,
            )
    results["engine_stats"] = dataclasses.asdict(llm.engine.get_stats())
    if args.device == "cuda":
        results["gpu_peak_bytes_rank0"] = torch.cuda.max_memory_allocated()
    llm.shutdown()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

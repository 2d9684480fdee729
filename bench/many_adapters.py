"""Many adapters: throughput as the number of live adapters grows, and the cost of a cold load.

    python bench/many_adapters.py --shape llama3-8b --adapters 0,8,64,256,1024 --zipf 1.0 \\
        --ranks 8,16,32,64 --rounds 3 --json out.json

Workload (the same requests in every round; prefix caching off): `--num-prompts` requests of
`--min-prompt`..`--max-prompt` prompt tokens and `--output-len` output tokens. With N adapters
the requests pick adapters by Zipf(`--zipf`) popularity over N adapters on q/k/v/o, ranks taken
in turn from `--ranks`; 0 = the base model. Rounds interleave the adapter counts (0, 8, 64, ...,
0, 8, ...), each count reports the median of its rounds and its ratio to the 8-adapter run. The
engine runs with its defaults (no per-step adapter cap, adapters resident as memory allows).

Adapter files: N adapters of Llama-3-8B shape would take tens of GB of disk, so `--files-per-rank`
distinct PEFT directories per rank back them, each adapter registered under its own content hash
(as the platform registers uploads): to the engine every adapter is a different one (its own
pages, loads and evictions); only the weight values repeat.

Then, with the engine otherwise idle, the added time to first token of a request whose adapter
(rank 16 on all 7 projections: 84 MB in bf16 at Llama-3-8B shape) was never seen (read from disk)
and of one whose adapter waits in the CPU cache, against one whose adapter is resident; and the
step-time jitter of a running decode batch while a new adapter loads (steps during the load vs
the median step before it).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from workload import synthetic_prompts, write_random_adapter, write_shape_checkpoint

from loraplex.engine import LLM, LoRARequest, SamplingParams
from loraplex.engine.llm_engine import LLMEngine
from loraplex.engine.stats import AdapterLoad

QKVO = ("q_proj", "k_proj", "v_proj", "o_proj")
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def zipf_choices(num_requests: int, num_adapters: int, s: float, seed: int) -> list[int]:
    rng = random.Random(seed)
    weights = [1.0 / (i + 1) ** s for i in range(num_adapters)]
    return rng.choices(range(num_adapters), weights=weights, k=num_requests)


def fake_hash(tag: str) -> str:
    return hashlib.sha256(tag.encode()).hexdigest()


def make_adapters(
    count: int, ranks: list[int], files: dict[int, list[Path]], tag: str, first_id: int
) -> list[LoRARequest]:
    """`count` distinct adapters (own ids and content hashes) over the shared files."""
    out = []
    for i in range(count):
        rank = ranks[i % len(ranks)]
        path = files[rank][(i // len(ranks)) % len(files[rank])]
        out.append(LoRARequest(f"{tag}-{i}", first_id + i, str(path), fake_hash(f"{tag}-{i}")))
    return out


def run_round(
    llm: LLM, prompts: list[list[int]], loras: list[LoRARequest | None], output_len: int
) -> float:
    params = SamplingParams(
        max_tokens=output_len, temperature=0.0, ignore_eos=True, detokenize=False
    )
    sync()
    start = time.perf_counter()
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts], params, lora_request=loras, use_tqdm=False
    )
    sync()
    assert all(len(o.outputs[0].token_ids) == output_len for o in outs)
    return time.perf_counter() - start


def kernel_profile(
    llm: LLM, prompts: list[list[int]], loras: list[LoRARequest | None], output_len: int
) -> dict[str, Any]:
    """GPU milliseconds per kernel name over one round (torch.profiler, CUDA activity only),
    with the round's steps and wall seconds: where an adapter count's extra time goes."""
    from torch.profiler import ProfilerActivity, profile

    steps = llm.engine.num_steps
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        seconds = run_round(llm, prompts, loras, output_len)
    totals = {
        event.key: event.self_device_time_total / 1e3
        for event in prof.key_averages()
        if event.self_device_time_total > 0
    }
    totals = dict(sorted(totals.items(), key=lambda kv: -kv[1]))
    return {"steps": llm.engine.num_steps - steps, "wall_s": seconds, "gpu_ms": totals}


def print_kernel_profiles(profiles: dict[int, dict]) -> None:
    counts = list(profiles)
    names = list(dict.fromkeys(n for p in profiles.values() for n in list(p["gpu_ms"])[:12]))
    print("GPU ms per round by kernel (profiled rounds; " + ", ".join(
        f"{c} adapters: {p['steps']} steps, {p['wall_s']:.2f} s" for c, p in profiles.items()
    ) + ")")  # fmt: skip
    print("".join(f"{c:>10}" for c in counts) + "  kernel")
    for name in names:
        cells = "".join(f"{profiles[c]['gpu_ms'].get(name, 0.0):10.1f}" for c in counts)
        print(f"{cells}  {name[:90]}")
    totals = "".join(f"{sum(profiles[c]['gpu_ms'].values()):10.1f}" for c in counts)
    print(f"{totals}  (all kernels)", flush=True)


def time_to_first_token(engine: LLMEngine, lora: LoRARequest | None, prompt: list[int]) -> float:
    """Seconds from add to the first token, the engine otherwise idle."""
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False)
    request_id = f"ttft-{time.perf_counter_ns()}"
    sync()
    start = time.perf_counter()
    engine.add_request(request_id, {"prompt_token_ids": prompt}, params, lora_request=lora)
    while engine.has_unfinished_requests():
        if any(o.outputs[0].token_ids for o in engine.step()):
            break
    elapsed = time.perf_counter() - start
    while engine.has_unfinished_requests():
        engine.step()
    return elapsed


def cold_adapter(files: list[Path], tag: str, trial: int) -> LoRARequest:
    """A different adapter to the engine for each (tag, trial): its own id and content hash."""
    path = files[trial % len(files)]
    lora_int_id = 900_000 + 10 * trial + ["resident", "disk", "cpu"].index(tag)
    return LoRARequest(f"{tag}{trial}", lora_int_id, str(path), fake_hash(f"cold-{tag}-{trial}"))


def cold_load(engine: LLMEngine, files: list[Path], prompt: list[int], trials: int = 11) -> dict:
    """Added TTFT of a never-seen adapter (read from disk) and of one in the CPU cache only,
    against a resident one: medians over `trials`, each trial with adapters of its own (new
    content hashes over `files`, so each is a different adapter to the engine), and the
    engine's own time from disk to packed pages."""
    manager = engine.lora_manager
    assert manager is not None
    loads: list[AdapterLoad] = []
    manager.on_adapter_load, hook = loads.append, manager.on_adapter_load

    resident = cold_adapter(files, "resident", 0)
    time_to_first_token(engine, resident, prompt)  # now resident
    base, disk, cpu, disk_loads = [], [], [], []
    for trial in range(trials):
        base.append(time_to_first_token(engine, resident, prompt))
        del loads[:]
        disk.append(
            time_to_first_token(engine, cold_adapter(files, "disk", trial), prompt) - base[-1]
        )
        disk_loads += [load.seconds for load in loads if load.tier == "cpu"]
        from_cpu = cold_adapter(files, "cpu", trial)
        manager.add_lora(from_cpu)  # read into the CPU cache now, not uploaded
        cpu.append(time_to_first_token(engine, from_cpu, prompt) - base[-1])
    manager.on_adapter_load = hook
    return {
        "trials": trials,
        "ttft_resident_ms": 1000 * statistics.median(base),
        "added_ttft_from_disk_ms": 1000 * statistics.median(disk),
        "added_ttft_from_cpu_cache_ms": 1000 * statistics.median(cpu),
        "disk_to_packed_ms": 1000 * statistics.median(disk_loads),
        "each_trial_ms": {
            "resident": [round(1000 * x, 2) for x in base],
            "added_from_disk": [round(1000 * x, 2) for x in disk],
            "added_from_cpu_cache": [round(1000 * x, 2) for x in cpu],
        },
    }


def load_jitter(engine: LLMEngine, resident: LoRARequest, new: LoRARequest, prompts) -> dict:
    """Step times of a decode batch (64 requests, resident adapter) before and while a
    never-seen adapter loads for one more request."""
    params = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True, detokenize=False)
    for i in range(64):
        prompt = prompts[i % len(prompts)]
        engine.add_request(f"jit{i}", {"prompt_token_ids": prompt}, params, lora_request=resident)
    for _ in range(8):  # through the prefills
        engine.step()
    steps_before, steps_during = [], []
    manager = engine.lora_manager
    assert manager is not None
    for step in range(120):
        if step == 40:
            engine.add_request("jit-new", {"prompt_token_ids": prompts[-1]}, params, new)
        sync()
        start = time.perf_counter()
        engine.step()
        sync()
        elapsed = time.perf_counter() - start
        loading = step >= 40 and not any(
            r.request_id == "jit-new" for r in engine.scheduler.running
        )
        (steps_during if loading else steps_before if step < 40 else []).append(elapsed)
    while engine.has_unfinished_requests():
        engine.step()
    median = statistics.median(steps_before)
    return {
        "decode_step_median_ms": 1000 * median,
        "steps_while_loading": len(steps_during),
        "max_step_delay_while_loading_ms": 1000 * (max(steps_during, default=median) - median),
        "step_delays_while_loading_ms": [round(1000 * (t - median), 2) for t in steps_during],
        "step_spread_before_ms": [
            round(1000 * (min(steps_before) - median), 2),
            round(1000 * (max(steps_before) - median), 2),
        ],
    }


def jitter_causes(
    engine: LLMEngine, resident: LoRARequest, config: dict, tmp: Path, prompts
) -> dict:
    """The jitter run again under changed conditions, each with a never-seen adapter: packed
    into pageable memory of its own (not the CPU cache's pinned pages: its upload waits for the
    host), and into the pinned pages with the interpreter switching threads every 5 ms
    (CPython's default: the loader's Python can hold the GIL that long) and every 0.2 ms (the
    engine sets 0.5 ms, `switch_interval_ms`)."""
    manager = engine.lora_manager
    assert manager is not None
    out = {}
    for i, (name, pinned, interval) in enumerate(
        [("pageable", False, None), ("gil_5ms", True, 0.005), ("gil_0.2ms", True, 0.0002)]
    ):
        path = write_random_adapter(tmp / f"jitter-{name}", config, 16, seed=9000 + i, modules=ALL)
        new = LoRARequest(f"jitter-{name}", 900_200 + i, str(path), fake_hash(f"j-{name}"))
        host_pages, default_interval = manager.loader.host_pages, sys.getswitchinterval()
        if not pinned:
            manager.loader.host_pages = None
        if interval is not None:
            sys.setswitchinterval(interval)
        try:
            out[name] = load_jitter(engine, resident, new, prompts)
        finally:
            manager.loader.host_pages = host_pages
            sys.setswitchinterval(default_interval)
        print(name, json.dumps(out[name]), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shape", default="llama3-8b", choices=["llama3-8b", "tiny"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--num-prompts", type=int, default=512)
    ap.add_argument("--min-prompt", type=int, default=256)
    ap.add_argument("--max-prompt", type=int, default=768)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--adapters", default="0,8,64,256,1024")
    ap.add_argument("--zipf", type=float, default=1.0)
    ap.add_argument("--ranks", default="8,16,32,64")
    ap.add_argument("--rounds", type=int, default=3, help="0: only the cold-load measurements")
    ap.add_argument("--files-per-rank", type=int, default=4)
    ap.add_argument("--skip-cold", action="store_true", help="throughput rounds only")
    ap.add_argument(
        "--jitter-causes",
        action="store_true",
        help="repeat the jitter run with a pageable CPU buffer, then with GIL switch intervals "
        "of 5 and 0.2 ms: what delays the running batch's steps",
    )
    ap.add_argument(
        "--kernel-profile",
        action="store_true",
        help="after the rounds, one more round per adapter count under torch.profiler: GPU "
        "time per kernel",
    )
    ap.add_argument("--engine-args", default="{}", help="more LLM(...) keywords, as a JSON object")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="loraplex-many-"))
    model_dir = write_shape_checkpoint(args.shape, tmp / args.shape)
    config = json.loads((model_dir / "config.json").read_text())
    ranks = [int(r) for r in args.ranks.split(",")]
    counts = [int(c) for c in args.adapters.split(",")]
    files = {
        rank: [
            write_random_adapter(
                tmp / f"r{rank}-{j}", config, rank, seed=100 * rank + j, modules=QKVO
            )
            for j in range(args.files_per_rank)
        ]
        for rank in ranks
    }
    prompts = synthetic_prompts(
        args.num_prompts, args.min_prompt, args.max_prompt, config["vocab_size"]
    )
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    llm = LLM(
        str(model_dir),
        load_format="dummy",
        dtype=dtype,
        device=args.device,
        enable_prefix_caching=False,
        **json.loads(args.engine_args),
    )
    workloads: dict[int, list[LoRARequest | None]] = {}
    next_id = 1
    for count in counts:
        adapters = make_adapters(count, ranks, files, f"n{count}", next_id)
        next_id += count
        picks = zipf_choices(len(prompts), max(count, 1), args.zipf, seed=count)
        workloads[count] = [adapters[p] if count else None for p in picks]
    results: dict = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "args": vars(args),
        "distinct_adapters_used": {c: len({id(x) for x in w if x}) for c, w in workloads.items()},
        "runs": {},
    }
    num_out = args.num_prompts * args.output_len
    # Warm-up: compiles every kernel shape once (the base model and one adapter round).
    if args.rounds:
        run_round(llm, prompts[:64], workloads[counts[-1]][:64], args.output_len)
    timings: dict[int, list[float]] = {c: [] for c in counts}
    for round_index in range(args.rounds):
        for count in counts:
            seconds = run_round(llm, prompts, workloads[count], args.output_len)
            timings[count].append(seconds)
            print(
                f"round {round_index}: {count:5d} adapters {num_out / seconds:9.1f} tok/s",
                flush=True,
            )
    reference = statistics.median(timings[8]) if 8 in timings and args.rounds else None
    for count in counts if args.rounds else ():
        seconds = statistics.median(timings[count])
        run = {
            "output_tok_s": num_out / seconds,
            "seconds_each_round": timings[count],
            "ratio_to_8_adapters": reference / seconds if reference else None,
        }
        results["runs"][str(count)] = run
        ratio = f", {run['ratio_to_8_adapters']:.3f}x the 8-adapter run" if reference else ""
        print(f"{count:5d} adapters: {run['output_tok_s']:9.1f} output tok/s{ratio}", flush=True)

    if args.kernel_profile:
        profiles = {
            count: kernel_profile(llm, prompts, workloads[count], args.output_len)
            for count in counts
        }
        results["kernel_profile"] = profiles
        print_kernel_profiles(profiles)

    if not args.skip_cold:
        engine = llm.engine
        big_files = [
            write_random_adapter(tmp / f"big{j}", config, 16, seed=7000 + j, modules=ALL)
            for j in range(3)
        ]
        size_mb = sum(p.stat().st_size for p in big_files[0].iterdir()) / 1e6
        cold = cold_load(engine, big_files, prompts[0][:256])
        cold["adapter_mb"] = size_mb
        results["cold_load"] = cold
        print(json.dumps(cold, indent=1), flush=True)
        resident = cold_adapter(big_files, "resident", 0)
        new_file = write_random_adapter(tmp / "jitter", config, 16, seed=9999, modules=ALL)
        jitter = load_jitter(
            engine, resident, LoRARequest("jitter", 900_100, str(new_file), fake_hash("j")), prompts
        )
        results["load_jitter"] = jitter
        print(json.dumps(jitter, indent=1), flush=True)
        if args.jitter_causes:
            results["load_jitter_causes"] = jitter_causes(engine, resident, config, tmp, prompts)
    results["engine_stats"] = dataclasses.asdict(llm.engine.get_stats())
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

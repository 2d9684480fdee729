"""torch.profiler views of an engine run for bench/offline_throughput.py: the kernels of a few
decode-only steps (`--torch-profile`), and the GPU time of one whole run per kernel
(`--kernel-totals`)."""

from __future__ import annotations

import time

import torch

from loraplex.engine import LLM, LoRARequest, SamplingParams


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def torch_profile_decode(
    llm: LLM,
    prompts: list[list[int]],
    loras: list[LoRARequest | None],
    device: str,
    num_steps: int = 20,
) -> str:
    """torch.profiler's tables (GPU kernels, then host) of `num_steps` decode-only steps of a
    batch of up to 64 of the prompts: where a decode step's time goes, kernel by kernel."""
    from torch.profiler import ProfilerActivity, profile

    engine = llm.engine
    params = SamplingParams(
        max_tokens=num_steps + 8, temperature=0.0, ignore_eos=True, detokenize=False
    )
    batch = min(len(prompts), 64)
    for i in range(batch):
        engine.add_request(f"tprof{i}", {"prompt_token_ids": prompts[i]}, params, loras[i])
    while engine.scheduler.waiting or any(
        r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running
    ):
        engine.step()
    for _ in range(2):  # past the first decode steps (and their CUDA graph's warm-up)
        engine.step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    _sync(device)
    with profile(activities=activities) as prof:
        for _ in range(num_steps):
            engine.step()
        _sync(device)
    while engine.has_unfinished_requests():
        engine.step()
    sort = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    averages = prof.key_averages()
    return (
        f"{num_steps} decode steps of batch {batch}\n"
        + averages.table(sort_by=sort, row_limit=40)
        + "\n"
        + averages.table(sort_by="self_cpu_time_total", row_limit=20)
    )


def kernel_totals_run(
    llm: LLM,
    prompts: list[list[int]],
    output_len: int,
    loras: list[LoRARequest | None],
    row_limit: int = 30,
) -> str:
    """GPU kernel time of one whole run of the workload, by kernel name (torch.profiler, CUDA
    activity only): where a run's GPU time goes, prefill and decode steps together."""
    from torch.profiler import ProfilerActivity, profile

    params = SamplingParams(
        max_tokens=output_len, temperature=0.0, ignore_eos=True, detokenize=False
    )
    requests = [{"prompt_token_ids": p} for p in prompts]
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        llm.generate(requests, params, lora_request=loras, use_tqdm=False)
        torch.cuda.synchronize()
        wall_s = time.perf_counter() - start
    idle_lines = device_gaps(prof.events()) + kernel_sizes(prof.events())
    idle_lines.append(
        f"Host wall time of this run: {wall_s:.3f} s (the device's span above is within it)"
    )
    rows = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    rows.sort(key=lambda e: e.self_device_time_total, reverse=True)
    total_us = sum(e.self_device_time_total for e in rows)
    lines = [f"GPU kernel time of the run: {total_us / 1e6:.3f} s"]
    lines.append(f"{'ms':>10} {'share':>6} {'calls':>8} {'us/call':>8}  kernel")
    for e in rows[:row_limit]:
        ms = e.self_device_time_total / 1e3
        share = e.self_device_time_total / total_us
        per_call = e.self_device_time_total / max(e.count, 1)
        lines.append(f"{ms:10.1f} {share:6.1%} {e.count:8d} {per_call:8.1f}  {e.key[:90]}")
    return "\n".join(lines + idle_lines)


GAP_BOUNDS_US = (5, 20, 100, 1000)


def _ranges(bounds: tuple[int, ...]) -> list[tuple[float, float]]:
    """[lo, hi) ranges from 0 through the bounds to infinity: (5, 20) -> 0-5, 5-20, 20-inf."""
    return list(zip((0, *bounds), (*bounds, float("inf")), strict=True))


def device_gaps(events: list, row_limit: int = 12) -> list[str]:
    """Where the device sat idle during the run: the span from the first kernel (or copy) to
    the last, less the union of their intervals (side-stream kernels overlap the main
    stream's), the idle gaps by size, and the kernels after which the most idle time began
    (a gap after kernel K: nothing was queued behind K in time)."""
    intervals = sorted(
        (e.time_range.start, e.time_range.end, e.name)
        for e in events
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start
    )
    if not intervals:
        return []
    gaps: list[tuple[float, str]] = []  # (idle us, the kernel that ended just before it)
    busy_until, last_name = intervals[0][1], intervals[0][2]
    for start, end, name in intervals[1:]:
        if start > busy_until:
            gaps.append((start - busy_until, last_name))
        if end > busy_until:
            busy_until, last_name = end, name
    span = busy_until - intervals[0][0]
    idle = sum(g for g, _ in gaps)
    lines = [
        "",
        f"Device idle: {idle / 1e6:.3f} s of the {span / 1e6:.3f} s from the first kernel to the "
        f"last ({len(gaps)} gaps)",
    ]
    for lo, hi in _ranges(GAP_BOUNDS_US):
        sizes = [g for g, _ in gaps if lo <= g < hi]
        lines.append(f"  gaps of {lo}-{hi} us: {len(sizes):7d}, {sum(sizes) / 1e3:9.1f} ms")
    after: dict[str, list[float]] = {}
    for g, name in gaps:
        after.setdefault(name[:90], []).append(g)
    lines.append(f"{'idle ms':>10} {'gaps':>7} {'us/gap':>8}  after kernel")
    for name, sizes in sorted(after.items(), key=lambda kv: -sum(kv[1]))[:row_limit]:
        total = sum(sizes)
        lines.append(f"{total / 1e3:10.1f} {len(sizes):7d} {total / len(sizes):8.1f}  {name}")
    return lines


SIZE_BOUNDS_US = (10, 30, 100, 300)


def kernel_sizes(events: list, name_parts: tuple[str, ...] = ("lora", "silu")) -> list[str]:
    """GPU time of the kernels whose name contains one of `name_parts`, by the duration of each
    call: the short calls are decode-sized steps, the long ones prefill (a kernel's table row
    alone mixes them)."""
    by_name: dict[str, list[float]] = {}
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CUDA and any(
            part in e.name for part in name_parts
        ):
            by_name.setdefault(e.name[:40], []).append(e.time_range.end - e.time_range.start)
    if not by_name:
        return []
    bounds = _ranges(SIZE_BOUNDS_US)
    header = "".join(f"{f'{lo}-{hi} us':>20}" for lo, hi in bounds)
    lines = ["", f"{'kernel (ms in calls of each duration, calls)':<40}{header}"]
    for name, durations in sorted(by_name.items(), key=lambda kv: -sum(kv[1])):
        cells = ""
        for lo, hi in bounds:
            sizes = [d for d in durations if lo <= d < hi]
            cells += f"{sum(sizes) / 1e3:12.1f} {len(sizes):7d}"
        lines.append(f"{name:<40}{cells}")
    return lines

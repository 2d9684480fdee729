"""torch.profiler views of an engine run for bench/offline_throughput.py: the kernels of a few
decode-only steps (`--torch-profile`), and the GPU time of one whole run per kernel
(`--kernel-totals`)."""

from __future__ import annotations

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
        llm.generate(requests, params, lora_request=loras, use_tqdm=False)
        torch.cuda.synchronize()
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
    return "\n".join(lines)

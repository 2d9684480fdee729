"""Per-step wall time of an engine run for bench/offline_throughput.py: steps that carry a prefill
against decode-only steps, each kind optionally under cProfile (where its host time goes)."""

from __future__ import annotations

import cProfile
import io
import pstats
import time

import torch

from loraplex.engine import LLM, LoRARequest, SamplingParams


def step_breakdown(
    llm: LLM,
    prompts: list[list[int]],
    output_len: int,
    loras: list[LoRARequest | None],
    device: str,
    profile_paths: dict[str, str | None],
    label: str,
) -> dict:
    """Per-step wall time, split into prefill-carrying steps and pure decode steps. For each
    kind ("prefill", "decode") with a path in `profile_paths`, its steps run under cProfile and
    the table (by own time) is appended to that file under `label`: where the host time of that
    kind of step goes (time waiting on the GPU's tokens shows as the engine's result wait)."""
    profiles = {kind: cProfile.Profile() for kind, path in profile_paths.items() if path}
    engine = llm.engine
    params = SamplingParams(
        max_tokens=output_len, temperature=0.0, ignore_eos=True, detokenize=False
    )
    for i, (prompt, lora) in enumerate(zip(prompts, loras, strict=True)):
        engine.add_request(f"prof{i}", {"prompt_token_ids": prompt}, params, lora_request=lora)
    seconds = {"prefill": 0.0, "decode": 0.0}
    steps = {"prefill": 0, "decode": 0}
    if device == "cuda":
        torch.cuda.synchronize()
    # No sync between steps: with async scheduling a step() call launches one step and
    # collects the one before, so in a steady run each call lasts one step of the GPU's.
    while engine.has_unfinished_requests():
        is_decode = (
            all(
                r.num_computed_tokens == r.num_tokens_with_placeholders - 1
                for r in engine.scheduler.running
            )
            and not engine.scheduler.waiting
        )
        kind = "decode" if is_decode else "prefill"
        profile = profiles.get(kind)
        if profile is not None:
            profile.enable()
        start = time.perf_counter()
        engine.step()
        seconds[kind] += time.perf_counter() - start
        if profile is not None:
            profile.disable()
        steps[kind] += 1
    for kind, profile in profiles.items():
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
        with open(str(profile_paths[kind]), "a") as f:
            f.write(f"=== {label}: {kind} steps ===\n{text.getvalue()}\n")
    return {
        "prefill_steps": steps["prefill"],
        "prefill_s": seconds["prefill"],
        "decode_steps": steps["decode"],
        "decode_step_ms": 1000 * seconds["decode"] / max(steps["decode"], 1),
    }

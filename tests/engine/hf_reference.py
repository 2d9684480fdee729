"""HF transformers (+ PEFT) as the oracle: greedy continuations of the same prompts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn


def hf_greedy(
    model_dir: Path,
    prompts: list[list[int]],
    max_tokens: int,
    adapters: list[str | None] | None = None,
    adapter_dirs: dict[str, Path] | None = None,
    prepare: Callable[[nn.Module], None] | None = None,
) -> list[list[int]]:
    """Greedy token ids per prompt, one prompt at a time (no padding effects), on the CPU.
    `prepare` changes the HF model before adapters wrap it (e.g. FP8 activation hooks)."""
    return hf_greedy_on("cpu", model_dir, prompts, max_tokens, adapters, adapter_dirs, prepare)


def hf_greedy_on(
    device: str,
    model_dir: Path,
    prompts: list[list[int]],
    max_tokens: int,
    adapters: list[str | None] | None = None,
    adapter_dirs: dict[str, Path] | None = None,
    prepare: Callable[[nn.Module], None] | None = None,
) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    if prepare is not None:
        prepare(model)
    if adapter_dirs:
        from peft import PeftModel

        names = list(adapter_dirs)
        model = PeftModel.from_pretrained(model, adapter_dirs[names[0]], adapter_name=names[0])
        for name in names[1:]:
            model.load_adapter(adapter_dirs[name], adapter_name=name)
    model.eval()
    outputs = []
    for i, prompt in enumerate(prompts):
        ids = torch.tensor([prompt], device=device)
        kwargs: dict = {}
        if adapters is not None:
            kwargs["adapter_names"] = [adapters[i] or "__base__"]
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=max_tokens,
                # Bans EOS at every step; the engine side asks for the same with
                # min_tokens=max_tokens (ignore_eos would let it pick EOS where HF cannot).
                min_new_tokens=max_tokens,
                pad_token_id=0,
                **kwargs,
            )
        outputs.append(out[0, len(prompt) :].tolist())
    return outputs

"""Build real PEFT LoRA adapters (random, non-zero B) for a checkpoint directory."""

from __future__ import annotations

from pathlib import Path

import torch


def write_peft_adapter(
    base_dir: Path,
    out_dir: Path,
    rank: int,
    target_modules: list[str],
    seed: int,
    lora_alpha: float | None = None,
    use_rslora: bool = False,
) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = LoraConfig(
        r=rank,
        lora_alpha=lora_alpha or 2 * rank,
        target_modules=target_modules,
        lora_dropout=0.0,
        bias="none",
        use_rslora=use_rslora,
        init_lora_weights=False,
    )  # random A and B: the delta is non-zero
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.mul_(4.0)  # big enough to change greedy tokens
    peft_model.save_pretrained(out_dir)
    return out_dir

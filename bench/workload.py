"""Shared pieces of the benchmarks: synthetic prompts, model shapes, random adapters."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

# Llama-3-8B's shape (the README's H200 figures use it).
SHAPES = {
    "llama3-8b": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 128256,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
}
# Llama-3-70B's shape (140 GB in bf16: tensor parallelism over two H200s at least).
SHAPES["llama3-70b"] = {
    **SHAPES["llama3-8b"],
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
}
# A small shape for smoke runs of the benchmarks on the CPU.
SHAPES["tiny"] = {
    **SHAPES["llama3-8b"],
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 512,
    "torch_dtype": "float32",
}
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def synthetic_prompts(
    num_prompts: int, min_len: int, max_len: int, vocab_size: int, seed: int = 0
) -> list[list[int]]:
    rng = random.Random(seed)
    return [
        [rng.randrange(10, vocab_size) for _ in range(rng.randint(min_len, max_len))]
        for _ in range(num_prompts)
    ]


def write_shape_checkpoint(shape: str, out_dir: Path) -> Path:
    """config.json of a named shape plus a small tokenizer; weights come from load_format=dummy."""
    from loraplex.platform.demo.tiny_checkpoint import write_random_checkpoint

    if out_dir.exists():
        shutil.rmtree(out_dir)
    write_random_checkpoint(out_dir, "llama")
    for weights in out_dir.glob("*.safetensors"):
        weights.unlink()
    (out_dir / "config.json").write_text(json.dumps(SHAPES[shape], indent=2))
    (out_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    _pad_tokenizer_vocab(out_dir / "tokenizer.json", SHAPES[shape]["vocab_size"])
    return out_dir


def _pad_tokenizer_vocab(tokenizer_json: Path, vocab_size: int) -> None:
    """Give every id of the model's vocabulary a token of its own ("<t1234>"): the small
    trained tokenizer decodes ids beyond its few hundred tokens to nothing, and a streamed
    completion of random-weight tokens would then carry almost no text (no chunk to time)."""
    spec = json.loads(tokenizer_json.read_text())
    vocab = spec["model"]["vocab"]
    for token_id in range(len(vocab), vocab_size):
        vocab[f"<t{token_id}>"] = token_id
    tokenizer_json.write_text(json.dumps(spec))


def write_random_adapter(
    out_dir: Path, config: dict, rank: int, seed: int, modules: tuple[str, ...] = LORA_MODULES
) -> Path:
    """A PEFT-format LoRA adapter with random weights for a model config dict."""
    gen = torch.Generator().manual_seed(seed)
    h, i = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim") or h // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    dims = {
        "q_proj": (h, q),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (q, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module in modules:
            in_dim, out_dim = dims[module]
            kind = "self_attn" if module in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{kind}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, in_dim, generator=gen) * 0.01
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out_dim, rank, generator=gen) * 0.01
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.to(torch.bfloat16) for k, v in tensors.items()},
        str(out_dir / "adapter_model.safetensors"),
    )
    (out_dir / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "r": rank,
                "lora_alpha": 2 * rank,
                "target_modules": list(modules),
                "bias": "none",
                "lora_dropout": 0.0,
                "task_type": "CAUSAL_LM",
            }
        )
    )
    return out_dir

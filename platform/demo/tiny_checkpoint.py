"""Tiny random-weight Hugging Face checkpoints, for tests, benchmarks and `loraplex demo-model
--random`.

`write_random_checkpoint` writes a complete checkpoint directory (config.json,
model.safetensors, generation_config.json, tokenizer.json, tokenizer_config.json with a ChatML
chat template) for a Llama, Mistral or Qwen2 model of a few hundred thousand parameters. The
weights come from transformers' own model classes (so HF is a faithful oracle for them); the
tokenizer is a byte-level BPE trained on the built-in corpus (`corpus.py`). Nothing is
downloaded. Needs the `dev` or `demo` extra (transformers).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from loraplex.platform.demo.corpus import DEMO_CORPUS

ARCHITECTURES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
}
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def train_demo_tokenizer(vocab_size: int, add_bos_token: bool = False) -> Tokenizer:
    """A byte-level BPE `tokenizers.Tokenizer` trained on the built-in corpus.

    Its vocabulary (specials + 256 bytes + merges) is at most `vocab_size`. With
    `add_bos_token`, encoding prepends <|endoftext|> (as Llama 3's tokenizer prepends its BOS).
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = [line for line in DEMO_CORPUS.splitlines() if line.strip()]
    tokenizer.train_from_iterator(lines * 4, trainer)
    if add_bos_token:
        bos = SPECIAL_TOKENS[0]
        tokenizer.post_processor = processors.Sequence(
            [
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(
                    single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, 0)]
                ),
            ]
        )
    return tokenizer


def write_random_checkpoint(
    path: str | Path,
    arch: str = "llama",
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    vocab_size: int = 512,
    tie_word_embeddings: bool = False,
    seed: int = 0,
    head_dim: int | None = None,
    sliding_window: int | None = None,
    rope_parameters: dict[str, Any] | None = None,
    max_position_embeddings: int = 2048,
    initializer_range: float = 0.05,
) -> Path:
    """Write a tiny random-weight HF checkpoint directory; returns its path.

    The model's vocabulary equals the trained tokenizer's (`vocab_size`, or fewer if the
    built-in corpus runs out of merges). `sliding_window` applies to Mistral (all layers) and
    Qwen2 (all layers, use_sliding_window). Llama tokenizers add a BOS token; the others do not.
    """
    # transformers is an optional extra (`demo`, `dev`): imported only when a checkpoint is
    # written, so that `loraplex` itself starts without it.
    import transformers

    if arch not in ARCHITECTURES:
        raise ValueError(f"arch must be one of {tuple(ARCHITECTURES)}, got {arch!r}")
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    tokenizer = train_demo_tokenizer(vocab_size, add_bos_token=arch == "llama")
    config_cls, model_cls = (getattr(transformers, name) for name in ARCHITECTURES[arch])
    kwargs: dict[str, Any] = dict(
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        vocab_size=tokenizer.get_vocab_size(),
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tie_word_embeddings,
        initializer_range=initializer_range,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        rope_parameters=rope_parameters or {"rope_type": "default", "rope_theta": 10000.0},
    )
    if head_dim is not None:
        kwargs["head_dim"] = head_dim
    if arch == "mistral":
        kwargs["sliding_window"] = sliding_window
    elif arch == "qwen2":
        kwargs.update(
            use_sliding_window=sliding_window is not None,
            sliding_window=sliding_window,
            max_window_layers=0,
        )
    config = config_cls(**kwargs)
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32).eval()
    model.generation_config.eos_token_id = [2, 0]  # <|im_end|> and <|endoftext|>
    model.generation_config.bos_token_id = 0
    model.save_pretrained(root)
    tokenizer.save(str(root / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|endoftext|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": arch == "llama",
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_position_embeddings,
        "chat_template": CHATML_TEMPLATE,
    }
    (root / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    return root

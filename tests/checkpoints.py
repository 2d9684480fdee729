"""Builders for the checkpoints tests use: tiny random ones and the converted SmolLM2 demo.

Used through the session-scoped fixtures in tests/conftest.py, which build each checkpoint
once per test session.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from loraplex.platform.demo.checkpoint import ensure_demo_checkpoint
from loraplex.platform.demo.tiny_checkpoint import write_random_checkpoint
from loraplex.platform.settings import Settings

CheckpointFactory = Callable[..., Path]


def make_checkpoint_factory(root: Path) -> CheckpointFactory:
    """`factory(arch="llama", **write_random_checkpoint_kwargs) -> Path`, memoized by arguments."""
    built: dict[str, Path] = {}

    def factory(arch: str = "llama", **kwargs: Any) -> Path:
        key = f"{arch}-" + "-".join(f"{k}={kwargs[k]!r}" for k in sorted(kwargs))
        if key not in built:
            path = root / f"ckpt{len(built)}-{arch}"
            built[key] = write_random_checkpoint(path, arch, **kwargs)
        return built[key]

    return factory


def build_smollm2_checkpoint() -> Path:
    """The converted SmolLM2-135M-Instruct directory, shared with `make demo` between runs
    ($LORAPLEX_CACHE_DIR or ~/.cache/loraplex; converted once, ~30 s, then reused)."""
    return ensure_demo_checkpoint(Settings().cache_dir)

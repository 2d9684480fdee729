"""LLM freezes the process's start-up heap (no full garbage collection walks it mid-run) and
unfreezes it when collected, so that an engine given up is still freed."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

from loraplex.engine import LLM, SamplingParams
from loraplex.platform.demo.tiny_checkpoint import write_random_checkpoint


def test_llm_freezes_the_startup_heap_and_its_engine_is_still_freed(tmp_path: Path) -> None:
    checkpoint = write_random_checkpoint(tmp_path, "llama")
    frozen_before = gc.get_freeze_count()  # another test's LLM may still hold a frozen heap
    llm = LLM(str(checkpoint), device="cpu", dtype="float32")
    assert gc.get_freeze_count() > frozen_before  # the new engine's objects froze too
    params = SamplingParams(max_tokens=4, temperature=0.0)
    assert len(llm.generate([[5, 6, 7]], params, use_tqdm=False)[0].outputs[0].token_ids) == 4
    engine, model = weakref.ref(llm.engine), weakref.ref(llm.engine.runner.model)
    del llm
    gc.collect()
    assert gc.get_freeze_count() == 0
    assert engine() is None and model() is None

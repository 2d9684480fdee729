"""`LLM(...)`-style keywords -> EngineConfig: each to its section, the chunked-prefill budget
and the sequence cap chosen by device when not given."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from loraplex.engine import LLM
from loraplex.engine.config import DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS
from loraplex.engine.engine_args import create_engine_config
from loraplex.engine.errors import ConfigError


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_default_prefill_budget_and_sequence_cap_follow_the_device(device: str) -> None:
    for config in (
        create_engine_config("model-dir", device=device),
        create_engine_config(
            "model-dir", device=device, max_num_seqs=None, max_num_batched_tokens=None
        ),
    ):
        assert config.scheduler.max_num_batched_tokens == DEFAULT_MAX_NUM_BATCHED_TOKENS[device]
        assert config.scheduler.max_num_seqs == DEFAULT_MAX_NUM_SEQS[device]
    assert DEFAULT_MAX_NUM_BATCHED_TOKENS == {"cuda": 8192, "cpu": 256}
    assert DEFAULT_MAX_NUM_SEQS == {"cuda": 512, "cpu": 256}


def test_an_explicit_prefill_budget_and_sequence_cap_win() -> None:
    config = create_engine_config(
        "model-dir", device="cpu", max_num_batched_tokens=4096, max_num_seqs=7
    )
    assert config.scheduler.max_num_batched_tokens == 4096
    assert config.scheduler.max_num_seqs == 7


def test_keywords_reach_their_sections_and_unknown_ones_are_refused() -> None:
    config = create_engine_config("m", device="cpu", block_size=8, max_loras=2, max_num_seqs=3)
    assert (config.cache.block_size, config.lora.max_loras) == (8, 2)
    assert config.scheduler.max_num_seqs == 3 and config.model.model == "m"
    with pytest.raises(ConfigError, match="unknown engine argument"):
        create_engine_config("m", max_num_batched_tokenz=5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
def test_cuda_on_a_machine_without_it_is_a_config_error(llama_checkpoint: Path) -> None:
    with pytest.raises(ConfigError, match="no CUDA device"):
        LLM(str(llama_checkpoint), device="cuda")


def test_an_engine_sets_the_switch_interval_it_is_given(llama_checkpoint: Path) -> None:
    default = sys.getswitchinterval()
    try:
        LLM(str(llama_checkpoint), device="cpu", num_kv_blocks=8, switch_interval_ms=0.5)
        assert sys.getswitchinterval() == pytest.approx(0.0005)
        sys.setswitchinterval(0.004)
        LLM(str(llama_checkpoint), device="cpu", num_kv_blocks=8, switch_interval_ms=None)
        assert sys.getswitchinterval() == pytest.approx(0.004)  # None leaves it alone
    finally:
        sys.setswitchinterval(default)
    with pytest.raises(ConfigError, match="switch_interval_ms"):
        create_engine_config("m", device="cpu", switch_interval_ms=0)

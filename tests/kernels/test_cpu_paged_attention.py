"""The CPU fast path of paged attention (fused SDPA) against the reference, the spec: whole
prompts, prefill chunks over cached context, mixed batches with decodes, sliding windows, GQA,
every dtype. NaN-poisoned caches catch reads outside a sequence's blocks or past its length."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator

import pytest
import torch

from loraplex.kernels import cpu, dispatch, paged_attention, reference
from tests.kernels.paged_inputs import make_paged_batch

# The module (its package exports the function under the same name).
cpu_attention_module = importlib.import_module("loraplex.kernels.cpu.paged_attention")

CASES = {
    "whole prompt": ([37], [37]),
    "chunk over cached context": ([300], [64]),
    "mixed prefill, decode and chunk": ([50, 7, 90, 33], [50, 1, 13, 1]),
    "a sequence with no new tokens": ([20, 16], [0, 16]),
    "decode only": ([5, 40, 17], [1, 1, 1]),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("sliding_window", [None, 8], ids=["full", "window8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(9, 3), (4, 4)], ids=["gqa", "mha"])
def test_cpu_fast_path_matches_the_reference(
    case: str, sliding_window: int | None, dtype: torch.dtype, num_heads: int, num_kv_heads: int
) -> None:
    torch.manual_seed(0)
    seq_lens, q_lens = CASES[case]
    batch = make_paged_batch(
        seq_lens, q_lens, num_heads, num_kv_heads, 32, 16, dtype, torch.device("cpu")
    )
    expected = reference.paged_attention(*batch.args, 0.2, sliding_window)
    got = cpu.paged_attention(*batch.args, 0.2, sliding_window)
    assert got.dtype == dtype and got.shape == expected.shape
    assert not got.isnan().any()
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)


@pytest.fixture
def set_kernels(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Sets LORAPLEX_KERNELS for the rest of the test; the next test re-reads it unset."""

    def set_to(setting: str) -> None:
        monkeypatch.setenv("LORAPLEX_KERNELS", setting)
        dispatch._reference_ops.cache_clear()

    yield set_to
    dispatch._reference_ops.cache_clear()


def test_cpu_tensors_dispatch_to_the_fast_path(
    monkeypatch: pytest.MonkeyPatch, set_kernels: Callable[[str], None]
) -> None:
    """CPU tensors take the fused path; LORAPLEX_KERNELS=reference forces the spec."""
    batch = make_paged_batch([24], [24], 2, 2, 16, 8, torch.float32, torch.device("cpu"))
    fused = cpu_attention_module.F.scaled_dot_product_attention
    calls: list[int] = []

    def counting(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return fused(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(cpu_attention_module.F, "scaled_dot_product_attention", counting)
    paged_attention(*batch.args, 0.25)
    assert calls == [1]
    for setting in ("reference", "reference:rms_norm, paged_attention"):
        set_kernels(setting)
        out = paged_attention(*batch.args, 0.25)
        assert calls == [1]
        torch.testing.assert_close(out, reference.paged_attention(*batch.args, 0.25))
    set_kernels("reference:rms_norm")  # another op: the fast path
    paged_attention(*batch.args, 0.25)
    assert calls == [1, 1]


@pytest.mark.parametrize(
    "setting",
    [
        "reference:",
        "reference:no_such_op",
        "reference:apply_rotary_pos_emb",  # a reference function, but no dispatched kernel
        "triton",
        "fast:rms_norm",  # a dispatched op, under an unknown kind
    ],
)
def test_a_bad_kernels_setting_is_a_clear_error(
    set_kernels: Callable[[str], None], setting: str
) -> None:
    set_kernels(setting)
    batch = make_paged_batch([8], [8], 2, 2, 16, 8, torch.float32, torch.device("cpu"))
    with pytest.raises(ValueError, match="LORAPLEX_KERNELS"):
        paged_attention(*batch.args, 0.25)

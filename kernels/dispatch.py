"""Pick the Triton kernel for CUDA tensors, a CPU fast path where one exists (`kernels/cpu/`,
tested against the reference) for CPU tensors, and the reference for everything else."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from loraplex.kernels import cpu, cuda, reference

_DISPATCHED_OPS: set[str] = set()  # filled by _dispatch below, at import


@functools.cache
def _reference_ops() -> frozenset[str] | None:
    """The ops `LORAPLEX_KERNELS` sends to the reference: None for all of them ("reference"),
    the named ones for "reference:op,op" (A/B checks of one kernel), none for "auto"."""
    value = os.environ.get("LORAPLEX_KERNELS", "auto")
    if value == "reference":
        return None
    if value == "auto":
        return frozenset()
    kind, _, names = value.partition(":")
    ops = frozenset(name.strip() for name in names.split(",") if name.strip())
    # Only names this module dispatches: any other name would route nothing, silently.
    unknown = ops - _DISPATCHED_OPS
    if kind != "reference" or not ops or unknown:
        raise ValueError(
            f"LORAPLEX_KERNELS={value!r}: use 'auto', 'reference' or 'reference:op,...' with ops "
            f"from {sorted(_DISPATCHED_OPS)}"
        )
    return ops


def _reference_forced(name: str) -> bool:
    ops = _reference_ops()
    return ops is None or name in ops


@functools.cache
def _triton_available() -> bool:
    if _reference_ops() is None:
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


def _use_triton(t: torch.Tensor) -> bool:
    return t.is_cuda and _triton_available()


def _triton_serves(device: torch.device) -> bool:
    return device.type == "cuda" and _triton_available()


def warmup_step_shapes(
    device: torch.device, max_tokens: int, slot_tables: Sequence[int]
) -> list[tuple[int, int | None]]:
    """(tokens, LoRA slot table or None) of one-sequence steps that together launch every
    compiled variant of the Triton kernels that steps of up to `max_tokens` tokens can need
    (`triton/launch_classes.py`); none where `device`'s steps run no Triton kernel."""
    if not _triton_serves(device):
        return []
    from loraplex.kernels.triton.launch_classes import warmup_shapes

    return warmup_shapes(max_tokens, slot_tables)


def warmup_decode_sizes(device: torch.device, max_num_seqs: int, num_kv_heads: int) -> list[int]:
    """Batch sizes of decode steps that launch every variant of the split-KV decode kernel;
    none where `device`'s steps run no Triton kernel."""
    if not _triton_serves(device):
        return []
    from loraplex.kernels.triton.launch_classes import decode_warmup_sizes

    return decode_warmup_sizes(max_num_seqs, num_kv_heads)


# The Triton package is imported on the first CUDA call only, so CPU hosts need no Triton.


def _dispatch(
    name: str,
    cpu_fn: Callable[..., Any] | None = None,
    cuda_fn: Callable[..., Any] | None = None,
) -> Callable[..., Any]:
    """`cuda_fn`: a CUDA path that is not a Triton kernel (cuBLAS through PyTorch)."""
    reference_fn = getattr(reference, name)
    _DISPATCHED_OPS.add(name)

    @functools.wraps(reference_fn)
    def call(first: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        forced = _reference_forced(name)
        if cuda_fn is not None and first.is_cuda and not forced:
            return cuda_fn(first, *args, **kwargs)
        if _use_triton(first) and not forced:
            from loraplex.kernels import triton as triton_kernels

            return getattr(triton_kernels, name)(first, *args, **kwargs)
        if cpu_fn is not None and first.device.type == "cpu" and not forced:
            return cpu_fn(first, *args, **kwargs)
        return reference_fn(first, *args, **kwargs)

    return call


paged_attention = _dispatch("paged_attention", cpu.paged_attention)
lora_shrink = _dispatch("lora_shrink")
lora_expand = _dispatch("lora_expand")
rms_norm = _dispatch("rms_norm")
fused_add_rms_norm = _dispatch("fused_add_rms_norm")
rms_norm_quant_fp8 = _dispatch("rms_norm_quant_fp8")
fused_add_rms_norm_quant_fp8 = _dispatch("fused_add_rms_norm_quant_fp8")
rotary_and_cache = _dispatch("rotary_and_cache")
silu_and_mul = _dispatch("silu_and_mul")
silu_and_mul_lora = _dispatch("silu_and_mul_lora")
silu_and_mul_quant_fp8 = _dispatch("silu_and_mul_quant_fp8")
w4a16_gemm = _dispatch("w4a16_gemm")
fp8_scaled_mm = _dispatch("fp8_scaled_mm", cuda_fn=cuda.fp8_scaled_mm)
quantize_fp8_per_token = _dispatch("quantize_fp8_per_token")

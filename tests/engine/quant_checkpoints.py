"""Quantized checkpoints for tests, written by round-to-nearest into the Hub's exact tensor
layouts (no calibration package), each beside its dequantized twin for HF transformers.

Written here independently of `loraplex.engine.model.quant` (the engine's unpackers are what
these packers test):

- AWQ (AutoAWQ "gemm"): qweight [K, N/8] int32, 8 columns per int in the order 0 2 4 6 1 3 5 7;
  qzeros [G, N/8] likewise; scales [G, N] float16.
- GPTQ (AutoGPTQ "gptq" format): qweight [K/8, N] int32, 8 rows per int in order; qzeros
  [G, N/8] in order, storing zero - 1; scales [G, N] float16; g_idx [K] int32 (act-order: the
  groups follow a permutation of the input rows, shared by projections of one input).
- FP8 (vLLM "fp8"): weight float8_e4m3fn [N, K], weight_scale per tensor (shape []), and
  compressed-tensors (per channel, [N, 1]).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
E4M3_MAX = 448.0
# Projections that read one input share GPTQ's act-order permutation.
_SHARED_INPUT = {
    "q_proj": "qkv",
    "k_proj": "qkv",
    "v_proj": "qkv",
    "gate_proj": "gu",
    "up_proj": "gu",
}


# ---- round-to-nearest --------------------------------------------------------------------


def rtn_int4(
    w: torch.Tensor, group_size: int, g_idx: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [N, K] -> (q [K, N] in [0, 16), zeros [G, N] in [0, 16), scales [G, N] float16):
    asymmetric, min/max per group of input rows (rows k with g_idx[k] == g) and column."""
    k = w.shape[1]
    num_groups = k // group_size
    wt = w.t().float()  # [K, N]
    q = torch.empty_like(wt, dtype=torch.int64)
    zeros = torch.empty(num_groups, w.shape[0], dtype=torch.int64)
    scales = torch.empty(num_groups, w.shape[0], dtype=torch.float16)
    for g in range(num_groups):
        rows = (g_idx == g).nonzero().flatten()
        block = wt[rows]  # [group_size, N]
        lo, hi = block.min(0).values.clamp(max=0), block.max(0).values.clamp(min=0)
        scale = ((hi - lo) / 15).clamp(min=1e-6).half()
        zero = torch.round(-lo / scale.float()).clamp(0, 15)
        q[rows] = (torch.round(block / scale.float()) + zero).clamp(0, 15).long()
        zeros[g], scales[g] = zero.long(), scale
    return q, zeros, scales


def dequantize_int4(
    q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor
) -> torch.Tensor:
    """-> W [N, K] float32, the weight an AWQ / GPTQ kernel multiplies by."""
    g = g_idx.long()
    return ((q - zeros[g]).float() * scales[g].float()).t().contiguous()


def _pack_columns(values: torch.Tensor, order: tuple[int, ...]) -> torch.Tensor:
    """[R, N] -> [R, N/8] int32: value j of int c holds column 8c + order[j]."""
    r, n = values.shape
    out = torch.zeros(r, n // 8, dtype=torch.int64)
    for j, col in enumerate(order):
        out |= (values[:, col::8].long() & 0xF) << (4 * j)
    return _to_int32(out)


def _pack_rows(values: torch.Tensor) -> torch.Tensor:
    """[K, N] -> [K/8, N] int32: value j of int r holds row 8r + j."""
    k, n = values.shape
    out = torch.zeros(k // 8, n, dtype=torch.int64)
    for j in range(8):
        out |= (values[j::8].long() & 0xF) << (4 * j)
    return _to_int32(out)


def _to_int32(values: torch.Tensor) -> torch.Tensor:
    return torch.where(values >= 2**31, values - 2**32, values).to(torch.int32)


def pack_awq(q: torch.Tensor, zeros: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"qweight": _pack_columns(q, AWQ_ORDER), "qzeros": _pack_columns(zeros, AWQ_ORDER)}


def pack_gptq(q: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor) -> dict[str, torch.Tensor]:
    return {
        "qweight": _pack_rows(q),
        "qzeros": _pack_columns(zeros - 1, tuple(range(8))),  # the "gptq" format: zero - 1
        "g_idx": g_idx.to(torch.int32),
    }


def fp8_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (fp8 [N, K], scale [N] float32), the engine's online quantization spec: per
    row, of the scales r * max|w| / 448 for r = 1.00, 0.99, ..., 0.81, the first with the least
    sum |w - dequantized|^2.4."""
    w = w.float()
    rows = []
    for row in w:
        candidates = []
        for i in range(20):
            scale = (row.abs().max() * (1.0 - i / 100) / E4M3_MAX).clamp(min=1e-12 / E4M3_MAX)
            q = (row / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
            error = float((q.float() * scale - row).abs().pow(2.4).sum())
            candidates.append((error, i, q, scale))
        error, _, q, scale = min(candidates, key=lambda c: (c[0], c[1]))
        rows.append((q, scale))
    return torch.stack([q for q, _ in rows]), torch.stack([s for _, s in rows])


def fp8_per_tensor(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (fp8 [N, K], scale [] float32), as vLLM's "fp8" checkpoints store it."""
    w = w.float()
    scale = w.abs().max() / E4M3_MAX
    return (w / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


# ---- checkpoints -------------------------------------------------------------------------


def _linear_weights(state: dict[str, torch.Tensor]) -> list[str]:
    return [n for n in state if n.endswith(".weight") and n.split(".")[-2] in LINEAR_NAMES]


def _copy_dir(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors"))


def _write(root: Path, state: dict[str, torch.Tensor], quant_config: dict | None) -> None:
    save_file({k: v.contiguous() for k, v in state.items()}, str(root / "model.safetensors"))
    config = json.loads((root / "config.json").read_text())
    config.pop("quantization_config", None)
    if quant_config is not None:
        config["quantization_config"] = quant_config
    (root / "config.json").write_text(json.dumps(config, indent=2))


def write_int4_checkpoint(
    base: Path, out: Path, method: str, group_size: int, act_order: bool = False, seed: int = 0
) -> tuple[Path, Path]:
    """-> (quantized dir, dequantized float32 dir) of `base` in AWQ or GPTQ layout."""
    state = load_file(str(base / "model.safetensors"))
    quant_state = dict(state)
    dequant_state = dict(state)
    gen = torch.Generator().manual_seed(seed)
    perms: dict[str, torch.Tensor] = {}
    for name in _linear_weights(state):
        w = state[name]
        prefix, proj = name.rsplit(".", 2)[0], name.split(".")[-2]
        k = w.shape[1]
        g_idx = torch.arange(k) // group_size
        if act_order:
            key = f"{prefix}.{_SHARED_INPUT.get(proj, proj)}"
            perm = perms.setdefault(key, torch.randperm(k, generator=gen))
            g_idx = torch.empty(k, dtype=torch.int64)
            g_idx[perm] = torch.arange(k) // group_size  # groups follow the permuted order
        q, zeros, scales = rtn_int4(w, group_size, g_idx)
        packed = pack_awq(q, zeros) if method == "awq" else pack_gptq(q, zeros, g_idx)
        del quant_state[name]
        for suffix, tensor in {**packed, "scales": scales}.items():
            quant_state[f"{prefix}.{proj}.{suffix}"] = tensor
        dequant_state[name] = dequantize_int4(q, zeros, scales, g_idx)
    if method == "awq":
        config = {"quant_method": "awq", "bits": 4, "group_size": group_size, "version": "gemm",
                  "zero_point": True}  # fmt: skip
    else:
        config = {"quant_method": "gptq", "bits": 4, "group_size": group_size, "sym": False,
                  "desc_act": act_order, "checkpoint_format": "gptq"}  # fmt: skip
    return _write_pair(base, out, quant_state, dequant_state, config)


def write_fp8_checkpoint(base: Path, out: Path, layout: str) -> tuple[Path, Path]:
    """-> (quantized dir, dequantized dir) in vLLM's "fp8" layout (per-tensor scales) or
    compressed-tensors' (per-channel scales, [N, 1])."""
    state = load_file(str(base / "model.safetensors"))
    quant_state, dequant_state = dict(state), dict(state)
    for name in _linear_weights(state):
        if layout == "fp8":
            w_fp8, scale = fp8_per_tensor(state[name])
            dequant = w_fp8.float() * scale
        else:
            w_fp8, scale = fp8_per_channel(state[name])
            dequant, scale = w_fp8.float() * scale[:, None], scale[:, None]
        prefix = name.removesuffix(".weight")
        quant_state[name] = w_fp8
        quant_state[f"{prefix}.weight_scale"] = scale
        quant_state[f"{prefix}.input_scale"] = torch.tensor(1.0)  # static: read, not used
        dequant_state[name] = dequant
    if layout == "fp8":
        config: dict = {"quant_method": "fp8", "activation_scheme": "static"}
    else:
        config = {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "ignore": ["lm_head"],
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": "channel",
                            "symmetric": True, "dynamic": False},
                "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                      "symmetric": True, "dynamic": True},
            }},
        }  # fmt: skip
    return _write_pair(base, out, quant_state, dequant_state, config)


def write_fp8_online_twin(base: Path, out: Path) -> Path:
    """The dequantized weights the engine's online FP8 quantization of `base` multiplies by."""
    state = load_file(str(base / "model.safetensors"))
    for name in _linear_weights(state):
        w_fp8, scale = fp8_per_channel(state[name])
        state[name] = w_fp8.float() * scale[:, None]
    _copy_dir(base, out)
    _write(out, state, None)
    return out


def _write_pair(
    base: Path, out: Path, quant_state: dict, dequant_state: dict, config: dict
) -> tuple[Path, Path]:
    quant_dir, dequant_dir = out / "quantized", out / "dequantized"
    _copy_dir(base, quant_dir)
    _copy_dir(base, dequant_dir)
    _write(quant_dir, quant_state, config)
    _write(dequant_dir, dequant_state, None)
    return quant_dir, dequant_dir


# ---- the FP8 oracle's activations --------------------------------------------------------


def fake_quantize_per_token(x: torch.Tensor) -> torch.Tensor:
    """x -> dequantize(fp8(x / scale)) * scale, scale = max |row| / 448 (per token)."""
    scale = (x.abs().amax(-1, keepdim=True).float() / E4M3_MAX).clamp(min=1e-12 / E4M3_MAX)
    x_fp8 = (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return (x_fp8.float() * scale).to(x.dtype)


def quantize_linear_inputs(model: nn.Module) -> None:
    """Make the decoder's linear layers of an HF model see per-token FP8 activations (a
    forward pre-hook, so PEFT's LoRA branch still reads the unquantized input)."""
    hook: Callable = lambda module, args: (fake_quantize_per_token(args[0]), *args[1:])  # noqa: E731
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and name.split(".")[-1] in LINEAR_NAMES:
            module.register_forward_pre_hook(hook)

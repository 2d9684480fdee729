"""A calibrated AWQ 4-bit checkpoint of a Llama-family model, for bench/quant_accuracy.py.

Activation-aware weight quantization (Lin et al., 2023, "AWQ"): before round-to-nearest, each
input channel j of a projection is scaled by s_j = mean|x_j|^alpha (salient channels keep more
precision), and 1/s_j is folded into what produces x, so the unquantized model computes the same
function. Per layer: q/k/v (1/s into input_layernorm's weight), gate/up (into
post_attention_layernorm's), down (into up_proj's rows); o_proj is not scaled (its input
channels are the attention heads', which v_proj's fewer KV heads cannot absorb under
grouped-query attention; AutoAWQ skips it too). alpha is searched on a grid per projection group
to minimize the error of the group's outputs on calibration activations; then each weight but
q_proj's and k_proj's is clipped per (output channel, group) where that lowers its output error
(AWQ's clipping search; AutoAWQ leaves q and k unclipped too).

The calibration text is docs/api.md (not a text quant_accuracy.py evaluates). Writes the scaled
model's AWQ checkpoint (round-to-nearest into AutoAWQ's GEMM layout, tests/engine/
quant_checkpoints.py) and, beside it, the scaled model unquantized:

    python bench/awq_calibrate.py --out /tmp/smol-awq [--model DIR] [--group-size 64]
    python bench/quant_accuracy.py --quantization awq --model /tmp/smol-awq/quantized \\
        --baseline-model <the same DIR>
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from quant_accuracy import model_dir_or_demo
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from loraplex.engine.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the checkpoint writer the tests use
from tests.engine.quant_checkpoints import dequantize_int4, rtn_int4, write_int4_checkpoint  # noqa: E402

CALIBRATION_TEXT = REPO / "docs" / "api.md"
ALPHAS = [i / 20 for i in range(21)]


def fake_quantize(w: torch.Tensor, group_size: int) -> torch.Tensor:
    """w [N, K] through round-to-nearest 4-bit and back, as the checkpoint will hold it."""
    g_idx = torch.arange(w.shape[1]) // group_size
    return dequantize_int4(*rtn_int4(w, group_size, g_idx), g_idx)


@torch.no_grad()
def best_scales(x: torch.Tensor, weights: list[torch.Tensor], group_size: int) -> torch.Tensor:
    """Per input channel scales s (x [T, K], weights [N_i, K] reading x) minimizing
    ||x W^T - x (Q(W diag s) diag 1/s)^T|| over the alpha grid; alpha 0 is plain RTN."""
    w = torch.cat(weights)
    want = x @ w.T
    magnitude = x.abs().mean(0).clamp(min=1e-8)
    best, best_error = torch.ones_like(magnitude), float("inf")
    for alpha in ALPHAS:
        s = magnitude.pow(alpha)
        s = s / (s.max() * s.min()).sqrt()
        error = (want - x @ (fake_quantize(w * s, group_size) / s).T).pow(2).mean().item()
        if error < best_error:
            best, best_error = s, error
    return best


@torch.no_grad()
def clip_weights(x: torch.Tensor, w: torch.Tensor, group_size: int, tokens: int = 256) -> None:
    """Clamp w [N, K] in place to +-ratio * max|w| per (output channel, group of input channels),
    the ratio from a grid in [0.5, 1] that minimizes the error of that group's share of the
    output on `tokens` rows of x [T, K] (AWQ's clipping search)."""
    num_groups = w.shape[1] // group_size
    xg = x[:: max(x.shape[0] // tokens, 1)].view(-1, num_groups, group_size)  # [T', nG, G]
    wg = w.view(w.shape[0], num_groups, group_size)  # [N, nG, G]
    want = torch.einsum("tgk,ngk->tng", xg, wg)
    original = wg.abs().amax(-1, keepdim=True)  # [N, nG, 1]
    best_error = torch.full(original.shape[:2], float("inf"))
    best_max = original.clone()
    for ratio in [1 - i / 20 for i in range(11)]:
        limit = original * ratio
        clipped = wg.clamp(-limit, limit)
        lo = clipped.amin(-1, keepdim=True).clamp(max=0)
        hi = clipped.amax(-1, keepdim=True).clamp(min=0)
        scale = ((hi - lo) / 15).clamp(min=1e-6)
        zero = torch.round(-lo / scale)
        deq = ((torch.round(clipped / scale) + zero).clamp(0, 15) - zero) * scale
        error = (torch.einsum("tgk,ngk->tng", xg, deq) - want).pow(2).mean(0)  # [N, nG]
        better = error < best_error
        best_error = torch.where(better, error, best_error)
        best_max = torch.where(better[..., None], limit, best_max)
    wg.copy_(wg.clamp(-best_max, best_max))


CAPTURED = ("self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj")


class _StopForward(Exception):
    """Raised once the calibrated layer's last input is captured: later layers need not run."""


@torch.no_grad()
def layer_inputs(model: Any, layer_index: int, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """The inputs of one layer's q_proj, o_proj, gate_proj and down_proj (CAPTURED) on `ids`
    [B, T]: [B*T, K] each. The forward stops at that layer's down_proj."""
    layer = model.model.layers[layer_index]
    captured: dict[str, torch.Tensor] = {}

    def grabber(name: str) -> Any:
        def grab(_module: Any, args: tuple) -> None:
            captured[name] = args[0].reshape(-1, args[0].shape[-1]).float()
            if name == CAPTURED[-1]:
                raise _StopForward

        return grab

    hooks = [layer.get_submodule(n).register_forward_pre_hook(grabber(n)) for n in CAPTURED]
    try:
        model(input_ids=ids)
    except _StopForward:
        pass
    finally:
        for hook in hooks:
            hook.remove()
    return captured


@torch.no_grad()
def apply_awq_scales(model: Any, ids: torch.Tensor, group_size: int) -> None:
    """Scale each layer in place, layer by layer (a layer's inputs are taken after the layers
    before it were scaled; scaling leaves the unquantized function unchanged)."""
    for i, layer in enumerate(model.model.layers):
        x = layer_inputs(model, i, ids)
        attn, mlp = layer.self_attn, layer.mlp
        qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
        groups = (
            ("self_attn.q_proj", qkv, layer.input_layernorm.weight),
            ("mlp.gate_proj", [mlp.gate_proj, mlp.up_proj], layer.post_attention_layernorm.weight),
            ("mlp.down_proj", [mlp.down_proj], None),
        )
        for key, linears, norm_weight in groups:
            s = best_scales(x[key], [m.weight.float() for m in linears], group_size)
            for m in linears:
                m.weight.mul_(s.to(m.weight.dtype))
            if norm_weight is not None:
                norm_weight.div_(s.to(norm_weight.dtype))
            else:  # down_proj reads silu(gate) * up: its channel j shrinks with up's row j
                mlp.up_proj.weight.div_(s.to(mlp.up_proj.weight.dtype)[:, None])
            for m in linears:
                if m not in (attn.q_proj, attn.k_proj):  # attention scores: left unclipped
                    clip_weights(x[key] / s, m.weight, group_size)
        clip_weights(x["self_attn.o_proj"], attn.o_proj.weight, group_size)
        print(f"layer {i} scaled", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="HF checkpoint directory (default: the demo model)")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--calibration-tokens", type=int, default=2048)
    ap.add_argument("--window", type=int, default=256)
    args = ap.parse_args()
    model_dir = model_dir_or_demo(args.model)
    tokenizer = Tokenizer.from_model_dir(model_dir)
    ids = tokenizer.encode(CALIBRATION_TEXT.read_text())[: args.calibration_tokens]
    ids = ids[: len(ids) // args.window * args.window]
    batch = torch.tensor(ids).view(-1, args.window)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    apply_awq_scales(model, batch, args.group_size)

    scaled = Path(tempfile.mkdtemp(prefix="awq-scaled-"))
    shutil.copytree(
        model_dir, scaled, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.safetensors")
    )
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(scaled / "model.safetensors"), metadata={"format": "pt"})
    quantized, dequantized = write_int4_checkpoint(scaled, args.out, "awq", args.group_size)
    shutil.rmtree(scaled)
    print(f"AWQ checkpoint: {quantized}\nits dequantized twin: {dequantized}")


if __name__ == "__main__":
    main()

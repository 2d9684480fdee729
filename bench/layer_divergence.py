"""Where, op by op, the engine's bf16 forward first rounds differently from HF transformers' on
the same tokens (issue 12's numerics bar: which op still differs once the kernels match).

    python bench/layer_divergence.py [--model DIR] [--device cuda] [--hf-tokens FILE]
        [--prompts 0,1,2] [--json FILE]

Each prompt (a word prefix of the demo corpus, as `bf16_agreement.py` builds them; with
`--hf-tokens`, `bf16_agreement.py`'s file, followed by HF's greedy continuation) is run once
through HF and once through the engine as one prefill (no CUDA graphs), with hooks on every op
of every decoder layer. A prefill of more tokens than one KV tile of the prefill kernel (32)
rounds attention unlike cuDNN (bench/results/h200-44a5363-sdpa-rounding), so `engine` past the
first attention means most for prompts alone. Reported per op, in forward order:
- `engine`: the share of elements where the engine's tensor differs from HF's. The first op
  with a share above 0 is where the two forwards part; everything after it differs anyway.
- `fused`: for the linear layers, HF's own input through the engine's GEMM shape (q/k/v and
  gate/up fused into one weight) against HF's output: cuBLAS's choice of kernel for the shape,
  alone, on real activations.
- `rows`: HF's input one row at a time (a decode step's GEMM) against all rows at once.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from kernel_rounding import differ
from quant_accuracy import corpus_prompts, model_dir_or_demo
from torch import nn
from transformers import AutoModelForCausalLM

from loraplex.engine import LLM, SamplingParams
from loraplex.engine.tokenizer import Tokenizer

# The engine's linear layers and the HF modules whose weights each one holds, in row order.
LINEARS = {
    "qkv_proj": ("self_attn", ("q_proj", "k_proj", "v_proj")),
    "o_proj": ("self_attn", ("o_proj",)),
    "gate_up_proj": ("mlp", ("gate_proj", "up_proj")),
    "down_proj": ("mlp", ("down_proj",)),
}


def share_differ(a: torch.Tensor, b: torch.Tensor) -> float:
    return differ(a, b)["differ"]


class Recorder:
    """Forward hooks that keep each named module's last input and output ([T, ...], 2-D)."""

    def __init__(self) -> None:
        self.inputs: dict[str, torch.Tensor] = {}
        self.outputs: dict[str, torch.Tensor] = {}
        self._handles: list[Any] = []

    def watch(self, name: str, module: nn.Module, stream: bool = False) -> None:
        """`stream`: the module returns (mlp output, residual), whose sum is the residual stream
        after the layer (the engine defers that add into the next norm)."""

        def hook(_: nn.Module, args: tuple[Any, ...], out: Any) -> None:
            kept = out[0] + out[1] if stream else out[0] if isinstance(out, tuple) else out
            self.inputs[name] = args[0].detach().reshape(-1, args[0].shape[-1]).clone()
            self.outputs[name] = kept.detach().reshape(-1, kept.shape[-1]).clone()

        self._handles.append(module.register_forward_hook(hook))

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def watch_hf(model: nn.Module, recorder: Recorder) -> None:
    for i, layer in enumerate(model.model.layers):
        recorder.watch(f"{i}.input_layernorm", layer.input_layernorm)
        recorder.watch(f"{i}.post_attention_layernorm", layer.post_attention_layernorm)
        for parent, names in LINEARS.values():
            for name in names:
                recorder.watch(f"{i}.{name}", getattr(getattr(layer, parent), name))
        recorder.watch(f"{i}.layer", layer)
    recorder.watch("norm", model.model.norm)


def watch_engine(model: nn.Module, recorder: Recorder) -> None:
    for i, layer in enumerate(model.model.layers):
        recorder.watch(f"{i}.input_layernorm", layer.input_layernorm)
        recorder.watch(f"{i}.post_attention_layernorm", layer.post_attention_layernorm)
        for op, (parent, _) in LINEARS.items():
            if op != "gate_up_proj":  # the MLP calls it through forward_unexpanded: no hook
                recorder.watch(f"{i}.{op}", getattr(getattr(layer, parent), op))
        recorder.watch(f"{i}.act_fn", layer.mlp.act_fn)  # its input is gate_up_proj's output
        recorder.watch(f"{i}.layer", layer, stream=True)
    recorder.watch("norm", model.model.norm)


def compare_layer(
    i: int, hf: Recorder, engine: Recorder, weights: dict[str, torch.Tensor]
) -> dict[str, dict[str, float]]:
    """Each op of decoder layer i, in forward order; the linear layers with their isolated
    checks (`weights`: HF's, by '{layer}.{module}')."""
    h, e = hf.outputs, engine.outputs

    def hf_cat(names: tuple[str, ...]) -> torch.Tensor:
        return torch.cat([h[f"{i}.{name}"] for name in names], dim=1)

    def linear(op: str, engine_out: torch.Tensor) -> dict[str, float]:
        names = LINEARS[op][1]
        x, expected = hf.inputs[f"{i}.{names[0]}"], hf_cat(names)
        weight = torch.cat([weights[f"{i}.{name}"] for name in names])
        fused = F.linear(x, weight)
        by_row = torch.cat([F.linear(x[t : t + 1], weight) for t in range(x.shape[0])])
        return {
            "engine": share_differ(engine_out, expected),
            "fused": share_differ(fused, expected),
            "rows": share_differ(by_row, fused),
        }

    def same(engine_t: torch.Tensor, hf_t: torch.Tensor) -> dict[str, float]:
        return {"engine": share_differ(engine_t, hf_t)}

    return {
        "input_layernorm": same(e[f"{i}.input_layernorm"], h[f"{i}.input_layernorm"]),
        "qkv_proj": linear("qkv_proj", e[f"{i}.qkv_proj"]),
        "attention": same(engine.inputs[f"{i}.o_proj"], hf.inputs[f"{i}.o_proj"]),
        "o_proj": linear("o_proj", e[f"{i}.o_proj"]),
        "post_attention_layernorm": same(
            e[f"{i}.post_attention_layernorm"], h[f"{i}.post_attention_layernorm"]
        ),
        "gate_up_proj": linear("gate_up_proj", engine.inputs[f"{i}.act_fn"]),
        "act_fn": same(engine.inputs[f"{i}.down_proj"], hf.inputs[f"{i}.down_proj"]),
        "down_proj": linear("down_proj", e[f"{i}.down_proj"]),
        "residual_stream": same(e[f"{i}.layer"], h[f"{i}.layer"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="HF checkpoint directory (default: the demo model)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--hf-tokens", help="bf16_agreement.py's file: HF's continuations")
    ap.add_argument("--prompts", default="0,1,2", help="indices into the agreement's prompts")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    model_dir = model_dir_or_demo(args.model)
    dtype = getattr(torch, args.dtype)
    tokenizer = Tokenizer.from_model_dir(model_dir)
    indices = [int(i) for i in args.prompts.split(",")]
    prompts = [tokenizer.encode(p) for p in corpus_prompts(max(indices) + 1)]
    continuations = json.loads(Path(args.hf_tokens).read_text())[0] if args.hf_tokens else None

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(args.device).eval()
    hf_weights: dict[str, torch.Tensor] = {}
    for i, layer in enumerate(hf.model.layers):
        for parent, names in LINEARS.values():
            for name in names:
                hf_weights[f"{i}.{name}"] = getattr(getattr(layer, parent), name).weight.detach()
    llm = LLM(str(model_dir), device=args.device, dtype=args.dtype, enable_prefix_caching=False,
              enforce_eager=True)  # fmt: skip
    engine_model = llm.engine.runner.model
    results: dict[str, Any] = {"model": str(model_dir), "device": args.device, "prompts": {}}
    for index in indices:
        tokens = prompts[index] + (continuations[index] if continuations else [])
        hf_rec, engine_rec = Recorder(), Recorder()
        watch_hf(hf, hf_rec)
        with torch.no_grad():
            hf(torch.tensor([tokens], device=args.device))
        hf_rec.close()
        watch_engine(engine_model, engine_rec)
        llm.generate([{"prompt_token_ids": tokens}], SamplingParams(max_tokens=1), use_tqdm=False)
        engine_rec.close()
        layers = [
            compare_layer(i, hf_rec, engine_rec, hf_weights) for i in range(len(hf.model.layers))
        ]
        first = next(
            (f"layer {i} {op}" for i, ops in enumerate(layers) for op, r in ops.items()
             if r["engine"] > 0),
            "none",
        )  # fmt: skip
        results["prompts"][index] = {
            "tokens": len(tokens),
            "first_difference": first,
            "layers": layers,
        }
        print(f"prompt {index} ({len(tokens)} tokens): first op that differs: {first}")
        for op, r in layers[0].items():
            print(f"  layer 0 {op:26s} {r}")
        for op in LINEARS:  # the isolated GEMM checks, worst layer
            worst = {k: max(ops[op][k] for ops in layers) for k in ("fused", "rows")}
            print(f"  every layer {op:22s} at most {worst}")
        print(f"  final norm: {share_differ(engine_rec.outputs['norm'], hf_rec.outputs['norm'])}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

"""How often the engine's greedy continuations equal HF transformers', beside how often HF's own
left-padded batches equal HF one prompt at a time (issue 12's numerics bar).

    python bench/bf16_agreement.py [--model DIR] [--device cuda] [--dtype bfloat16]
        [--hf-tokens FILE] [--max-num-seqs N]

Prompts: `--num-prompts` word prefixes of the demo corpus (bench/quant_accuracy.py's), token ids
from the model's tokenizer, fed to all three runs alike:
- reference: HF `generate`, one prompt at a time, greedy, `--output-len` new tokens;
- HF batched: the same in left-padded batches of `--batch-size` (attention mask);
- engine: `LLM.generate` on all prompts at once (continuous batching, prefix caching off).
Reports, against the reference, the continuations equal token for token, the mean share of
tokens before the first difference, and at each first difference of the engine the reference
model's top-2 log-prob gap there (teacher-forced on the reference's own tokens): a near-tie is
a rounding decision, a wide gap a bug. Default model: the demo checkpoint (SmolLM2-135M).

Where the engine rounds differently: `--hf-tokens FILE` keeps HF's two runs in FILE (written
when missing, read when there), so engine variants reuse them, e.g. one kernel at a time on the
PyTorch reference (`LORAPLEX_KERNELS=reference:rms_norm,fused_add_rms_norm`) or fewer sequences
per step (`--max-num-seqs 1` is the engine one prompt at a time, as the reference runs).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from quant_accuracy import corpus_prompts, first_difference, model_dir_or_demo
from transformers import AutoModelForCausalLM

from loraplex.engine import LLM, SamplingParams
from loraplex.engine.tokenizer import Tokenizer


@torch.no_grad()
def hf_greedy(
    model: Any, prompts: list[list[int]], output_len: int, batch_size: int
) -> list[list[int]]:
    """Greedy continuations from HF generate, in left-padded batches of `batch_size`."""
    device = model.device
    pad = model.config.eos_token_id
    pad = pad[0] if isinstance(pad, list) else pad
    # EOS is banned until the last token (min_new_tokens), as the engine's min_tokens bans it.
    config = copy.deepcopy(model.generation_config)
    config.update(do_sample=False, pad_token_id=pad, temperature=None, top_p=None, top_k=None,
                  max_new_tokens=output_len, min_new_tokens=output_len)  # fmt: skip
    out: list[list[int]] = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        width = max(map(len, batch))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
        generated = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        out += [row[width:].tolist() for row in generated]
    return out


@torch.no_grad()
def top2_gap(
    model, prompt: list[int], tokens: list[int], position: int, banned: list[int]
) -> float:
    """The reference model's log-prob gap between its top two tokens (`banned` ones left out,
    as generation bans them) at `position` of the continuation `tokens` of `prompt`
    (teacher-forced, one forward)."""
    ids = torch.tensor([prompt + tokens[:position]], device=model.device)
    logits = model(input_ids=ids).logits[0, -1].float()
    logits[banned] = float("-inf")
    top = torch.log_softmax(logits, dim=-1).topk(2).values
    return float(top[0] - top[1])


def agreement(runs: list[list[int]], reference: list[list[int]]) -> dict:
    prefixes = [first_difference(a, b) for a, b in zip(runs, reference, strict=True)]
    length = len(reference[0])
    return {
        "equal": sum(p == length for p in prefixes),
        "of": len(reference),
        "mean_prefix_share": round(statistics.mean(prefixes) / length, 3),
        "first_differences": prefixes,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="HF checkpoint directory (default: the demo model)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--hf-tokens", help="HF's continuations: written when missing, else read")
    ap.add_argument("--max-num-seqs", type=int, help="the engine's sequences per step")
    ap.add_argument(
        "--enforce-eager", action="store_true", help="no CUDA graphs (the references need it)"
    )
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    model_dir = model_dir_or_demo(args.model)
    dtype = getattr(torch, args.dtype)
    tokenizer = Tokenizer.from_model_dir(model_dir)
    prompts = [tokenizer.encode(p) for p in corpus_prompts(args.num_prompts)]

    started = time.perf_counter()
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(args.device).eval()
    saved = Path(args.hf_tokens) if args.hf_tokens else None
    if saved is not None and saved.exists():
        reference, batched = json.loads(saved.read_text())
        assert len(reference) == len(prompts) and len(reference[0]) == args.output_len
    else:
        reference = hf_greedy(hf, prompts, args.output_len, batch_size=1)
        batched = hf_greedy(hf, prompts, args.output_len, args.batch_size)
        if saved is not None:
            saved.write_text(json.dumps([reference, batched]))
    hf_seconds = time.perf_counter() - started

    started = time.perf_counter()
    limits: dict[str, Any] = {"enforce_eager": args.enforce_eager}
    if args.max_num_seqs is not None:
        limits["max_num_seqs"] = args.max_num_seqs
    llm = LLM(
        str(model_dir), device=args.device, dtype=args.dtype, enable_prefix_caching=False, **limits
    )
    # min_tokens bans EOS (not with ignore_eos, which takes EOS out of the stop ids, as vLLM).
    params = SamplingParams(max_tokens=args.output_len, min_tokens=args.output_len, temperature=0.0)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    engine = [o.outputs[0].token_ids for o in outputs]
    engine_seconds = time.perf_counter() - started

    results = {
        "model": str(model_dir),
        "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
        "dtype": args.dtype,
        "kernels": os.environ.get("LORAPLEX_KERNELS", "auto"),
        "max_num_seqs": args.max_num_seqs,
        "enforce_eager": args.enforce_eager,
        "engine_vs_hf": agreement(engine, reference),
        f"hf_batches_of_{args.batch_size}_vs_hf": agreement(batched, reference),
        "seconds": {"hf": round(hf_seconds, 1), "engine": round(engine_seconds, 1)},
    }
    diverged_at = results["engine_vs_hf"]["first_differences"]
    gaps = [
        round(top2_gap(hf, prompt, ref, at, list(tokenizer.eos_token_ids)), 4)
        for prompt, ref, at in zip(prompts, reference, diverged_at, strict=True)
        if at < args.output_len
    ]
    results["engine_divergence_top2_gaps"] = gaps
    for name in ("engine_vs_hf", f"hf_batches_of_{args.batch_size}_vs_hf"):
        r = results[name]
        print(f"{name}: {r['equal']}/{r['of']} equal, mean prefix {r['mean_prefix_share']:.1%}")
    print(f"engine divergences: top-2 gaps {sorted(gaps)}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

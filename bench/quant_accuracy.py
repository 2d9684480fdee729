"""Accuracy of a quantized base against the same model unquantized, on the CPU reference path
(the same quantization math as the GPU path): greedy agreement and perplexity.

    python bench/quant_accuracy.py                      # FP8 (online) on the demo model
    python bench/quant_accuracy.py --model DIR --quantization fp8 --num-prompts 64 --output-len 64

Greedy: `--num-prompts` prompts (word prefixes of the built-in demo corpus) continued for
`--output-len` tokens by both models; reports the share of continuations that are equal token
for token, and the mean share of tokens equal before the first difference. Perplexity: each
text (the demo corpus; this repository's docs/architecture.md, at most `--max-text-tokens`
each) in windows of `--window` tokens, teacher-forced through the model's own forward, both
models alike; on the same positions, the share where the two models' greedy next tokens agree
(a per-token figure: free-running continuations part at their first near-tie and never
rejoin, so whole-continuation equality says little on a small model). The same per-token share
along the baseline's own greedy continuations: each prompt plus its baseline continuation
teacher-forced through both models, their greedy next tokens compared at the continuation's
positions.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from loraplex.engine import LLM, SamplingParams
from loraplex.engine.model import ForwardContext, LlamaForCausalLM, load_model
from loraplex.engine.model.forward_context import AttentionMetadata
from loraplex.engine.tokenizer import Tokenizer
from loraplex.platform.demo.corpus import DEMO_CORPUS

BLOCK_SIZE = 16
DOCS_TEXT = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"


def corpus_prompts(num_prompts: int) -> list[str]:
    """Word prefixes (4, 7, 10, ... words) of the corpus' lines, round-robin."""
    lines = [line.split() for line in DEMO_CORPUS.splitlines() if len(line.split()) >= 8]
    prompts: list[str] = []
    cut = 4
    while len(prompts) < num_prompts:
        prompts += [" ".join(words[:cut]) for words in lines if len(words) > cut]
        cut += 3
    return prompts[:num_prompts]


def model_dir_or_demo(model: str | None) -> Path:
    """`model`, or the demo checkpoint (converted once into the platform's cache directory)."""
    if model:
        return Path(model)
    from loraplex.platform.demo.checkpoint import ensure_demo_checkpoint
    from loraplex.platform.settings import default_cache_dir

    return ensure_demo_checkpoint(default_cache_dir())


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))


def greedy(llm: LLM, prompts: list[str], output_len: int) -> list[list[int]]:
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


@torch.no_grad()
def prefill_logits(model: LlamaForCausalLM, chunk: list[int]) -> torch.Tensor:
    """One fresh single-sequence prefill of `chunk` -> next-token logits [n - 1, vocab] float32
    (none after the last token)."""
    arch = model.arch
    n = len(chunk)
    num_blocks = -(-n // BLOCK_SIZE)
    shape = (num_blocks, BLOCK_SIZE, arch.num_key_value_heads, arch.head_dim)
    kv = [
        (torch.zeros(shape, dtype=model.dtype), torch.zeros(shape, dtype=model.dtype))
        for _ in range(arch.num_hidden_layers)
    ]
    attn = AttentionMetadata(
        slot_mapping=torch.arange(n, dtype=torch.int64),
        block_tables=torch.arange(num_blocks, dtype=torch.int32)[None],
        seq_lens=torch.tensor([n], dtype=torch.int32),
        query_start_loc=torch.tensor([0, n], dtype=torch.int32),
        max_query_len=n,
        max_seq_len=n,
    )
    ctx = ForwardContext(attn=attn, kv_caches=kv, lora=None)
    hidden = model(torch.tensor(chunk), torch.arange(n), ctx)
    return model.compute_logits(hidden[:-1]).float()


def perplexity(model: LlamaForCausalLM, ids: list[int], window: int) -> tuple[float, list[int]]:
    """(exp(mean NLL), the greedy next token at each position) over windows of `window`
    tokens, each a fresh single-sequence prefill."""
    nll, count = 0.0, 0
    top1: list[int] = []
    for start in range(0, len(ids) - 1, window):
        chunk = ids[start : start + window]
        if len(chunk) < 2:
            break
        logits = prefill_logits(model, chunk)  # [n - 1, vocab]
        nll += F.cross_entropy(logits, torch.tensor(chunk[1:]), reduction="sum").item()
        top1 += logits.argmax(dim=-1).tolist()
        count += len(chunk) - 1
    return math.exp(nll / count), top1


def continuation_top1(
    model: LlamaForCausalLM, prompt_ids: list[list[int]], continuations: list[list[int]]
) -> list[int]:
    """The greedy next token at every position of each continuation, teacher-forced: prompt and
    continuation in one prefill, the argmax before each continuation token."""
    top1: list[int] = []
    for prompt, continuation in zip(prompt_ids, continuations, strict=True):
        logits = prefill_logits(model, prompt + continuation)  # [n - 1, vocab]
        top1 += logits[len(prompt) - 1 :].argmax(dim=-1).tolist()
    return top1


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", help="HF checkpoint dir (default: the demo model)")
    ap.add_argument("--quantization", default="fp8", choices=["fp8", "awq", "gptq"])
    ap.add_argument("--baseline-model", help="the unquantized twin (default: --model itself)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--max-text-tokens", type=int, default=4096, help="per perplexity text")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    model_dir = model_dir_or_demo(args.model)
    baseline_dir = Path(args.baseline_model) if args.baseline_model else model_dir
    tokenizer = Tokenizer.from_model_dir(model_dir)
    texts = {"demo_corpus": DEMO_CORPUS, "architecture_md": DOCS_TEXT.read_text()}
    prompts = corpus_prompts(args.num_prompts)
    results: dict = {
        "model": str(model_dir),
        "quantization": args.quantization,
        "dtype": args.dtype,
        "num_prompts": len(prompts),
        "output_len": args.output_len,
    }
    outputs = {}
    top1: dict[tuple[str, str], list[int]] = {}
    prompt_ids = [tokenizer.encode(prompt) for prompt in prompts]
    runs = (("baseline", baseline_dir, None), ("quantized", model_dir, args.quantization))
    for name, path, quant in runs:
        start = time.perf_counter()
        llm = LLM(str(path), device="cpu", dtype=args.dtype, quantization=quant, enable_lora=False)
        outputs[name] = greedy(llm, prompts, args.output_len)
        del llm
        model, _ = load_model(path, args.dtype, "cpu", quant)
        top1[name, "continuations"] = continuation_top1(model, prompt_ids, outputs["baseline"])
        for text_name, text in texts.items():
            ids = tokenizer.encode(text)[: args.max_text_tokens]
            ppl, top1[name, text_name] = perplexity(model, ids, args.window)
            results[f"{name}_ppl_{text_name}"] = ppl
        print(f"{name}: done in {time.perf_counter() - start:.0f} s", flush=True)
    pairs = list(zip(outputs["baseline"], outputs["quantized"], strict=True))
    equal = sum(a == b for a, b in pairs) / len(pairs)
    prefix = [first_difference(a, b) / len(a) for a, b in pairs]
    results["greedy_equal_share"] = equal
    results["mean_equal_prefix_share"] = sum(prefix) / len(prefix)
    print(
        f"greedy continuations equal token for token: {equal:.1%} of {len(pairs)} "
        f"({args.output_len} tokens each); mean equal prefix {sum(prefix) / len(prefix):.1%}"
    )
    same = [a == b for a, b in zip(top1["baseline", "continuations"],
                                    top1["quantized", "continuations"], strict=True)]  # fmt: skip
    results["top1_agreement_continuations"] = agreement = sum(same) / len(same)
    print(f"  greedy next token equal to the baseline's along the baseline's continuations, "
          f"teacher-forced: {agreement:.1%} of {len(same)} positions")  # fmt: skip
    for text_name in texts:
        base, quant = results[f"baseline_ppl_{text_name}"], results[f"quantized_ppl_{text_name}"]
        print(f"perplexity on {text_name}: {base:.3f} -> {quant:.3f} ({quant / base - 1:+.2%})")
        same = [a == b for a, b in zip(top1["baseline", text_name], top1["quantized", text_name],
                                        strict=True)]  # fmt: skip
        results[f"top1_agreement_{text_name}"] = agreement = sum(same) / len(same)
        print(f"  greedy next token equal to the baseline's, teacher-forced: {agreement:.1%} "
              f"of {len(same)} positions")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

import sys, time, tempfile, json
sys.path.insert(0, "/tmp/memcheck"); sys.path.insert(0, "/work/main/bench")
import memcheck  # noqa: F401  (patches first)
from pathlib import Path
from workload import write_shape_checkpoint, write_random_adapter, synthetic_prompts
from loraplex.engine import LLM, LoRARequest, SamplingParams

n_prompts, prompt_len, out_len, budget = (int(a) for a in sys.argv[1:5])
quant = sys.argv[5] if len(sys.argv) > 5 else "fp8"
tmp = Path(tempfile.mkdtemp())
model_dir = write_shape_checkpoint("tiny", tmp / "tiny")
config = json.loads((model_dir / "config.json").read_text())
prompts = synthetic_prompts(n_prompts, prompt_len, prompt_len, config["vocab_size"])
reqs = [LoRARequest(f"a{i}", i + 1, str(write_random_adapter(tmp / f"a{i}", config, 16, seed=i))) for i in range(8)]
llm = LLM(str(model_dir), device="cpu", dtype="bfloat16", load_format="dummy", max_num_seqs=256,
          max_num_batched_tokens=budget, enable_prefix_caching=False, max_lora_rank=16,
          max_cpu_loras=8, quantization=None if quant == "none" else quant)
params = SamplingParams(max_tokens=out_len, temperature=0.0, ignore_eos=True, detokenize=False)
t = time.time()
outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, [reqs[i % 8] for i in range(n_prompts)], use_tqdm=False)
print("ok", [len(o.outputs[0].token_ids) for o in outs][:4], f"{time.time() - t:.1f} s")

#!/usr/bin/env bash
# Call 4: bf16 and FP8 W1 with 0 and 8 adapters, 3 interleaved rounds each, the new wheel; the
# engine's log (graph capture time) on.
set -u
export OUT
bash bench/h200_run.sh env
for q in none fp8; do
  timeout 280 python3 - "$q" <<'PY' 2>&1 | grep -v Loading | tee "$OUT/w1_$q.txt"
import logging, runpy, sys
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
q = sys.argv[1]
sys.path.insert(0, "bench")
sys.argv = ["offline_throughput.py", "--shape", "llama3-8b", "--device", "cuda", "--quantization", q,
            "--skip-hf", "--num-prompts", "512", "--min-prompt", "512", "--max-prompt", "512",
            "--output-len", "128", "--adapters", "0,8", "--repeats", "3", "--skip-breakdown",
            "--json", f"{__import__('os').environ['OUT']}/w1_{q}.json"]
runpy.run_path("bench/offline_throughput.py", run_name="__main__")
PY
done

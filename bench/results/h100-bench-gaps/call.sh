# Where the device idles in W1 (bf16, 0 and 8 adapters): one profiled run each
set -u
OUT=${OUT:-bench/results/tmp}
bash bench/h200_run.sh env
timeout 220 python3 bench/offline_throughput.py --shape llama3-8b --device cuda --skip-hf \
  --num-prompts 512 --min-prompt 512 --max-prompt 512 --output-len 128 --adapters 0,8 \
  --repeats 1 --skip-breakdown --kernel-totals "$OUT/kt_none.txt" \
  --json "$OUT/w1_none.json" 2>&1 | grep -v "Loading\|Writing" | tee "$OUT/w1_none.txt"
grep -A12 "Device idle" "$OUT"/kt_*.txt

#!/usr/bin/env bash
# Scratch: tile loops unpipelined (num_stages=1), expand without runs unlooped (this tree) against f9826d1.
set -u
export PIP_BREAK_SYSTEM_PACKAGES=1
start=$(date +%s)
bash bench/h200_run.sh env
timeout -s INT 80 python3 -m pytest -q -p no:cacheprovider -rfE tests/kernels/test_gpu_lora_kernels.py 2>&1 | tail -2 | tee "$OUT/gpu_tests.txt"
for t in "4096 --run 512" "256 --run 1"; do
  timeout 100 python3 bench/lora_step_tiles.py --table-only --tokens $t 2>&1 | grep -E "^T|  shrink|  expand" | tee -a "$OUT/micro_new.txt"
done
timeout 100 python3 bench/silu_lora_tiles.py --table-only 2>&1 | tee -a "$OUT/micro_new.txt"
w1() {  # name adapters [extra args]
  local name=$1 ad=$2; shift 2
  local left=$(( 570 - ($(date +%s) - start) ))
  if [ $left -lt 90 ]; then echo "=== $name skipped ($left s left)"; return; fi
  echo "=== $name $(date +%T)"
  timeout -s INT $((left - 5)) python3 bench/offline_throughput.py --shape llama3-8b --device cuda \
    --skip-hf --num-prompts 512 --min-prompt 512 --max-prompt 512 --output-len 128 \
    --adapters "$ad" --repeats 2 --skip-breakdown --json "$OUT/$name.json" "$@" 2>&1 | grep -v Loading | grep -v "^\s*$" | tee "$OUT/$name.txt"
}
w1 new_bf16 0,8 --kernel-totals "$OUT/kt_new_bf16.txt"
python3 -m pip install -q --no-deps --force-reinstall .gpu/old/loraplex-*.whl
w1 old_bf16 8
echo "=== done $(date +%T)"

#!/usr/bin/env bash
# Scratch: side-stream threshold A/B (64 vs 256) and the slice-fastest shrink grid (new wheel) vs fbae9b3 (old).
set -u
export PIP_BREAK_SYSTEM_PACKAGES=1
start=$(date +%s)
bash bench/h200_run.sh env
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -l 1 > "$OUT/clocks.csv" &
w1() {  # name overlap quant adapters [extra args]
  local name=$1 ov=$2 q=$3 ad=$4; shift 4
  local left=$(( 585 - ($(date +%s) - start) ))
  if [ $left -lt 120 ]; then echo "=== $name skipped ($left s left)"; return; fi
  echo "=== $name $(date +%T)"
  timeout -s INT $((left - 10)) python3 .gpu/overlap_run.py "$ov" --shape llama3-8b --device cuda \
    --quantization "$q" --skip-hf --num-prompts 512 --min-prompt 512 --max-prompt 512 --output-len 128 \
    --adapters "$ad" --repeats 2 --skip-breakdown --json "$OUT/$name.json" "$@" 2>&1 | grep -v Loading | tee "$OUT/$name.txt"
}
w1 new_bf16_ov64 64 none 0,8 --kernel-totals "$OUT/kt_new_bf16_ov64.txt"
w1 new_bf16_ov256 256 none 8
w1 new_fp8_ov256 256 fp8 0,8
python3 -m pip install -q --no-deps --force-reinstall .gpu/old/loraplex-*.whl
w1 old_bf16_ov64 64 none 8 --kernel-totals "$OUT/kt_old_bf16_ov64.txt"
python3 -m pip install -q --no-deps --force-reinstall .whl/loraplex-*.whl
kill %1 2>/dev/null
echo "=== done $(date +%T)"

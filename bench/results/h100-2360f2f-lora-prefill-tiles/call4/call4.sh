#!/usr/bin/env bash
# Scratch: this tree (slice-fastest shrink grid, 32-row prefill expand) against fbae9b3, same lease.
set -u
export PIP_BREAK_SYSTEM_PACKAGES=1
start=$(date +%s)
bash bench/h200_run.sh env
timeout -s INT 170 python3 -m pytest -q -p no:cacheprovider -rfE tests/kernels/test_gpu_lora_kernels.py tests/engine/test_quantized_cuda.py 2>&1 | grep -v Loading | tail -6 | tee "$OUT/gpu_tests.txt"
w1() {  # name quant adapters [extra args]
  local name=$1 q=$2 ad=$3; shift 3
  local left=$(( 580 - ($(date +%s) - start) ))
  if [ $left -lt 100 ]; then echo "=== $name skipped ($left s left)"; return; fi
  echo "=== $name $(date +%T)"
  timeout -s INT $((left - 5)) python3 bench/offline_throughput.py --shape llama3-8b --device cuda \
    --quantization "$q" --skip-hf --num-prompts 512 --min-prompt 512 --max-prompt 512 --output-len 128 \
    --adapters "$ad" --repeats 2 --skip-breakdown --json "$OUT/$name.json" "$@" 2>&1 | grep -v Loading | tee "$OUT/$name.txt"
}
w1 new_bf16 none 0,8 --kernel-totals "$OUT/kt_new_bf16.txt"
python3 -m pip install -q --no-deps --force-reinstall .gpu/old/loraplex-*.whl
w1 old_bf16 none 8 --kernel-totals "$OUT/kt_old_bf16.txt"
python3 -m pip install -q --no-deps --force-reinstall .whl/loraplex-*.whl
w1 new_fp8 fp8 8
echo "=== done $(date +%T)"

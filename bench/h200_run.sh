#!/usr/bin/env bash
# One lease, one script: correctness first, then timing. Run from the repo root on the device
# machine: `bash bench/h200_run.sh [steps...]`; results go to $OUT (or bench/results/tmp).
set -u
OUT=${OUT:-bench/results/tmp}; mkdir -p "$OUT"
# The device image has torch/triton/transformers/peft but not our package: expose the folders
# as `loraplex.*` through a shim directory instead of installing.
mkdir -p /tmp/shim/loraplex
for d in engine kernels platform; do ln -sfn "$PWD/$d" "/tmp/shim/loraplex/$d"; done
export PYTHONPATH=/tmp/shim:$PWD PYTHONUNBUFFERED=1
steps=${*:-"env kernels kernel-tests engine tput"}
for step in $steps; do
  echo "=== $step ($(date +%T))"
  case $step in
    env) nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
         python3 -c "import torch, triton, transformers, peft; print(torch.__version__, triton.__version__, transformers.__version__, peft.__version__)";;
    kernels) timeout 300 python3 bench/kernels_check.py ${KERNELS_ARGS:-} 2>&1 | tee "$OUT/kernels.txt";;
    fused) timeout 120 python3 bench/fused_ops_check.py 2>&1 | tee "$OUT/fused_ops.txt";;
    prio) timeout 240 python3 bench/priority_latency.py --shape llama3-8b --device cuda \
            --flood 256 --flood-prompt 512 --flood-output 128 --trickle 16 --interval 0.25 \
            --max-num-seqs 64 --json "$OUT/priority.json" 2>&1 | grep -v Loading \
            | tee "$OUT/priority.txt";;
    kernel-tests) timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/kernels 2>&1 | tail -5 | tee "$OUT/kernel_tests.txt";;
    engine) timeout 240 python3 bench/gpu_engine_check.py --json "$OUT/engine_check.json" 2>&1 | grep -v Loading | tee "$OUT/engine_check.txt";;
    tput) timeout 420 python3 bench/offline_throughput.py --shape llama3-8b --device cuda \
            --num-prompts 64 --min-prompt 512 --max-prompt 512 --output-len 128 \
            --hf-batch-size 32 --adapters "${ADAPTERS:-0,1,8}" --repeats "${REPEATS:-3}" --json "$OUT/throughput.json" ${TPUT_ARGS:-} 2>&1 \
            | grep -v Loading | tee "$OUT/throughput.txt";;
  esac
done

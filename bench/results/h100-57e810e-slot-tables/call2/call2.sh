#!/usr/bin/env bash
# Call 2: the FP8 GPU tests (fast accumulation), then FP8 W1 new (0, 8 adapters) and old (0).
set -u
export OUT
TESTS="tests/kernels/test_fp8_reference.py tests/engine/test_quantized_cuda.py tests/engine/test_fp8_projection_inputs.py" \
TESTS_TIMEOUT=150 QUANTS=fp8 QUANT_RUNS=w1 QUANT_ADAPTERS=0,8 QUANT_ARGS="--repeats 2" \
  bash bench/h200_run.sh gpu-tests quant
PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --no-deps --force-reinstall \
  --ignore-requires-python .gpu/old/loraplex-0.1.0-py3-none-any.whl
timeout 170 python3 bench/offline_throughput.py --shape llama3-8b --device cuda --quantization fp8 \
  --skip-hf --num-prompts 512 --min-prompt 512 --max-prompt 512 --output-len 128 --adapters 0 \
  --repeats 2 --skip-breakdown --json "$OUT/quant_w1_fp8_old.json" 2>&1 | grep -v Loading \
  | tee "$OUT/quant_w1_fp8_old.txt"

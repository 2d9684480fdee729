#!/usr/bin/env bash
# FP8 norms/activation without the unquantized copy (this checkout) against db9e499, W1 FP8 no adapters.
set -u
export PIP_BREAK_SYSTEM_PACKAGES=1
TESTS="tests/kernels/test_fp8_reference.py tests/engine/test_quantized_cuda.py::test_cuda_graph_decode_equals_eager tests/engine/test_quantized_cuda.py::test_fp8_layers_on_cuda_match_the_reference_path tests/engine/test_quantized_cuda.py::test_fp8_with_adapters_finishes_a_full_batch" \
  TESTS_TIMEOUT=200 bash bench/h200_run.sh env gpu-tests
w1() { timeout -s INT 130 python3 bench/offline_throughput.py --shape llama3-8b --device cuda --quantization fp8 \
  --skip-hf --num-prompts 512 --min-prompt 512 --max-prompt 512 --output-len 128 --adapters 0 \
  --repeats 2 --skip-breakdown --json "$OUT/w1_$1.json" "${@:2}" 2>&1 | grep -v Loading | tee "$OUT/w1_$1.txt"; }
echo "=== new (a)"; w1 new_a
python3 -m pip install -q --no-deps --force-reinstall .gpu/old/loraplex-*.whl
echo "=== old db9e499"; w1 old
python3 -m pip install -q --no-deps --force-reinstall .whl/loraplex-*.whl
echo "=== new (b)"; w1 new_b --kernel-totals "$OUT/kernel_totals_new.txt"

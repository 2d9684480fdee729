#!/usr/bin/env bash
# Call 1: correctness of the step-sized slot tables and FP8 fast accumulation, then the A/B.
set -u
export OUT
TESTS="tests/engine/test_engine_cuda.py tests/engine/test_lora_batch_cuda_graph.py tests/engine/test_cuda_graph_buffers.py tests/kernels/test_fp8_reference.py tests/engine/test_quantized_cuda.py" \
TESTS_TIMEOUT=170 AB_W1_TIMEOUT=170 OLD_WHEEL=.gpu/old/loraplex-0.1.0-py3-none-any.whl \
  bash bench/h200_run.sh env gpu-tests ab

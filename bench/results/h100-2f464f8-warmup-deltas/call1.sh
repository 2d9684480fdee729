#!/usr/bin/env bash
# GPU tests: the start-up warm-up (no compile while serving), attention (mixed-step views), LoRA
# kernels (grid_math), the engine against HF; then the specialization keys on CUDA.
TESTS="tests/engine/test_kernel_warmup.py tests/kernels/test_gpu_attention.py tests/kernels/test_gpu_lora_kernels.py tests/engine/test_engine_cuda.py" \
TESTS_TIMEOUT=420 bash bench/h200_run.sh env gpu-tests 2>&1 | tail -40
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_kernel_specialization.py 2>&1 | tail -3 | tee "$OUT/specialization.txt"

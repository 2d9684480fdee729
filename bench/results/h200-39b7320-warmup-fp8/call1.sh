set -u
TESTS="tests/engine/test_kernel_warmup.py tests/engine/test_engine_cuda.py" TESTS_TIMEOUT=${T:-200} OUT=$OUT bash bench/h200_run.sh env gpu-tests 2>&1 | tail -20

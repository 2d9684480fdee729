# tests of the fused down shrink and the unrun GPU tests, then bf16 W1 A/B (old 8, new 0,8)
set -u
TESTS="tests/kernels/test_gpu_lora_kernels.py tests/engine/test_engine_cuda.py tests/engine/test_lora_batch.py tests/engine/test_lora_batch_cuda_graph.py tests/kernels/test_cuda_graph_replay.py tests/kernels/test_gpu_fused_ops.py" \
TESTS_TIMEOUT=240 bash bench/h200_run.sh env gpu-tests
AB_MICRO=0 OLD_WHEEL=.gpu/old/loraplex-0.1.0-py3-none-any.whl bash bench/h200_run.sh ab

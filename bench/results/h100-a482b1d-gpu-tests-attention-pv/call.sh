# GPU tests of the moved rotary_and_cache code, the shrink-in-GEMM experiment, and the
# attention P@V precision variants' rounding and speed.
set -u
export OUT
TESTS="tests/kernels/test_gpu_attention.py tests/kernels/test_gpu_fused_ops.py tests/kernels/test_cuda_graph_replay.py tests/engine/test_engine_cuda.py" TESTS_TIMEOUT=280 bash bench/h200_run.sh env gpu-tests
echo "=== shrink_in_gemm $(date +%T)"
timeout 150 python3 bench/results/cpu-4dfce5d-shrink-in-base-gemm/shrink_in_gemm.py 2>&1 | tee $OUT/shrink_in_gemm.txt
for v in tf32 tf32x3; do python3 -m pip install -q --no-deps --no-index --target /tmp/v_$v .gpu/var_$v/*.whl; done
for v in main tf32 tf32x3; do
  PP=""; [ $v != main ] && PP=/tmp/v_$v
  echo "=== rounding $v $(date +%T)"
  PYTHONPATH=$PP timeout 100 python3 bench/kernel_rounding.py --json $OUT/rounding_$v.json > $OUT/rounding_$v.txt 2>&1; tail -30 $OUT/rounding_$v.txt
  echo "=== attention $v $(date +%T)"
  PYTHONPATH=$PP timeout 100 python3 bench/attention_bench.py --batches 64 --contexts 640,4096 --json $OUT/attn_$v.json > $OUT/attn_$v.txt 2>&1; tail -25 $OUT/attn_$v.txt
done
echo "=== end $(date +%T)"

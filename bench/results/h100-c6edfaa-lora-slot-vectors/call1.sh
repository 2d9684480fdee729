# A/B of c6edfaa ("old") and the chain-cut LoRA kernels ("new"): GPU tests, LoRA micro, silu.
set -u
export OUT
bash bench/h200_run.sh env 2>&1 | tail -3
PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --no-deps --no-index --target /tmp/old .gpu/old/loraplex-*.whl
TESTS="tests/kernels/test_gpu_lora_kernels.py tests/kernels/test_lora_kernels.py tests/kernels/test_silu_and_mul_lora.py tests/kernels/test_cuda_graph_replay.py tests/kernels/test_kernel_specialization.py tests/engine/test_lora_batch_cuda_graph.py tests/engine/test_engine_cuda.py" \
  TESTS_TIMEOUT=200 bash bench/h200_run.sh gpu-tests 2>&1 | tail -4
for w in new old new old; do
  pp=""; [ $w = old ] && pp=/tmp/old
  echo "=== micro $w $(date +%T)"
  PYTHONPATH=$pp timeout 120 python3 bench/results/h100-c6edfaa-lora-slot-vectors/lora_ab.py $OUT/micro_$w.json 2>&1 | tail -6
done
for w in new old; do
  pp=""; [ $w = old ] && pp=/tmp/old
  echo "=== silu $w $(date +%T)"
  PYTHONPATH=$pp timeout 100 python3 bench/silu_lora_tiles.py --table-only --json $OUT/silu_$w.json 2>&1 | grep -v Loading | grep "table\|alone"
done
echo "=== done $(date +%T)"

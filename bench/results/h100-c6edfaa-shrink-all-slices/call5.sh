# A/B of c6edfaa ("old") and the one-program-for-all-slices shrink ("new"): GPU tests, the LoRA
# micro, W1 at 512 sequences (new: 0 and 8 adapters; old: 8).
set -u
export OUT
bash bench/h200_run.sh env 2>&1 | tail -2
PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --no-deps --no-index --target /tmp/old .gpu/old/loraplex-*.whl
TESTS="tests/kernels/test_gpu_lora_kernels.py tests/kernels/test_lora_kernels.py tests/engine/test_lora_batch_cuda_graph.py tests/engine/test_engine_cuda.py" \
  TESTS_TIMEOUT=170 bash bench/h200_run.sh gpu-tests 2>&1 | tail -3
for w in new old new old; do
  pp=""; [ $w = old ] && pp=/tmp/old
  echo "=== micro $w $(date +%T)"
  PYTHONPATH=$pp timeout 60 python3 bench/results/h100-c6edfaa-lora-slot-vectors/lora_ab.py $OUT/micro_$w.json 2>&1 | tail -5
done
W1=(bench/offline_throughput.py --shape llama3-8b --device cuda --skip-hf --num-prompts 512
    --min-prompt 512 --max-prompt 512 --output-len 128 --repeats 2 --skip-breakdown
    --gpu-memory-utilization 0.85 --max-num-seqs 512)
echo "=== W1 new $(date +%T)"
timeout -s INT 150 python3 "${W1[@]}" --adapters 0,8 --json $OUT/w1_new.json 2>&1 | grep -v Loading | tail -6
echo "=== W1 old $(date +%T)"
PYTHONPATH=/tmp/old timeout -s INT 110 python3 "${W1[@]}" --adapters 8 --json $OUT/w1_old.json 2>&1 | grep -v Loading | tail -4
echo "=== done $(date +%T)"

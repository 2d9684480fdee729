export OUT
bash bench/h200_run.sh env 2>&1 | tail -3
PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --no-deps --no-index --target /tmp/old .gpu/old/loraplex-*.whl
TESTS="tests/kernels/test_gpu_attention.py tests/kernels/test_gpu_fused_ops.py tests/engine/test_engine_cuda.py" TESTS_TIMEOUT=200 bash bench/h200_run.sh gpu-tests 2>&1 | tail -8
cp .gpu/rope_cache_time.py bench/_rope_cache_time.py && timeout 90 python3 bench/_rope_cache_time.py 2>&1 | tee $OUT/rope_cache_time.txt
T="--shape llama3-8b --device cuda --skip-hf --num-prompts 64 --min-prompt 512 --max-prompt 512 --output-len 128 --repeats 2"
for w in old new; do
  pp=""; [ $w = old ] && pp=/tmp/old
  PYTHONPATH=$pp timeout 150 python3 bench/offline_throughput.py $T --json $OUT/tput_$w.json 2>&1 | grep -v Loading > $OUT/tput_$w.txt
  echo "== $w"; grep -E "tok/s|decode|step" $OUT/tput_$w.txt | head -8
done

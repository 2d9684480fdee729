# W4A16 A/B/C in one lease. A = 307bc79 (main), B = ce039f9 (split-K in the kernel, lean loop),
# C = this tree (B + packed-weight prefetch). GPU tests of C; decode-heavy AWQ with A and C;
# split sweeps (CUDA-graph timed) of A and C at 1 and 64 rows.
set -u
OUT=${OUT:-bench/results/tmp}
bash bench/h200_run.sh env
for v in old; do python3 -m pip install -q --no-deps --no-index --target /tmp/$v .gpu/$v/loraplex-*.whl 2>&1 | tail -2; done
timeout 80 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_w4a16_kernels.py 2>&1 | tail -4 | tee "$OUT/w4a16_tests.txt"
D="--shape llama3-8b --device cuda --skip-hf --num-prompts 64 --min-prompt 128 --max-prompt 128 --output-len 512 --adapters 0 --quantization awq"
PYTHONPATH=/tmp/old timeout 90 python3 bench/offline_throughput.py $D --json "$OUT/decode_awq_A.json" 2>&1 | grep -v Loading | tail -3 | tee "$OUT/decode_awq_A.txt"
timeout 90 python3 bench/offline_throughput.py $D --json "$OUT/decode_awq_C.json" 2>&1 | grep -v Loading | tail -3 | tee "$OUT/decode_awq_C.txt"
for v in C old; do
  [ $SECONDS -lt 270 ] || { echo "skip sweep $v: $SECONDS s used"; continue; }
  PYTHONPATH=$([ $v = C ] || echo /tmp/$v) timeout 55 python3 bench/w4a16_sweep.py --row-counts 1,64 --splits-only --json "$OUT/sweep_$v.json" > "$OUT/sweep_$v.txt" 2>&1
done
grep "==" "$OUT"/sweep_*.txt

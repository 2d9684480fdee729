# Before the lease, on the CPU machine (main at or after 041cd2b):
#   mkdir -p .gpu/old && make wheel && mv .whl/loraplex-*.whl .gpu/old/     # main's wheel, side A
#   git apply bench/results/cpu-041cd2b-w4a16-planar/w4a16-planar.patch && make wheel
#   make server-wheels                                                      # the tests need them
# then carry [".whl", ".gpu"] and run `bash bench/results/cpu-041cd2b-w4a16-planar/call2.sh`.
#
# One GPU call (about 8 minutes): A) the patched wheel (.whl/, the planar layout in the engine):
# the W4A16 kernel tests and the 4-bit CUDA engine tests, then the decode-heavy run (64 x 128/512)
# in bf16 and AWQ 4-bit, no adapters; B) the planar kernel's sweep at 64 rows beside main's
# shipped kernel (main's wheel in .gpu/old).
set -u
OUT=${OUT:-bench/results/tmp}; mkdir -p "$OUT"
TESTS="tests/kernels/test_w4a16_kernels.py tests/engine/test_quantized_cuda.py" TESTS_TIMEOUT=130 \
  QUANTS="none awq" QUANT_RUNS=decode QUANT_ADAPTERS=0 QUANT_TIMEOUT=100 \
  bash bench/h200_run.sh env gpu-tests quant 2>&1 | grep -v "^WARN\|Loading" | tail -40
python3 -m pip install -q --no-deps --no-index --target /tmp/old .gpu/old/loraplex-*.whl
OUT=$OUT PYTHONPATH=/tmp/old timeout 110 python3 bench/results/cpu-041cd2b-w4a16-planar/w4_planar.py \
  --rows 64 > "$OUT/w4_planar.txt" 2>&1
tail -4 "$OUT/w4_planar.txt"; cat "$OUT/best_m64.txt"
rm -f "$OUT/gpu_monitor.csv"

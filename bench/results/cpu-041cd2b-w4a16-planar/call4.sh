# For the next lease (about 7 minutes): the planar loop with TMA loads and warp specialization
# (w4_tma_ws.py, 64 rows), then the decode-heavy run in bf16 and AWQ with call3's table, then the
# kernel tests. Set-up as in call2.sh (the patched wheel in .whl/).
set -u
OUT=${OUT:-bench/results/tmp}; mkdir -p "$OUT"
bash bench/h200_run.sh env 2>&1 | grep "differs\|H100\|H200"
timeout 200 python3 bench/results/cpu-041cd2b-w4a16-planar/w4_tma_ws.py 64 2>&1 | grep -v Warn | tee "$OUT/w4_tma_ws.txt" | tail -8
QUANTS="none awq" QUANT_RUNS=decode QUANT_ADAPTERS=0 QUANT_TIMEOUT=90 \
  bash bench/h200_run.sh quant 2>&1 | grep "tok/s\|decode-only\|exit"
timeout 60 python3 -m pytest -q -p no:cacheprovider -rfE tests/kernels/test_w4a16_kernels.py \
  2>&1 | tail -8 | tee "$OUT/tests.txt"
rm -f "$OUT/gpu_monitor.csv"

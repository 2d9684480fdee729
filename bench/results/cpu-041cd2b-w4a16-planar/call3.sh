# Second lease for the planar W4A16 kernel: the table from call2's 64-row sweep (bn=64 bp=32
# 2 stages); the kernel tests on the GPU, the AWQ CUDA-graph engine test, the decode-heavy run in
# bf16 and AWQ. Set-up as in call2.sh (the patched wheel in .whl/).
set -u
OUT=${OUT:-bench/results/tmp}; mkdir -p "$OUT"
bash bench/h200_run.sh env 2>&1 | tail -3  # installs the wheels
timeout 110 python3 -m pytest -q -p no:cacheprovider -rfE tests/kernels/test_w4a16_kernels.py \
  "tests/engine/test_quantized_cuda.py::test_cuda_graph_decode_equals_eager" 2>&1 | tail -8 | tee "$OUT/tests.txt"
QUANTS="none awq" QUANT_RUNS=decode QUANT_ADAPTERS=0 QUANT_TIMEOUT=100 \
  bash bench/h200_run.sh quant 2>&1 | grep "tok/s\|decode-only\|exit"
rm -f "$OUT/gpu_monitor.csv"

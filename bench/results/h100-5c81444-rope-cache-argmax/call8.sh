export OUT
bash bench/h200_run.sh env 2>&1 | tail -2
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/kernels/test_gpu_attention.py tests/kernels/test_gpu_fused_ops.py -k "rotary" 2>&1 | tail -3 | tee $OUT/gpu_tests_rotary.txt

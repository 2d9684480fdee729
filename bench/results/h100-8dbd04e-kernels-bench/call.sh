set -u
export OUT
bash bench/h200_run.sh env > $OUT/env.txt 2>&1; tail -2 $OUT/env.txt
echo "=== kernels_bench $(date +%T)"
timeout -s INT 170 python3 bench/kernels_bench.py > $OUT/kernels.txt 2>&1; echo "rc=$?"
cat $OUT/kernels.txt
echo "=== end $(date +%T)"

set -u
export OUT
bash bench/h200_run.sh env > $OUT/env.txt 2>&1; tail -3 $OUT/env.txt
echo "=== shrink_in_gemm $(date +%T)"
timeout 150 python3 bench/results/cpu-4dfce5d-shrink-in-base-gemm/shrink_in_gemm.py > $OUT/shrink_in_gemm.txt 2>&1
cat $OUT/shrink_in_gemm.txt
echo "=== end $(date +%T)"

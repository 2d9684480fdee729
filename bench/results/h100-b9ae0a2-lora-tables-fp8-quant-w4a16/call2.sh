set -u
export OUT
bash bench/h200_run.sh env 2>&1 | tail -2
timeout 420 python3 bench/results/h100-b9ae0a2-lora-tables-fp8-quant-w4a16/w4_micro.py 2>&1 | tee $OUT/w4_micro.txt

set -x
export OUT
bash bench/h200_run.sh env 2>&1 | tail -5
cp .gpu/dense_lora2.py bench/_dense_lora2.py
timeout 300 python3 bench/_dense_lora2.py 2>&1 | tee $OUT/dense_lora2.txt

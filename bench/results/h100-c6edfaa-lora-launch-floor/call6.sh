set -u
export OUT
bash bench/h200_run.sh env 2>&1 | tail -1
timeout 200 python3 bench/results/h100-c6edfaa-lora-launch-floor/lora_floor.py $OUT/lora_floor.json 2>&1 | grep -v Loading | tee $OUT/lora_floor.txt | cut -c1-200

export OUT
bash bench/h200_run.sh env 2>&1 | tail -3
timeout 500 python3 bench/lora_step_tiles.py --tokens 512 --run 1 --json $OUT/step_tiles_512.json 2>&1 | grep -v "^  shrink .*bad$" | tee $OUT/step_tiles_512.txt | tail -30

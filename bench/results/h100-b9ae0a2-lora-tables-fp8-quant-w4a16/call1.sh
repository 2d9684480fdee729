set -u
export OUT
bash bench/h200_run.sh env 2>&1 | tail -5
python3 bench/results/h100-b9ae0a2-lora-tables-fp8-quant-w4a16/quant_micro.py 2>&1 | tee $OUT/quant_micro.txt
PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --no-deps --no-index --target /tmp/tt <wheel of b9ae0a2 + the tile-table patch>
PYTHONPATH=/tmp/tt python3 bench/results/cpu-dbc27d1-lora-tile-table/lora_tile_table_ab.py --json $OUT/tile_table_ab.json 2>&1 | tee $OUT/tile_table_ab.txt

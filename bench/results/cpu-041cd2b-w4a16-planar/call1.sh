# One GPU call: the planar W4A16 kernel swept at 64 and 16 rows beside the shipped kernel and bf16.
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-deps --no-index --target /tmp/lp .whl/loraplex-0.1.0-py3-none-any.whl
nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=/tmp/lp timeout 540 python3 bench/results/cpu-041cd2b-w4a16-planar/w4_planar.py \
  --rows 64,16 > "$OUT/w4_planar.txt" 2>&1
grep -v "^  swept" "$OUT/w4_planar.txt" | tail -60

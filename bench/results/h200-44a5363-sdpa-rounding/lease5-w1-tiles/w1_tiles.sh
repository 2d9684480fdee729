# Call F: W1 (512 x 512/128, no adapters, prefix caching off) with the prefill row's KV tile of 128
# (the commit) and of 32 (before), the installed kernel edited between runs.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_BREAK_SYSTEM_PACKAGES=1
python3 -m pip install -q --no-index --no-deps .gpu/run/mdeps/*.whl
bash bench/h200_run.sh env > /dev/null 2>&1
SITE=$(python3 -c "import loraplex.kernels, pathlib; print(pathlib.Path(loraplex.kernels.__file__).parent / 'triton')")
for tile in 128 32 128; do
  sed -i "s/AttentionTiles(block_m=128, tile_n=[0-9]*, num_warps=8/AttentionTiles(block_m=128, tile_n=$tile, num_warps=8/" $SITE/paged_attention.py
  echo "### prefill KV tile $(grep -o 'block_m=128, tile_n=[0-9]*' $SITE/paged_attention.py)"
  timeout 100 python3 bench/offline_throughput.py --shape llama3-8b --device cuda --skip-hf --num-prompts 512 \
    --min-prompt 512 --max-prompt 512 --output-len 128 --adapters 0 --skip-breakdown --json $OUT/w1_tile$tile.json 2>&1 | grep "output tok/s"
done

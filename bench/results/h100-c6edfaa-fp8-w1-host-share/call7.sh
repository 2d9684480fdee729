# FP8 W1 at the engine's defaults (512 sequences), 0 and 8 adapters, one round each: is FP8 with
# adapters paced by the host or by the GPU?
set -u
export OUT
bash bench/h200_run.sh env 2>&1 | tail -1
timeout -s INT 170 python3 bench/offline_throughput.py --shape llama3-8b --device cuda --skip-hf \
  --num-prompts 512 --min-prompt 512 --max-prompt 512 --output-len 128 --repeats 1 \
  --skip-breakdown --gpu-memory-utilization 0.85 --max-num-seqs 512 --quantization fp8 \
  --adapters 0,8 --json $OUT/w1_fp8.json 2>&1 | grep -v Loading | tail -14

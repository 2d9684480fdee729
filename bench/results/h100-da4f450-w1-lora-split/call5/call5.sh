# W1 at the engine's new default of 512 sequences per step: GPU time per kernel, 0 and 8 adapters.
set -u
export OUT
bash bench/h200_run.sh env 2>&1 | tail -1
timeout -s INT ${T:-230} python3 bench/offline_throughput.py --shape llama3-8b --device cuda --skip-hf \
  --num-prompts 512 --min-prompt 512 --max-prompt 512 --output-len 128 --repeats 1 --skip-breakdown \
  --gpu-memory-utilization 0.85 --adapters 0,8 --max-num-seqs 512 \
  --kernel-totals $OUT/k_seqs512.txt --json $OUT/w1_seqs512.json 2>&1 | grep -v Loading | tee $OUT/w1_seqs512.txt

# W1 with up to 512 sequences per step against 256 (the bench's default), bf16, 0 and 8 adapters,
# alternated, same machine; then FP8 at 512.
set -u
export OUT
bash bench/h200_run.sh env 2>&1 | tail -1
W1=(bench/offline_throughput.py --shape llama3-8b --device cuda --skip-hf --num-prompts 512
    --min-prompt 512 --max-prompt 512 --output-len 128 --repeats 2 --skip-breakdown
    --gpu-memory-utilization 0.85 --adapters 0,8)
for seqs in 512 256; do
  echo "=== max_num_seqs $seqs $(date +%T)"
  timeout -s INT 190 python3 "${W1[@]}" --max-num-seqs $seqs --json $OUT/w1_seqs$seqs.json 2>&1 \
    | grep -v Loading | tee $OUT/w1_seqs$seqs.txt
done
echo "=== fp8 max_num_seqs 512 $(date +%T)"
timeout -s INT ${T3:-150} python3 "${W1[@]}" --max-num-seqs 512 --quantization fp8 \
  --json $OUT/w1_fp8_seqs512.json 2>&1 | grep -v Loading | tee $OUT/w1_fp8_seqs512.txt
echo "=== done $(date +%T)"

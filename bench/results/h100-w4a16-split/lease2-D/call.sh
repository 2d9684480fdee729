# W4A16 with 307bc79's kernel and only the split rule (gate_up at 17-64 rows split 3, not 8):
# GPU tests, decode-heavy AWQ (then bf16 if time allows)
set -u
OUT=${OUT:-bench/results/tmp}
bash bench/h200_run.sh env
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_w4a16_kernels.py 2>&1 | tail -2 | tee "$OUT/w4a16_tests.txt"
D="--shape llama3-8b --device cuda --skip-hf --num-prompts 64 --min-prompt 128 --max-prompt 128 --output-len 512 --adapters 0"
timeout 90 python3 bench/offline_throughput.py $D --quantization awq --json "$OUT/decode_awq_D.json" 2>&1 | grep -v Loading | tail -3 | tee "$OUT/decode_awq_D.txt"
[ $SECONDS -lt 150 ] && timeout 70 python3 bench/offline_throughput.py $D --json "$OUT/decode_none.json" 2>&1 | grep -v Loading | tail -3 | tee "$OUT/decode_none.txt"

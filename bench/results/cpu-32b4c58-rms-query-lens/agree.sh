set -u
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
cat /tmp/gguf.part1 "${GGUF_PART2:-.gpu/b/gguf.part2}" > /tmp/smol.gguf || exit 3
python3 -c "import pathlib, sys; from loraplex.platform.demo import checkpoint as c
c.find_smollm2_gguf = lambda: pathlib.Path(sys.argv[1]); c.write_smollm2_checkpoint('/tmp/smol')" /tmp/smol.gguf 2>&1 | tail -1
cp "${HF_TOKENS:-bench/results/h200-684065b-rms-order-mixed-split/call2/hf_tokens.json}" "$OUT/"
timeout 140 python3 bench/bf16_agreement.py --model /tmp/smol --device cuda --hf-tokens "$OUT/hf_tokens.json" --json "$OUT/agreement.json" 2>&1 | grep -v Loading | tee "$OUT/agreement.txt"

# Call 1: W1 bf16 at this tree (0 and 8 adapters, kernel totals), then 8 adapters with the
# LoRA shrink overlapped on the side stream up to 256-token steps (W1's decode steps).
set -u
export OUT
bash bench/h200_run.sh env 2>&1 | tail -4
W1=(bench/offline_throughput.py --shape llama3-8b --device cuda --skip-hf --num-prompts 512
    --min-prompt 512 --max-prompt 512 --output-len 128 --repeats 2 --skip-breakdown)
echo "=== lora overlap micro $(date +%T)"
timeout -s INT 90 python3 .gpu/lora_overlap.py 2>&1 | tee $OUT/lora_overlap.txt
echo "=== base $(date +%T)"
timeout -s INT 230 python3 "${W1[@]}" --adapters 0,8 --kernel-totals $OUT/k_base.txt \
  --json $OUT/w1_base.json 2>&1 | grep -v Loading | tee $OUT/w1_base.txt
echo "=== overlap256 $(date +%T)"
timeout -s INT ${T2:-150} python3 - "${W1[@]}" --adapters 8 \
  --json $OUT/w1_overlap.json <<'PY' 2>&1 | grep -v Loading | tee $OUT/w1_overlap.txt
import runpy, sys
import loraplex.engine.lora.lora_batch as lora_batch
lora_batch.OVERLAP_MAX_TOKENS = 256
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
PY
echo "=== overlap-all $(date +%T)"
timeout -s INT ${T3:-110} python3 - "${W1[@]}" --adapters 8 --repeats 1 \
  --json $OUT/w1_overlap_all.json <<'PY' 2>&1 | grep -v Loading | tee $OUT/w1_overlap_all.txt
import runpy, sys
import loraplex.engine.lora.lora_batch as lora_batch
lora_batch.OVERLAP_MAX_TOKENS = 1 << 30
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
PY
echo "=== done $(date +%T)"

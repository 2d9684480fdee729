set -u
export OUT
bash bench/h200_run.sh env 2>&1 | tail -1
W1=(bench/offline_throughput.py --shape llama3-8b --device cuda --skip-hf --num-prompts 512
    --min-prompt 512 --max-prompt 512 --output-len 128 --repeats 2 --skip-breakdown)
for limit in 256 1073741824; do
echo "=== overlap $limit $(date +%T)"
timeout -s INT 200 python3 - "${W1[@]}" --adapters 0,8 --json $OUT/w1_overlap_$limit.json <<PY 2>&1 | grep -v Loading | tee $OUT/w1_overlap_$limit.txt
import runpy, sys
sys.path.insert(0, "bench")
import loraplex.engine.lora.lora_batch as lora_batch
lora_batch.OVERLAP_MAX_TOKENS = $limit
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
PY
done
echo "=== done $(date +%T)"

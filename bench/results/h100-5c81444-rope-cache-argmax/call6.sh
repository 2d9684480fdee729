export OUT
bash bench/h200_run.sh env 2>&1 | tail -1
[ -d /tmp/old/loraplex ] || PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --no-deps --no-index --target /tmp/old .gpu/old/loraplex-*.whl
W="--shape llama3-8b --device cuda --skip-hf --num-prompts 512 --min-prompt 512 --max-prompt 512 --output-len 128 --skip-breakdown --adapters 0,8"
for w in new old; do
  pp=""; [ $w = old ] && pp=/tmp/old
  PYTHONPATH=$pp timeout 250 python3 bench/offline_throughput.py $W --json $OUT/w1_$w.json 2>&1 | grep -v Loading > $OUT/w1_$w.txt
  echo "== $w"; grep -E "tok/s|start-up" $OUT/w1_$w.txt | head -8
done

# One lease (about 9 minutes): the W4A16 K loop with TMA loads and warp specialization in the
# engine, against the planar kernel without them and against main's shipped kernel, on the
# decode-heavy run (64 x 128/512, no adapters) beside bf16; the kernel tests on the GPU; then
# bench/w4a16_sweep.py --tma at 64 rows: pointer, TMA and warp-specialized TMA loops at the same
# tiles.
#
# Set-up on the CPU machine (main at or after 6a067a4), in order:
#   mkdir -p .gpu/old .gpu/planar && make wheel && mv .whl/loraplex-*.whl .gpu/old/
#   git apply bench/results/cpu-041cd2b-w4a16-planar/w4a16-planar.patch && make wheel \
#     && mv .whl/loraplex-*.whl .gpu/planar/
#   git apply bench/results/cpu-6a067a4-w4a16-tma-ws/w4a16-tma-ws.patch && make wheel
#   make server-wheels
# then carry [".whl", ".gpu"] and run `bash bench/results/cpu-6a067a4-w4a16-tma-ws/call.sh`.
set -u
OUT=${OUT:-bench/results/tmp}; mkdir -p "$OUT"
bash bench/h200_run.sh env 2>&1 | grep "differs\|NVIDIA"  # installs this tree's wheel
for w in old planar; do
  python3 -m pip install -q --no-deps --no-index --target /tmp/$w .gpu/$w/loraplex-*.whl
done
timeout 100 python3 -m pytest -q -p no:cacheprovider -rfE tests/kernels/test_w4a16_kernels.py \
  tests/kernels/test_w4a16_tma.py 2>&1 | tail -6 | tee "$OUT/tests.txt"
decode() {  # quantization, name, PYTHONPATH (a wheel unpacked under /tmp, or none)
  PYTHONPATH=$3 timeout 100 python3 bench/offline_throughput.py --shape llama3-8b --device cuda \
    --quantization "$1" --skip-hf --num-prompts 64 --min-prompt 128 --max-prompt 128 \
    --output-len 512 --adapters 0 --json "/tmp/decode_$2.json" 2>&1 | grep -v Loading \
    > "$OUT/decode_$2.txt"
  echo "$2: $(grep -h 'tok/s\|decode-only' "$OUT/decode_$2.txt" | tr -s ' ' | tr '\n' ' ')"
}
decode none bf16 ""
decode awq tma_ws ""
decode awq planar /tmp/planar
decode awq shipped /tmp/old
timeout 170 python3 bench/w4a16_sweep.py --row-counts 64 --tma --json "$OUT/w4a16_tma_sweep.json" \
  2>&1 | grep -v Warn > "$OUT/w4a16_tma_sweep.txt"
tail -8 "$OUT/w4a16_tma_sweep.txt"
rm -f "$OUT/gpu_monitor.csv"

# LoRA kernels as programmatic dependent launches, against main, in one lease (about 8 minutes).
# Before the lease, on the CPU machine (the patches apply to main at cbe5ed1 too):
#   mkdir -p .gpu/old && make wheel && mv .whl/loraplex-*.whl .gpu/old/     # main's wheel, side A
#   git apply bench/results/cpu-a52554e-lora-pdl/lora-pdl-prologue.patch && make wheel   # side B
#   make server-wheels                                     # the engine tests need the platform
# then carry [".whl", ".gpu"] and run `bash bench/results/cpu-a52554e-lora-pdl/call.sh`.
set -u
OUT=${OUT:-bench/results/tmp}
TESTS="tests/kernels/test_gpu_lora_kernels.py tests/kernels/test_cuda_graph_replay.py tests/engine/test_engine_cuda.py" \
  TESTS_TIMEOUT=240 bash bench/h200_run.sh env gpu-tests
python3 -m pip install -q --no-deps --no-index --target /tmp/old .gpu/old/loraplex-*.whl
for side in old new; do  # LoRA per layer in CUDA graphs of 32 layers: 'step' is the cost
  PYTHONPATH=$([ $side = old ] && echo /tmp/old) timeout 100 python3 bench/kernels_bench.py \
    > "$OUT/kernels_$side.txt" 2>&1
  grep -A10 "^LoRA per layer" "$OUT/kernels_$side.txt"
done
OLD_WHEEL=$(ls .gpu/old/loraplex-*.whl) AB_MICRO=0 REPEATS=2 bash bench/h200_run.sh ab

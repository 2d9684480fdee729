#!/usr/bin/env bash
# One lease, one script: the GPU tests first, then timing. On the device machine, from the repo
# root: `bash bench/h200_run.sh [steps...]` (default: env gpu-tests kernels tput; also attention,
# lora, tiles, ab, many, serve, quant, w4a16, tp, prio, agreement, rounding); results go to $OUT
# (or bench/results/tmp).
#
# The device has torch, triton, transformers and peft, but not this package and no package
# index: build the wheel here first (`make wheel`, into the git-ignored .whl/), carry .whl/ along,
# and this script installs it before any step. Tests then import `tests.*` from the repo root
# (`python3 -m pytest` puts it on sys.path) and `loraplex.*` from the installed wheel.
set -u -o pipefail
OUT=${OUT:-bench/results/tmp}; mkdir -p "$OUT"
# Nothing outside the machine can be reached: never let HF libraries try.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

wheels=(.whl/loraplex-*.whl)
if [ ! -f "${wheels[0]}" ]; then
  echo "no .whl/loraplex-*.whl: run 'make wheel' and carry .whl/ to this machine" >&2; exit 2
fi
# The image's Python may be marked externally managed (PEP 668), or older than the package's
# stated floor: this machine is discarded after the run, and the tests decide what works.
PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --no-deps --no-index --force-reinstall \
  --ignore-requires-python "${wheels[0]}" || exit 2
# A wheel built from another tree would test other code: its modules must be this checkout's.
python3 - <<'EOF' || exit 2
import pathlib, sys
import loraplex.kernels
installed = pathlib.Path(loraplex.kernels.__file__).parent.parent
def sources(root):
    return {p.relative_to(root): p.read_bytes() for top in ("engine", "kernels")
            for p in (root / top).rglob("*.py")}
if sources(installed) != sources(pathlib.Path(".")):
    sys.exit(f"{installed} differs from this checkout's engine/ and kernels/: rebuild the wheel")
EOF

# The server's dependencies from `make server-wheels`, carried in .whl/deps: the `serve` step
# needs them, and so do the tests (tests/conftest.py builds checkpoints with the platform's code).
if [ -d .whl/deps ]; then
  PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --no-index --find-links .whl/deps \
    fastapi 'uvicorn[standard]' sqlalchemy alembic pydantic-settings 'pyjwt[crypto]' \
    prometheus-client python-multipart openai redis 'psycopg[binary]' py-spy || exit 2
fi

# Each second, whether a kernel ran (utilization.gpu: the share of the last sample period with
# one running), the SM clock and the power: a slow round then shows whether the GPU idled or
# throttled.
nvidia-smi --query-gpu=timestamp,utilization.gpu,clocks.sm,power.draw --format=csv -l 1 \
  > "$OUT/gpu_monitor.csv" 2>/dev/null &
monitor=$!
trap 'kill $monitor 2>/dev/null' EXIT

# Per-step limits keep `env gpu-tests kernels tput` under 10 minutes. SIGINT first: pytest then
# still prints its summary of what ran.
limit() { timeout -s INT -k 15 "$@"; }
steps=${*:-"env gpu-tests kernels tput"}
failed=0
for step in $steps; do
  echo "=== $step ($(date +%T))"
  case $step in
    env) nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
         python3 -c "import torch, triton, transformers, peft; print(torch.__version__, triton.__version__, transformers.__version__, peft.__version__)"
         python3 -m pip show loraplex | sed -n 1,2p;;
    gpu-tests) limit ${TESTS_TIMEOUT:-300} python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --durations=15 \
                 ${TESTS:-tests/kernels tests/engine} 2>&1 | grep -v Loading | tee "$OUT/gpu_tests.txt";;
    attention) limit ${ATTENTION_TIMEOUT:-400} python3 bench/attention_bench.py --json "$OUT/attention.json" ${ATTENTION_ARGS:-} \
                 2>&1 | tee "$OUT/attention.txt";;
    kernels) limit 100 python3 bench/kernels_bench.py ${KERNELS_ARGS:-} 2>&1 | tee "$OUT/kernels.txt";;
    tput) limit ${TPUT_TIMEOUT:-160} python3 bench/offline_throughput.py --shape llama3-8b --device cuda \
            --num-prompts 64 --min-prompt 512 --max-prompt 512 --output-len 128 \
            --hf-batch-size 32 --adapters "${ADAPTERS:-0,1,8}" --repeats "${REPEATS:-3}" --json "$OUT/throughput.json" ${TPUT_ARGS:-} 2>&1 \
            | grep -v Loading | tee "$OUT/throughput.txt";;
    lora) # where W1's LoRA time goes: the fused gate_up activation's tiles against the unfused
          # pair, then W1 (512 x 512/128) with 0 and 8 adapters and each run's GPU time per kernel
          limit 200 python3 bench/silu_lora_tiles.py --json "$OUT/silu_lora_tiles.json" 2>&1 \
            | tee "$OUT/silu_lora_tiles.txt" &&
          limit ${LORA_W1_TIMEOUT:-300} python3 bench/offline_throughput.py --shape llama3-8b --device cuda \
            --skip-hf --adapters 0,8 --repeats "${REPEATS:-2}" --num-prompts 512 --min-prompt 512 \
            --max-prompt 512 --output-len 128 --kernel-totals "$OUT/kernel_totals.txt" \
            --json "$OUT/w1.json" 2>&1 | grep -v Loading | tee "$OUT/w1.txt";;
    tiles) # candidate LoRA tiles on W1's prefill step and on its decode step (8 adapters)
           limit ${TILES_TIMEOUT:-240} python3 bench/lora_step_tiles.py \
             --json "$OUT/step_tiles_prefill.json" 2>&1 | tee "$OUT/step_tiles_prefill.txt" &&
           limit ${TILES_TIMEOUT:-240} python3 bench/lora_step_tiles.py --tokens 256 --run 1 \
             --json "$OUT/step_tiles_decode.json" 2>&1 | tee "$OUT/step_tiles_decode.txt";;
    many) limit ${MANY_TIMEOUT:-540} python3 bench/many_adapters.py --shape llama3-8b \
            --adapters "${MANY_ADAPTERS:-0,8,64,256,1024}" --rounds "${ROUNDS:-3}" \
            --json "$OUT/many_adapters.json" ${MANY_ARGS:-} 2>&1 | grep -v Loading \
            | tee "$OUT/many_adapters.txt";;
    serve) [ -d .whl/deps ] || { echo "no .whl/deps: run 'make server-wheels'" >&2; false; } &&
           limit ${SERVE_TIMEOUT:-540} python3 bench/serve_bench.py --shape llama3-8b \
             --json "$OUT/serve.json" ${SERVE_ARGS:-} 2>&1 | grep -v Loading | tee "$OUT/serve.txt";;
    quant) # bf16 vs FP8 vs AWQ-4bit (random weights at the Llama-3-8B shape, 0 and 8 adapters):
           # W1 (512 x 512/128) and decode-heavy (64 x 128/512); each run reports weights bytes.
           # The six runs do not fit one 10-minute command: choose with QUANTS (none fp8 awq) and
           # QUANT_RUNS (w1 decode), adapter counts with QUANT_ADAPTERS. QUANT_KERNEL_TOTALS=1:
           # each W1 run's GPU time per kernel too (LoRA kernels against the rest).
           qfail=0
           for q in ${QUANTS:-none fp8 awq}; do
             totals=(); [ "${QUANT_KERNEL_TOTALS:-0}" = 1 ] && totals=(--kernel-totals "$OUT/kernel_totals_w1_$q.txt")
             [[ " ${QUANT_RUNS:-w1 decode} " == *" w1 "* ]] && { limit ${QUANT_TIMEOUT:-180} python3 bench/offline_throughput.py --shape llama3-8b \
               --device cuda --quantization "$q" --skip-hf --num-prompts 512 --min-prompt 512 \
               --max-prompt 512 --output-len 128 --adapters "${QUANT_ADAPTERS:-0,8}" --skip-breakdown \
               "${totals[@]}" --json "$OUT/quant_w1_$q.json" ${QUANT_ARGS:-} 2>&1 | grep -v Loading \
               | tee "$OUT/quant_w1_$q.txt" || qfail=1; }
             [[ " ${QUANT_RUNS:-w1 decode} " == *" decode "* ]] && { limit ${QUANT_TIMEOUT:-180} python3 bench/offline_throughput.py --shape llama3-8b \
               --device cuda --quantization "$q" --skip-hf --num-prompts 64 --min-prompt 128 \
               --max-prompt 128 --output-len 512 --adapters "${QUANT_ADAPTERS:-0,8}" \
               --json "$OUT/quant_decode_$q.json" ${QUANT_ARGS:-} 2>&1 | grep -v Loading \
               | tee "$OUT/quant_decode_$q.txt" || qfail=1; }
           done
           [ $qfail -eq 0 ];;
    w4a16) # the W4A16 GEMM and dequantization against the reference (bf16 here), then the tile sweep
           limit 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_w4a16_kernels.py \
             2>&1 | tail -5 | tee "$OUT/w4a16_tests.txt" &&
           limit ${W4A16_TIMEOUT:-300} python3 bench/w4a16_sweep.py --json "$OUT/w4a16_sweep.json" ${W4A16_ARGS:-} \
             2>&1 | tee "$OUT/w4a16_sweep.txt";;
    tp) # tensor parallelism (needs nvidia-h200-x2; not run yet): the Llama-3-8B shape at TP=1
        # and TP=2, decode steps at batch 1 and 64 (decode_step_ms) and W1 with 0 and 8
        # adapters; the Llama-3-70B shape at TP=2 with 0 and 8 adapters.
        tfail=0
        for tp in ${TPS:-1 2}; do
          for batch in 1 64; do
            limit ${TP_TIMEOUT:-180} python3 bench/offline_throughput.py --shape llama3-8b \
              --device cuda --skip-hf --tensor-parallel-size "$tp" --num-prompts "$batch" \
              --min-prompt 128 --max-prompt 128 --output-len 256 \
              --json "$OUT/tp${tp}_decode_b$batch.json" 2>&1 | grep -v Loading \
              | tee "$OUT/tp${tp}_decode_b$batch.txt" || tfail=1
          done
          limit ${TP_TIMEOUT:-180} python3 bench/offline_throughput.py --shape llama3-8b \
            --device cuda --skip-hf --tensor-parallel-size "$tp" --num-prompts 512 \
            --min-prompt 512 --max-prompt 512 --output-len 128 --adapters 0,8 \
            --json "$OUT/tp${tp}_w1.json" 2>&1 | grep -v Loading | tee "$OUT/tp${tp}_w1.txt" || tfail=1
        done
        limit ${TP_TIMEOUT:-300} python3 bench/offline_throughput.py --shape llama3-70b \
          --device cuda --skip-hf --tensor-parallel-size 2 --num-prompts 64 --min-prompt 512 \
          --max-prompt 512 --output-len 128 --adapters 0,8 --gpu-memory-utilization 0.9 \
          --json "$OUT/tp2_70b.json" 2>&1 | grep -v Loading | tee "$OUT/tp2_70b.txt" || tfail=1
        [ $tfail -eq 0 ];;
    prio) limit 240 python3 bench/priority_latency.py --shape llama3-8b --device cuda \
            --flood 256 --flood-prompt 512 --flood-output 128 --trickle 16 --interval 0.25 \
            --max-num-seqs 64 --json "$OUT/priority.json" 2>&1 | grep -v Loading \
            | tee "$OUT/priority.txt";;
    agreement) # issue 12's numerics bar on the demo checkpoint (SMOL_GGUF: the packaged GGUF,
               # brought here in pieces), then where the engine rounds differently from HF: the
               # same prompts with one kernel family at a time on the PyTorch reference (without
               # CUDA graphs, which the references cannot be captured in), and with 1 and 16
               # sequences per step (HF's runs computed once, in $OUT/hf_tokens.json)
               [ -f "${SMOL_GGUF:-}" ] || { echo "set SMOL_GGUF to the demo GGUF" >&2; false; } &&
               python3 -c "import pathlib, sys; from loraplex.platform.demo import checkpoint as c
c.find_smollm2_gguf = lambda: pathlib.Path(sys.argv[1]); c.write_smollm2_checkpoint('/tmp/smol')" \
                 "$SMOL_GGUF" && {
               agree() { limit ${AGREE_TIMEOUT:-240} python3 bench/bf16_agreement.py --model /tmp/smol \
                 --device cuda --hf-tokens "$OUT/hf_tokens.json" "$@" 2>&1 | grep -v Loading; }
               agree --json "$OUT/agreement_auto.json" | tee "$OUT/agreement.txt"
               for ops in ${AGREE_OPS-reference paged_attention rms_norm,fused_add_rms_norm silu_and_mul,silu_and_mul_lora rotary_and_cache}; do
                 kernels=reference:$ops; [ "$ops" = reference ] && kernels=reference
                 echo "--- LORAPLEX_KERNELS=$kernels" | tee -a "$OUT/agreement.txt"
                 LORAPLEX_KERNELS=$kernels agree --enforce-eager --json "$OUT/agreement_${ops//,/_}.json" | tee -a "$OUT/agreement.txt"
               done
               for seqs in ${AGREE_SEQS-1 16}; do
                 echo "--- max_num_seqs $seqs" | tee -a "$OUT/agreement.txt"
                 agree --max-num-seqs $seqs --json "$OUT/agreement_seqs$seqs.json" | tee -a "$OUT/agreement.txt"
               done
               # op by op, where the engine's forward first rounds unlike HF's (prompts alone)
               limit 240 python3 bench/layer_divergence.py --model /tmp/smol --device cuda \
                 --prompts ${DIVERGENCE_PROMPTS:-0,1,2,3,4,5,6,7} --json "$OUT/layer_divergence.json" 2>&1 \
                 | grep -v Loading | tee "$OUT/layer_divergence.txt"; };;
    ab) # this tree's LoRA kernels against OLD_WHEEL's (a wheel of another commit, carried too),
        # in one lease: the tables' rows on W1's prefill and decode steps and the fused activation
        # (AB_MICRO=0 skips them), then W1 with 8 adapters (and no adapters, new wheel) and each
        # run's GPU time per kernel; AB_QUANT=fp8 runs W1 on an FP8 base
        [ -f "${OLD_WHEEL:-}" ] || { echo "set OLD_WHEEL to the other commit's wheel" >&2; false; } && {
        q=${AB_QUANT:-none}
        micro() {
          for t in "4096 --run 512" "256 --run 1"; do
            limit 100 python3 bench/lora_step_tiles.py --table-only --tokens $t 2>&1 \
              | tee -a "$OUT/ab_micro_$1.txt"
          done
          limit 100 python3 bench/silu_lora_tiles.py --table-only 2>&1 | tee -a "$OUT/ab_micro_$1.txt"
        }
        w1() {  # name adapters
          limit ${AB_W1_TIMEOUT:-200} python3 bench/offline_throughput.py --shape llama3-8b \
            --device cuda --skip-hf --num-prompts 512 --min-prompt 512 --max-prompt 512 \
            --output-len 128 --adapters "$2" --repeats "${REPEATS:-2}" --skip-breakdown \
            --quantization "$q" --kernel-totals "$OUT/ab_kernels_$1_$q.txt" \
            --json "$OUT/ab_w1_$1_$q.json" 2>&1 | grep -v Loading | tee "$OUT/ab_w1_$1_$q.txt"
        }
        [ "${AB_MICRO:-1}" = 0 ] || micro new
        PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --no-deps --force-reinstall \
          --ignore-requires-python "$OLD_WHEEL" && { [ "${AB_MICRO:-1}" = 0 ] || micro old; w1 old 8; }
        PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --no-deps --force-reinstall \
          --ignore-requires-python "${wheels[0]}" && w1 new 0,8; };;
    rounding) # each kernel's rounding against HF's math and cuBLAS's at the engine's GEMM shapes,
              # then SDPA's backend and the decode KV tile that rounds as it does
              limit 120 python3 bench/kernel_rounding.py --json "$OUT/kernel_rounding.json" 2>&1 \
                | tee "$OUT/kernel_rounding.txt" &&
              limit 120 python3 bench/sdpa_tiles.py ${SDPA_ARGS:-} 2>&1 | tee "$OUT/sdpa_tiles.txt";;
    *) echo "unknown step $step (env gpu-tests attention kernels tput lora tiles ab many serve quant w4a16 tp prio agreement rounding)" >&2; false;;
  esac
  rc=$?
  echo "=== $step: exit $rc"
  [ $rc -eq 0 ] || failed=1
done
exit $failed

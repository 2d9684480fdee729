#!/usr/bin/env bash
# W1 (512 x 512/128) bf16 and FP8, 0 and 8 adapters, medians of 2 rounds; engine start-up time in the log.
QUANTS="none fp8" QUANT_RUNS=w1 QUANT_ARGS="--repeats 2" QUANT_KERNEL_TOTALS=0 QUANT_TIMEOUT=280 \
  bash bench/h200_run.sh quant 2>&1 | grep -v "^\s*$" | tail -70

"""Scratch (not committed): bench/offline_throughput.py with LoRABatch's side-stream threshold set."""

import runpy
import sys

from loraplex.engine.lora import lora_batch

lora_batch.OVERLAP_MAX_TOKENS = int(sys.argv[1])
print(f"OVERLAP_MAX_TOKENS = {lora_batch.OVERLAP_MAX_TOKENS}", flush=True)
sys.argv = ["bench/offline_throughput.py", *sys.argv[2:]]
sys.path.insert(0, "bench")
runpy.run_path("bench/offline_throughput.py", run_name="__main__")

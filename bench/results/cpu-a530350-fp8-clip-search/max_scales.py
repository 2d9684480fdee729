"""bench/quant_accuracy.py with FP8's online weight scales as they were before the clip-ratio
search (scale = max |w| / 448 per row), for a comparison on the same texts:

    python bench/results/cpu-a530350-fp8-clip-search/max_scales.py --dtype bfloat16 --json OUT
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import torch

from loraplex.engine.model.quant import fp8
from loraplex.kernels.reference.fp8 import FP8_DTYPE, FP8_MAX, MIN_SCALE


def max_scales(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    w = w.float()
    scale = (w.abs().amax(dim=1) / FP8_MAX).clamp(min=MIN_SCALE)
    return (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


fp8.quantize_fp8_per_channel = max_scales
bench = Path(__file__).resolve().parents[2] / "quant_accuracy.py"
sys.argv = [str(bench), *sys.argv[1:]]
runpy.run_path(str(bench), run_name="__main__")

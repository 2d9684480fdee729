"""The dtypes the Triton kernel tests run in: bf16 only on CUDA (the CPU interpreter has no
bfloat16 tl.dot)."""

from __future__ import annotations

import pytest
import torch

BF16 = pytest.param(
    torch.bfloat16,
    id="bf16",
    marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="Triton's CPU interpreter has no bfloat16 tl.dot"
    ),
)
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.float16, id="fp16"), BF16]

"""The sm_90 PTX of the RoPE kernel, compiled on CPU, and a count of its float instructions.

    python rotary_ptx.py OUT.ptx [nofuse]

`nofuse` compiles with enable_fp_fusion=False (exact-rotary.patch's launch option).
"""

from __future__ import annotations

import importlib
import re
import sys
from collections import Counter
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

rotary = importlib.import_module("loraplex.kernels.triton.rotary")
pointers = ["q_ptr", "k_ptr", "cos_ptr", "sin_ptr", "q_out_ptr", "k_out_ptr"]
strides = ["stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_cos", "stride_sin"]
constexprs = dict(
    NUM_HEADS=9, NUM_KV_HEADS=3, HALF_DIM=32, HEADS_PAD=16, KV_HEADS_PAD=4, HALF_PAD=32
)
signature = {**dict.fromkeys(pointers, "*bf16"), **dict.fromkeys(strides, "i32")}
signature.update(dict.fromkeys(constexprs, "constexpr"))
source = ASTSource(fn=rotary._rotary_kernel, signature=signature, constexprs=constexprs)
options = {"enable_fp_fusion": "nofuse" not in sys.argv[2:]}
ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
float_ops = re.findall(r"\b(?:add|sub|mul|fma|neg)\.(?:rn\.)?(?:bf16|f32)\b", ptx)
print(Counter(float_ops))
Path(sys.argv[1]).write_text(ptx)

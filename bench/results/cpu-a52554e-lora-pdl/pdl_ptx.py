"""Compile the patched LoRA kernels for sm_90 on this CPU and count `griddepcontrol.wait` in
their PTX (a check that the Triton code compiles for Hopper with the waits in place).

    pip install --no-deps --target /tmp/vp <a wheel of main + one of the patches>
    PYTHONPATH=/tmp/vp python3 pdl_ptx.py
"""

from __future__ import annotations

import importlib
import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


def count_waits(module: str, name: str, args: str, constexprs: dict, types: dict) -> None:
    kernel = getattr(importlib.import_module(module), name)
    names = args.split()
    signature = {n: types.get(n, "*i32" if n.endswith("_ptr") else "i32") for n in names}
    signature.update(dict.fromkeys(constexprs, "constexpr"))
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"launch_pdl": True})
    waits = len(re.findall(r"griddepcontrol\.wait", ptx.asm["ptx"]))
    print(f"{name} USE_PDL={constexprs['USE_PDL']}: griddepcontrol.wait x {waits}")


TABLES = "page_table_ptr first_page_ptr lora_ranks_ptr"
MAPPING = "slot_adapters_ptr num_active_slots_ptr sorted_token_ids_ptr slot_start_loc_ptr"
BF16 = {n: "*bf16" for n in ("x_ptr", "pages_ptr", "y_ptr")}
FP32 = {"out_ptr": "*fp32", "lora_out_ptr": "*fp32", "scalings_ptr": "*fp32"}
for pdl in (True, False):
    count_waits(
        "loraplex.kernels.triton.lora_shrink",
        "_lora_shrink_kernel",
        f"x_ptr pages_ptr {TABLES} {MAPPING} out_ptr in_dim page_size num_rank_tiles "
        "stride_xm stride_pp stride_pt stride_fs stride_rs stride_os stride_om",
        dict(
            BLOCK_M=16,
            BLOCK_N=16,
            BLOCK_K=128,
            K_CHUNK=256,
            SLOTS=16,
            SPLIT_ROWS=False,
            USE_ATOMIC=True,
            DOT_PRECISION="tf32",
            USE_PDL=pdl,
        ),  # fmt: skip
        {**BF16, **FP32},
    )
count_waits(
    "loraplex.kernels.triton.lora_expand",
    "_lora_expand_kernel",
    f"lora_out_ptr pages_ptr {TABLES} scalings_ptr {MAPPING} y_ptr page_size slice_end_0 "
    "slice_end_1 slice_end_2 y_offset stride_ls stride_lm stride_pp stride_pt stride_fs "
    "stride_rs stride_ym",
    dict(
        BLOCK_M=16,
        BLOCK_N=128,
        BLOCK_K=16,
        SLOTS=16,
        SPLIT_ROWS=False,
        COLUMN_RUNS=True,
        TARGET_PROGRAMS=1024,
        ONE_STEP=True,
        DOT_PRECISION="tf32",
        USE_PDL=True,
    ),  # fmt: skip
    {**BF16, **FP32},
)
count_waits(
    "loraplex.kernels.triton.silu_and_mul_lora",
    "_silu_and_mul_lora_kernel",
    f"x_ptr lora_out_ptr pages_ptr {TABLES} scalings_ptr {MAPPING} out_ptr num_tokens "
    "intermediate page_size num_segment_grid stride_x stride_ls stride_lm stride_pp stride_pt "
    "stride_fs stride_rs stride_out",
    dict(
        BLOCK_M=16,
        BLOCK_N=128,
        BLOCK_K=16,
        SLOTS=16,
        SPLIT_ROWS=True,
        COLUMN_RUNS=True,
        TARGET_PROGRAMS=1024,
        ONE_STEP=False,
        DOT_PRECISION="tf32",
        USE_PDL=True,
    ),  # fmt: skip
    {**BF16, "lora_out_ptr": "*fp32", "scalings_ptr": "*fp32", "out_ptr": "*bf16"},
)

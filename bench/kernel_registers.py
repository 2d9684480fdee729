"""Registers, spills and shared memory of the LoRA kernels' tile rows, compiled for Hopper on any
machine (Triton's bundled ptxas; no GPU needed).

A kernel that reads memory hides latency with the programs resident on an SM, and registers are
what bounds them: an SM has 65,536, so a 4-warp program of 138 registers leaves room for 3 of
them and one of 180 for 2. A change to a kernel's structure (a loop, a vector kept alive) can
move its registers a long way without changing its math; this shows it before a GPU lease.
Each row: the kernel, the table row's tiles, registers per thread, stack bytes (spills land
there), shared memory, and programs per SM as registers allow (ignoring shared memory).

The kernels are compiled as the engine launches them for Llama-3-8B with bf16 pages and
rank-16 adapters: a step of 8 adapters, whose mapping tables hold 8 slots (`slot_table_size`;
`--slots 256` for the tables of a step of 129-256 adapters, max_num_seqs 256; a row's slot vectors
are as wide as at its largest step, `segment_grid`'s SLOTS), rows of B^T that fit a page, so
ONE_STEP wherever the rank fits BLOCK_K. Triton here may differ from the GPU
machine's (its version is printed); compare two trees under the same one.

    python3 bench/kernel_registers.py [--slots 256]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from loraplex.engine.lora.step_mapping import slot_table_size
from loraplex.kernels.triton.lora_expand import EXPAND_TILES, ExpandTiles, _lora_expand_kernel
from loraplex.kernels.triton.lora_segments import rank_block, segment_grid
from loraplex.kernels.triton.lora_shrink import SHRINK_TILES, ShrinkTiles, _lora_shrink_kernel
from loraplex.kernels.triton.silu_and_mul_lora import (
    SILU_LORA_TILES,
    _silu_and_mul_lora_kernel,
)

HOPPER = GPUTarget("cuda", 90, 32)
REGISTERS_PER_SM = 65536
NUM_SLOTS = slot_table_size(8, 256)  # 8 adapters; max_loras unset, so max_num_seqs 256
RANK = 16
PREFILL_TOKENS = 4096  # the last rows' size: W1's prefill step
IN_DIM = 4096  # hidden size: the shrink's in_dim for q/k/v, o and gate/up
# Each kernel's pointer arguments that are not int32 tables: name -> Triton type.
SHRINK_PTRS = {"x_ptr": "*bf16", "pages_ptr": "*bf16", "out_ptr": "*fp32"}
EXPAND_PTRS = {"pages_ptr": "*bf16", "y_ptr": "*bf16", "lora_out_ptr": "*fp32"}
SILU_LORA_PTRS = {
    "x_ptr": "*bf16",
    "pages_ptr": "*bf16",
    "out_ptr": "*bf16",
    "lora_out_ptr": "*fp32",
}
SCALINGS_PTR = {"scalings_ptr": "*fp32"}
# Integer arguments that are multiples of 16 at the Llama-3-8B shapes (widths, page sizes,
# strides), which Triton specializes at a launch: the kernels are compiled knowing it.
DIVISIBLE_INTS = (
    "in_dim",
    "intermediate",
    "page_size",
    "slice_end_0",
    "slice_end_1",
    "slice_end_2",
    "stride_xm",
    "stride_x",
    "stride_ym",
    "stride_out",
    "stride_ls",
    "stride_lm",
    "stride_os",
    "stride_om",
    "stride_pp",
)


def compile_for_hopper(
    fn: Any,
    float_ptrs: dict[str, str],
    constexprs: dict[str, object],
    warps: int,
    stages: int,
    divisible_ints: tuple[str, ...] = (),
) -> Any:
    """Triton's compiled kernel for sm_90; every other pointer is an int32 table, every other
    scalar an i32. As at a GPU launch, the pointers (torch's allocations) are known to be
    16-byte aligned, and so are the integers named in `divisible_ints` (Triton specializes an
    integer argument whose value is divisible by 16): without that, loads are not vectorized
    and the counts mislead."""
    names = fn.arg_names
    signature = {
        n: "constexpr"
        if n in constexprs
        else float_ptrs.get(n, "*i32" if n.endswith("_ptr") else "i32")
        for n in names
    }
    consts = {(names.index(n),): v for n, v in constexprs.items()}
    aligned = [
        i
        for i, n in enumerate(names)
        if n not in constexprs and (n.endswith("_ptr") or n in divisible_ints)
    ]
    attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}
    source = ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs)
    return triton.compile(source, target=HOPPER, options={"num_warps": warps, "num_stages": stages})


def resource_usage(compiled: Any) -> tuple[int, int]:
    """(registers per thread, stack bytes) from the cubin, by cuobjdump."""
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run(
            [os.path.join(tools, "cuobjdump"), "-res-usage", f.name],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    found = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    assert found, f"no resource usage in cuobjdump's output: {usage}"
    return int(found.group(1)), int(found.group(2))


def report(what: str, compiled: Any, warps: int) -> None:
    registers, stack = resource_usage(compiled)
    allocated = -(-registers // 8) * 8  # registers are allocated 8 a thread at a time
    per_sm = REGISTERS_PER_SM // (allocated * 32 * warps)
    shared = compiled.metadata.shared
    print(f"  {what:<60} {registers:4d} regs  stack {stack:3d} B  shared {shared:6d} B  "
          f"{per_sm} programs/SM")  # fmt: skip


def slots(bound: int, block_m: int, num_slots: int) -> int:
    """SLOTS of a launch of `bound` tokens."""
    return segment_grid(bound, num_slots, block_m)[1]


def shrink_row(bound: int, tiles: ShrinkTiles, num_slots: int) -> None:
    constexprs = dict(
        BLOCK_M=tiles.block_m,
        BLOCK_N=rank_block(RANK, tiles.max_block_n),
        BLOCK_K=tiles.block_k,
        K_CHUNK=min(tiles.k_chunk, IN_DIM),
        SLOTS=slots(bound, tiles.block_m, num_slots),
        SPLIT_ROWS=False,
        USE_ATOMIC=True,
        DOT_PRECISION="tf32",
    )
    compiled = compile_for_hopper(
        _lora_shrink_kernel,
        SHRINK_PTRS,
        constexprs,
        tiles.num_warps,
        tiles.num_stages,
        DIVISIBLE_INTS,
    )
    report(f"shrink <= {bound} tokens {tiles.block_m}x{tiles.block_k}", compiled, tiles.num_warps)


def expand_constexprs(bound: int, tiles: ExpandTiles, num_slots: int) -> dict[str, object]:
    return dict(
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=rank_block(RANK, tiles.max_block_k),
        SLOTS=slots(bound, tiles.block_m, num_slots),
        SPLIT_ROWS=False,
        COLUMN_RUNS=tiles.target_programs is not None,
        TARGET_PROGRAMS=tiles.target_programs or 1,
        ONE_STEP=True,
        DOT_PRECISION="tf32",
    )


def expand_row(
    fn: Any, float_ptrs: dict[str, str], label: str, bound: int, tiles: ExpandTiles, num_slots: int
) -> None:
    constexprs = expand_constexprs(bound, tiles, num_slots)
    ptrs = float_ptrs | SCALINGS_PTR
    compiled = compile_for_hopper(
        fn, ptrs, constexprs, tiles.num_warps, tiles.num_stages, DIVISIBLE_INTS
    )
    runs = "" if tiles.target_programs is None else f" runs/{tiles.target_programs}"
    what = f"{label} <= {bound} tokens {tiles.block_m}x{tiles.block_n}{runs}"
    report(what, compiled, tiles.num_warps)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slots", type=int, default=NUM_SLOTS, help="slots in the mapping tables")
    num_slots = ap.parse_args().slots
    print(f"Triton {triton.__version__}, sm_90, {num_slots} slots, rank {RANK}, bf16 pages")
    for bound, tiles in SHRINK_TILES.rows:
        shrink_row(min(bound, PREFILL_TOKENS), tiles, num_slots)
    for bound, tiles in EXPAND_TILES.rows:
        bound = min(bound, PREFILL_TOKENS)
        expand_row(_lora_expand_kernel, EXPAND_PTRS, "expand", bound, tiles, num_slots)
    for bound, tiles in SILU_LORA_TILES.rows:
        bound = min(bound, PREFILL_TOKENS)
        expand_row(_silu_and_mul_lora_kernel, SILU_LORA_PTRS, "silu_lora", bound, tiles, num_slots)
    return 0


if __name__ == "__main__":
    sys.exit(main())

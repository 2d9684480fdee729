"""Steps of different sizes launch one compiled variant of a kernel, not one per size class; the
warm-up's steps (triton/launch_classes.py) launch every variant a step can need.

Triton keys each compiled kernel on every int argument's class of value (1, a multiple of 16,
any other) and on every pointer's 16-byte alignment, unless the kernel says not to
(`do_not_specialize`, `do_not_specialize_on_alignment`). An argument that changes from step to
step would make a server compile a new variant, a pause of its step loop, whenever a new class
turns up mid-serving. These tests record real launches at several step sizes and compare the
keys Triton computes for them (its own specialization function, on the recorded arguments).
"""

from __future__ import annotations

from contextlib import ExitStack
from types import ModuleType

import pytest
import torch

from loraplex.kernels.triton.launch_classes import (
    decode_warmup_sizes,
    launch_class,
    warmup_shapes,
)
from loraplex.kernels.triton.lora_expand import _lora_expand_kernel
from loraplex.kernels.triton.lora_shrink import _lora_shrink_kernel
from loraplex.kernels.triton.paged_attention import _paged_attention_kernel, paged_attention
from loraplex.kernels.triton.silu_and_mul_lora import (
    SILU_LORA_TILES,
    _silu_and_mul_lora_kernel,
    launch_silu_and_mul_lora,
)
from tests.kernels.lora_inputs import lora_case, make_inputs, poisoned_lora_out
from tests.kernels.paged_inputs import make_paged_batch
from tests.kernels.specialization_keys import recorded_keys


def test_mixed_steps_of_any_size_share_one_attention_variant(
    triton_kernels: ModuleType, device: torch.device
) -> None:
    """Leading decodes, then chunks of 3 tokens: the chunks' launch reads views of the tables
    that start after the decodes, at 1, 2, 3 or 4 entries (aligned or not), for 1, 2 or 16
    chunks (a count of 1, of any other, a multiple of 16)."""
    with recorded_keys(_paged_attention_kernel) as keys:
        for num_decodes, num_chunks in [(1, 1), (2, 2), (3, 16), (4, 2)]:
            q_lens = [1] * num_decodes + [3] * num_chunks
            seq_lens = [5 + s % 4 for s in range(num_decodes)] + [7] * num_chunks
            batch = make_paged_batch(seq_lens, q_lens, 2, 1, 16, 4, torch.float32, device)
            paged_attention(*batch.args, 0.25, num_decode_seqs=num_decodes)
    assert len(keys) == 4 and len(set(keys)) == 1


def test_fused_activation_steps_of_any_size_share_one_variant(
    triton_kernels: ModuleType, device: torch.device
) -> None:
    """silu_and_mul_lora at 1, 16 and 17 tokens of one adapter (one tile row of the table)."""
    tiles = SILU_LORA_TILES.lookup(1)
    assert SILU_LORA_TILES.lookup(17) == tiles
    with recorded_keys(_silu_and_mul_lora_kernel) as keys:
        for num_tokens in [1, 16, 17]:
            case = lora_case([[8], [8]], [num_tokens], 0, 16, (24, 24), 256)
            inputs = make_inputs(case, torch.float32, device)
            x = torch.randn(num_tokens, 48, device=device)
            tables = (inputs.pages, inputs.page_table, inputs.first_b, inputs.lora_ranks)
            args = (x, poisoned_lora_out(inputs), *tables, inputs.scalings, *inputs.mapping)
            launch_silu_and_mul_lora(*args, tiles)
    assert len(keys) == 3 and len(set(keys)) == 1


SLOT_TABLES = [8, 16, 32, 64, 128, 256]


def test_warmup_shapes_cover_every_launch_class_once() -> None:
    """Every step of up to 3,000 tokens, without adapters or with any slot table, is in the
    launch class of one warm-up shape, the smallest step of that class."""
    shapes = warmup_shapes(3000, SLOT_TABLES)
    classes = [launch_class(*shape) for shape in shapes]
    assert len(set(classes)) == len(shapes)
    first: dict[tuple[object, ...], tuple[int, int | None]] = {}
    for table in [None, *SLOT_TABLES]:
        for num_tokens in range(1, 3001):
            first.setdefault(launch_class(num_tokens, table), (num_tokens, table))
    assert sorted(first.values(), key=str) == sorted(shapes, key=str)


def test_decode_warmup_sizes_reach_every_decode_row() -> None:
    sizes = decode_warmup_sizes(256, 8)
    assert sizes == [1, 5, 9, 17, 33]  # rows up to 32, 64, 128, 256 and past, x 8 KV heads


# (tokens, tokens, slot table): steps of one launch class (the first two: below the slot table,
# where SLOTS follows the tokens).
ONE_CLASS = [(3, 4, 8), (17, 30, 32), (65, 200, 8), (513, 700, 16)]


@pytest.mark.parametrize(("first", "second", "table"), ONE_CLASS)
def test_steps_of_one_launch_class_launch_the_same_lora_variants(
    triton_kernels: ModuleType, device: torch.device, first: int, second: int, table: int
) -> None:
    """The shrink, the expand and the fused SiLU at both sizes, one adapter among `table`
    slots: the same specialization keys (the warm-up's step compiles what the other needs)."""
    assert launch_class(first, table) == launch_class(second, table)
    keys = []
    for num_tokens in (first, second):
        case = lora_case([[8] * table] * 2, [num_tokens] + [0] * (table - 1), 0, 16, (24, 24), 256)
        inputs = make_inputs(case, torch.float32, device)
        kernels = (_lora_shrink_kernel, _lora_expand_kernel, _silu_and_mul_lora_kernel)
        with ExitStack() as stack:
            recorded = [stack.enter_context(recorded_keys(kernel)) for kernel in kernels]
            lora_out = torch.zeros(inputs.shape, device=device)
            triton_kernels.lora_shrink(inputs.x, *inputs.shrink_tables, lora_out)
            y = torch.zeros(num_tokens, 48, device=device)
            triton_kernels.lora_expand(lora_out, *inputs.expand_tables, y, 0, (24, 24))
            triton_kernels.silu_and_mul_lora(y, lora_out, *inputs.expand_tables)
        keys.append(recorded)
    assert all(len(k) == 1 for k in keys[0]) and keys[0] == keys[1]

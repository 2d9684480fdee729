"""Random inputs of the multi-LoRA kernels over paged adapter weights, poisoned where a kernel
must not look, and oracles.

Adapters live in pages (S-LoRA), placed as engine/lora/page_layout.py places them and as
kernels/reference/lora.py reads them: each slice's A_i, then its B_i^T, in runs of the adapter's
own pages, rows packed `page_size // row_len` to a page or, longer than a page, taking
`cdiv(row_len, page_size)` pages each. Page ids are shuffled over the pool. Poison:

- the pool starts NaN and only the rows of the adapters' matrices are written: the tail of a
  page, rows past a slice's rank, pages of no adapter (also every page-table entry past an
  adapter's pages) stay NaN;
- batch slot s maps to adapter row `slot_adapters[s]`, not to row s, and the tables have rows
  no slot uses (non-zero ranks, NaN scaling, pages that are all NaN): a kernel that indexes the
  tables by slot reads poison;
- an adapter whose ranks are all 0 has a NaN scaling;
- `poisoned_lora_out` gives the expand an input that is NaN wherever it must not read (past
  each token's rank, rows of tokens without an adapter).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch

from loraplex.engine.lora.page_layout import matrix_pages, pages_per_row, rows_per_page
from loraplex.kernels.lora_mapping import build_lora_mapping

SENTINEL = 1234.0  # exactly representable in fp16/bf16: a shrink output that must be zeroed
NAN = float("nan")
IN_DIM = 200
NUM_UNUSED_ADAPTERS = 2  # table rows no batch slot maps to
NUM_POISON_PAGES = 3  # pool pages no adapter owns

# Absolute tolerance of Triton vs reference, per input dtype (values are O(1)).
ATOL = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 1e-1}


@dataclass(frozen=True)
class LoRACase:
    """A batch: ranks[slice][slot] of the adapter each batch slot maps to, tokens per slot,
    tokens without an adapter, the shrink output's width, the slices' out_dims, page_size."""

    ranks: tuple[tuple[int, ...], ...]
    tokens_per_slot: tuple[int, ...]
    num_plain: int
    max_rank: int
    slice_sizes: tuple[int, ...]
    page_size: int
    in_dim: int = IN_DIM
    # Adapter row of each slot; default: the last rows, in reverse (rows 0.. stay unused).
    slot_adapters: tuple[int, ...] | None = None

    @property
    def num_slots(self) -> int:
        return len(self.tokens_per_slot)

    @property
    def num_adapters(self) -> int:
        if self.slot_adapters is None:
            return self.num_slots + NUM_UNUSED_ADAPTERS
        return max(self.slot_adapters) + 1 + NUM_UNUSED_ADAPTERS

    def adapter_rows(self) -> list[int]:
        if self.slot_adapters is not None:
            return list(self.slot_adapters)
        return [self.num_adapters - 1 - s for s in range(self.num_slots)]


def lora_case(
    ranks: list[list[int]],
    tokens_per_slot: list[int],
    num_plain: int,
    max_rank: int,
    slice_sizes: tuple[int, ...],
    page_size: int,
) -> LoRACase:
    """A LoRACase from lists, its slots on the default adapter rows."""
    return LoRACase(
        tuple(tuple(r) for r in ranks), tuple(tokens_per_slot), num_plain, max_rank, slice_sizes,
        page_size,
    )  # fmt: skip


# 48 slots of 1-3 tokens, ranks 4 to 16 (one 0): a partial tile each, far more slot tiles than
# whole ones, as in a decode step of many adapters.
MANY_SLOT_RANKS = [0 if s == 7 else 4 * (1 + s % 4) for s in range(48)]
MANY_SLOT_TOKENS = [1 + s % 3 for s in range(48)]

# Row placements, for in_dim 200 (A) and each slice's out_dim (B^T): "fit" packs several rows to
# a page (or exactly one), "span" splits each row over several pages.
CASES = {
    # 3 segments of BLOCK_M + 1 tokens (decode tiles): the segment-tile bound is exactly reached.
    # A: 1 row a page; B^T: 10 rows a page.
    "tight-segment-tiles": lora_case([[8, 8, 8]], [17, 17, 17], 0, 8, (24,), page_size=256),
    # A: rows span 4 pages (the last one partial); B^T: rows span 2 pages.
    "1-adapter-r4-rows-span": lora_case([[4]], [5], 0, 4, (72,), page_size=64),
    # A: 5 rows a page; B^T: 14 rows a page.
    "1-token": lora_case([[8, 16]], [0, 1], 0, 16, (72,), page_size=1024),
    "no-adapter-tokens": lora_case([[16, 8]], [0, 0], 6, 16, (72,), page_size=256),
    "no-tokens": lora_case([[8]], [0], 0, 8, (72,), page_size=64),
    # A: exactly one row a page (row_len == page_size); B^T: 2 and 8 rows a page.
    "2-slices-padded": lora_case([[8, 16], [8, 0]], [3, 9], 2, 64, (72, 24), page_size=200),
    # qkv-like: a slot without q, a slot with only v, an unused slot, a slot without tokens.
    # A and q's B^T: rows span pages; k's and v's B^T: one row a page.
    "3-slices-uneven-ranks-rows-span": lora_case(
        [[16, 0, 0, 4, 8], [16, 4, 0, 4, 8], [16, 4, 0, 0, 8]],
        [1, 3, 4, 37, 0],
        4,
        16,
        (136, 40, 40),
        page_size=64,
    ),
    # A: 2 rows a page; B^T: 21, 64 and 64 rows a page.
    "3-slices-r64-r4": lora_case(
        [[64, 4, 64], [64, 4, 64], [64, 4, 0]], [17, 16, 2], 1, 64, (24, 8, 8), page_size=512
    ),
    # Ranks past the widest rank tile (64) of every tile row: several rank tiles / rank steps.
    # A: rows span 4 pages; B^T: 2 and 4 rows a page.
    "2-slices-r128": lora_case([[100, 40], [128, 0]], [4, 6], 1, 128, (24, 16), page_size=64),
    # B^T of one slice spans pages, of the other packs 2 rows a page.
    "mixed-row-placements": lora_case([[8, 4], [8, 16]], [5, 7], 2, 16, (72, 24), page_size=64),
    # Many slots of a few tokens each.
    "many-small-segments": lora_case(
        [MANY_SLOT_RANKS, MANY_SLOT_RANKS[::-1]], MANY_SLOT_TOKENS, 3, 16, (24, 8), page_size=256
    ),
}
# The Triton expand reads this case wrong (see test_lora_kernels.py).
MIXED_PLACEMENTS = "mixed-row-placements"


def case_params(marks: dict[str, pytest.MarkDecorator] | None = None) -> list[object]:
    """pytest params of CASES (argument `case`), with `marks` on the named ones."""
    marks = marks or {}
    return [
        pytest.param(c, id=name, marks=[marks[name]] if name in marks else [])
        for name, c in CASES.items()
    ]


@dataclass
class LoRAKernelInputs:
    """The arguments of one shrink + expand pair, and the dense matrices they hold."""

    x: torch.Tensor  # [num_tokens, in_dim]
    pages: torch.Tensor  # [num_pages, page_size], NaN outside the adapters' rows
    page_table: torch.Tensor  # [num_adapters, max_pages] int32
    first_a: torch.Tensor  # [num_slices, num_adapters] int32: first page of A_i (0: rank 0)
    first_b: torch.Tensor  # [num_slices, num_adapters] int32: first page of B_i^T
    lora_ranks: torch.Tensor  # [num_slices, num_adapters] int32
    scalings: torch.Tensor  # [num_adapters] float32
    slot_adapters: torch.Tensor  # [num_slots] int32
    num_active_slots: torch.Tensor  # [1] int32: every slot (some without tokens)
    sorted_token_ids: torch.Tensor  # [num_tokens] int32
    slot_start_loc: torch.Tensor  # [num_slots + 1] int32
    slice_sizes: tuple[int, ...]
    max_rank: int
    token_lora_slots: torch.Tensor  # [num_tokens]; -1 = no adapter
    # Per (slice, slot): A_i [rank, in_dim] and B_i^T [rank, out_dim_i], in the pages' dtype.
    lora_a: list[list[torch.Tensor]]
    lora_b_t: list[list[torch.Tensor]]

    @property
    def mapping(self) -> tuple[torch.Tensor, ...]:
        """slot_adapters, num_active_slots, sorted_token_ids, slot_start_loc."""
        return self.slot_adapters, self.num_active_slots, self.sorted_token_ids, self.slot_start_loc

    @property
    def shrink_tables(self) -> tuple[torch.Tensor, ...]:
        """The shrink's arguments between x and out."""
        return self.pages, self.page_table, self.first_a, self.lora_ranks, *self.mapping

    @property
    def expand_tables(self) -> tuple[torch.Tensor, ...]:
        """The expand's arguments between lora_out and y."""
        tables = (self.pages, self.page_table, self.first_b, self.lora_ranks, self.scalings)
        return *tables, *self.mapping

    @property
    def shape(self) -> tuple[int, int, int]:
        """(num_slices, num_tokens, max_rank): the shrink output's shape."""
        return len(self.slice_sizes), self.x.shape[0], self.max_rank

    def slot_ranks(self) -> list[list[int]]:
        """ranks[slice][slot]: the rank of each slot's adapter."""
        rows = self.slot_adapters.tolist()
        return [[ranks[a] for a in rows] for ranks in self.lora_ranks.tolist()]


def place_matrix(
    pages: torch.Tensor,  # [num_pages, page_size], contiguous
    adapter_pages: torch.Tensor,  # [max_pages] int64: one adapter's row of the page table
    first: int,
    matrix: torch.Tensor,  # [rows, row_len]
) -> None:
    """Write `matrix` at the adapter's page number `first`, element (j, c) at

    page   = adapter_pages[first + (j // rows_per_page) * pages_per_row + c // page_size]
    offset = (j % rows_per_page) * row_len + c % page_size

    and nothing else (the rest of its pages keeps its NaN)."""
    page_size = pages.shape[1]
    rows, row_len = matrix.shape
    per_page, per_row = rows_per_page(row_len, page_size), pages_per_row(row_len, page_size)
    j = torch.arange(rows, device=pages.device)[:, None]
    c = torch.arange(row_len, device=pages.device)[None, :]
    page = adapter_pages[first + (j // per_page) * per_row + c // page_size]  # [rows, row_len]
    offset = (j % per_page) * row_len + c % page_size
    pages.view(-1)[(page * page_size + offset).flatten()] = matrix.flatten().to(pages.dtype)


def make_inputs(
    case: LoRACase,
    dtype: torch.dtype,
    device: torch.device,
    num_pages: int | None = None,
    max_pages: int | None = None,
) -> LoRAKernelInputs:
    """Random weights at case.ranks[slice][slot] in shuffled pages, and a shuffled batch with
    tokens_per_slot[s] tokens on slot s plus case.num_plain without an adapter. Shrink outputs
    and expand deltas are O(1). `num_pages` / `max_pages` fix the pool's and the page table's
    sizes (two batches of one shape, e.g. to replay a CUDA graph), else just enough."""
    num_slices, num_slots, num_adapters = len(case.ranks), case.num_slots, case.num_adapters
    assert len(case.slice_sizes) == num_slices and all(len(r) == num_slots for r in case.ranks)
    rows = case.adapter_rows()
    assert len(set(rows)) == num_slots, "each batch slot has an adapter row of its own"
    page_size = case.page_size

    # Each slot's adapter: per slice A_i, then B_i^T, in its own pages (page_layout's order).
    firsts_a = [[0] * num_adapters for _ in range(num_slices)]
    firsts_b = [[0] * num_adapters for _ in range(num_slices)]
    adapter_num_pages = [0] * num_adapters
    for s, a in enumerate(rows):
        for i, size in enumerate(case.slice_sizes):
            rank = case.ranks[i][s]
            if rank:
                firsts_a[i][a] = adapter_num_pages[a]
                adapter_num_pages[a] += matrix_pages(rank, case.in_dim, page_size)
                firsts_b[i][a] = adapter_num_pages[a]
                adapter_num_pages[a] += matrix_pages(rank, size, page_size)
    needed = sum(adapter_num_pages)
    num_pages = num_pages or needed + NUM_POISON_PAGES
    # Slack past the adapters' pages (unowned ids): a kernel that addresses rows wrongly, up to
    # a rank's worth of pages too far, reads poison rather than past the page table.
    max_pages = max_pages or max(adapter_num_pages) + max(case.max_rank, 2)
    assert num_pages >= needed + 1 and max_pages >= max(adapter_num_pages)
    perm = torch.randperm(num_pages).tolist()
    poison = perm[needed:]
    page_table = torch.tensor(
        [[poison[(a + p) % len(poison)] for p in range(max_pages)] for a in range(num_adapters)]
    )  # every entry an unowned page until an adapter takes it
    taken = 0
    for a, n in enumerate(adapter_num_pages):
        page_table[a, :n] = torch.tensor(perm[taken : taken + n], dtype=torch.int64)
        taken += n

    pages = torch.full((num_pages, page_size), NAN, device=device, dtype=dtype)
    page_table = page_table.to(device)
    lora_a: list[list[torch.Tensor]] = [[] for _ in range(num_slices)]
    lora_b_t: list[list[torch.Tensor]] = [[] for _ in range(num_slices)]
    for i, size in enumerate(case.slice_sizes):
        for s, a in enumerate(rows):
            rank = case.ranks[i][s]
            a_i = torch.randn(rank, case.in_dim, device=device) / case.in_dim**0.5
            b_t = torch.randn(rank, size, device=device) / max(rank, 1) ** 0.5
            lora_a[i].append(a_i.to(dtype))
            lora_b_t[i].append(b_t.to(dtype))
            if rank:
                place_matrix(pages, page_table[a], firsts_a[i][a], lora_a[i][s])
                place_matrix(pages, page_table[a], firsts_b[i][a], lora_b_t[i][s])

    # Rows no slot uses: ranks that would make a kernel read their (NaN) pages.
    lora_ranks = torch.full((num_slices, num_adapters), max(case.max_rank, 1), dtype=torch.int32)
    scalings = torch.full((num_adapters,), NAN)
    for s, a in enumerate(rows):
        lora_ranks[:, a] = torch.tensor([r[s] for r in case.ranks], dtype=torch.int32)
        if any(r[s] for r in case.ranks):
            scalings[a] = torch.rand(()).item() + 0.5
        # else: an adapter targeting no slice; its scaling is never read

    slots = [s for s, n in enumerate(case.tokens_per_slot) for _ in range(n)]
    slots += [-1] * case.num_plain
    token_lora_slots = torch.tensor(slots, dtype=torch.int64)[torch.randperm(len(slots))]
    token_lora_slots = token_lora_slots.to(device)
    ids, loc = build_lora_mapping(token_lora_slots, num_slots)

    def i32(values: object) -> torch.Tensor:
        return torch.as_tensor(values, dtype=torch.int32).to(device).contiguous()

    return LoRAKernelInputs(
        x=torch.randn(len(slots), case.in_dim, device=device).to(dtype),
        pages=pages,
        page_table=i32(page_table),
        first_a=i32(firsts_a),
        first_b=i32(firsts_b),
        lora_ranks=i32(lora_ranks),
        scalings=scalings.to(device),
        slot_adapters=i32(rows),
        num_active_slots=i32([len(rows)]),
        sorted_token_ids=ids,
        slot_start_loc=loc,
        slice_sizes=case.slice_sizes,
        max_rank=case.max_rank,
        token_lora_slots=token_lora_slots,
        lora_a=lora_a,
        lora_b_t=lora_b_t,
    )


def copy_inputs(dst: LoRAKernelInputs, src: LoRAKernelInputs) -> None:
    """Copy every tensor of `src` into `dst`'s (same shapes): a new batch in place."""
    for name in (
        "x", "pages", "page_table", "first_a", "first_b", "lora_ranks", "scalings",
        "slot_adapters", "num_active_slots", "sorted_token_ids", "slot_start_loc",
        "token_lora_slots",
    ):  # fmt: skip
        getattr(dst, name).copy_(getattr(src, name))
    dst.lora_a, dst.lora_b_t = src.lora_a, src.lora_b_t


def token_ranks(inputs: LoRAKernelInputs) -> torch.Tensor:
    """[num_slices, num_tokens]: each token's rank per slice (0 without an adapter)."""
    slots = inputs.token_lora_slots.long()
    adapters = inputs.slot_adapters.long()[slots.clamp(min=0)]
    ranks = inputs.lora_ranks.long()[:, adapters]
    return torch.where(slots >= 0, ranks, torch.zeros_like(ranks))


def poisoned_lora_out(inputs: LoRAKernelInputs) -> torch.Tensor:
    """A float32 shrink output for the expand: random where it reads, NaN elsewhere."""
    shape = inputs.shape
    cols = torch.arange(shape[2], device=inputs.x.device)
    live = cols[None, None, :] < token_ranks(inputs)[:, :, None]
    values = torch.randn(shape, device=inputs.x.device)
    return torch.where(live, values, torch.full_like(values, NAN))


def random_y(inputs: LoRAKernelInputs, dtype: torch.dtype, extra_cols: int = 40) -> torch.Tensor:
    """y with `extra_cols` columns beyond the slices (room for a y_offset)."""
    width = sum(inputs.slice_sizes) + extra_cols
    return torch.randn(inputs.x.shape[0], width, device=inputs.x.device).to(dtype)


def adapted(inputs: LoRAKernelInputs) -> Iterator[tuple[int, int, int, int]]:
    """(slice, token, slot, rank) of every token whose slot has a non-zero rank for the slice."""
    ranks = inputs.slot_ranks()
    for t, s in enumerate(inputs.token_lora_slots.tolist()):
        for i in range(len(inputs.slice_sizes)):
            if s >= 0 and ranks[i][s]:
                yield i, t, s, ranks[i][s]


def naive_shrink(inputs: LoRAKernelInputs) -> torch.Tensor:
    """The shrink, token by token in float64 from the dense matrices: [num_slices, num_tokens,
    max_rank] float32."""
    out = torch.zeros(inputs.shape, device=inputs.x.device)
    for i, t, s, rank in adapted(inputs):
        a = inputs.lora_a[i][s].double()  # [rank, in_dim]
        out[i, t, :rank] = (inputs.x[t].double() @ a.T).float()
    return out


def naive_expand(
    inputs: LoRAKernelInputs, lora_out: torch.Tensor, y: torch.Tensor, y_offset: int
) -> torch.Tensor:
    """The expand, token by token in float64 from the dense matrices, into a copy of y."""
    y = y.clone()
    scalings = inputs.scalings.tolist()
    adapters = inputs.slot_adapters.tolist()
    for i, t, s, rank in adapted(inputs):
        start = y_offset + sum(inputs.slice_sizes[:i])
        delta = lora_out[i, t, :rank].double() @ inputs.lora_b_t[i][s].double()
        cols = slice(start, start + inputs.slice_sizes[i])
        y[t, cols] = (y[t, cols].double() + scalings[adapters[s]] * delta).to(y.dtype)
    return y

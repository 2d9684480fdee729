"""One step's multi-LoRA mapping, applied inside every adaptable projection.

The model's `MergedLinear` layers call `begin(x)` before their base GEMM and `finish(y)` after it.
All slices of the call (q/k/v of qkv_proj, gate/up of gate_up_proj) share x, so they take one
shrink launch into an fp32 [num_slices, num_tokens, max_rank] buffer and one expand launch that
adds every slice's scaled delta into its columns of y: two launches per projection. The kernels
read each adapter's weights from its pages in the KV cache (engine/lora/page_layout.py), through
the pool's tables and this step's `slot_adapters` (batch slot -> resident id).

Slices no adapter of the step targets (outside `modules`) are skipped by launching over the
contiguous range of slices that some adapter targets (a slice inside that range that nobody
targets has rank 0 for every adapter of the step, and its programs exit at once). The
CUDA-graph batch passes every module, so the captured launches always cover every slice.

Shrink buffers: steps of up to `LoRAWorkspace.max_tokens` tokens shrink into their own region of
the step workspace, which one memset zeroes at the step's first launch (the first adapted
projection of the forward: the same one in every forward of this batch, warm-up, capture and
replay alike). Larger steps (prefill) take one zeroed buffer per layer for all its slices
([NUM_SLICES, num_tokens, max_rank], a few MB), new at each layer and at each forward's first
launch: one allocation and memset per layer instead of one per projection, which an eager step
pays on the host for every launch.

Overlap: for decode-sized steps on CUDA, `begin` runs the shrink on the workspace's side stream,
beside the base GEMM (which only reads x too). A prefill GEMM already fills the GPU, so larger
steps stay on the main stream.

Deltas into the residual stream: o_proj's and down_proj's outputs are only ever added to the
residual stream (by the next fused_add_rms_norm), so `begin(..., delta_into=residual)` expands
into the residual instead of into y, right after the shrink on the same stream. Nothing of the
LoRA then waits for the GEMM, which hides it whole on decode steps; `finish` only joins:

    main stream:  ... | base GEMM  x -> y                  | join | norm(y + residual) ...
    side stream:      | shrink x -> lora_out | expand -> residual |

SwiGLU (`silu_and_mul`): gate_up_proj's deltas are added inside the activation's kernel, which
reads y once and writes silu(gate) * up, instead of an expand that reads and writes y before
the activation reads it again (y is the widest output of a layer: [T, 2 x intermediate]).

Tensor parallelism (`reduce`, docs/tensor_parallel.md): the row-parallel projections (o_proj,
down_proj) shrink their input shard with A's matching columns, so lora_out is a partial sum:
it is all-reduced ([num_tokens, rank], small) before the expand with the whole B, into the
residual stream every rank holds whole. Column-parallel projections need nothing: the pages
hold the rank's rows of B, the expand writes the rank's columns of y.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field, replace

import torch

from loraplex.engine.distributed.tp_group import TPGroup
from loraplex.engine.lora.adapter_pool import AdapterTables
from loraplex.engine.lora.page_layout import NUM_SLICES, SLICES
from loraplex.kernels import lora_expand, lora_shrink, silu_and_mul_lora

# Steps of at most this many tokens shrink on the side stream (CUDA only).
OVERLAP_MAX_TOKENS = 64
# The workspace serves steps of up to this many tokens (the CUDA-graph batch sizes), within
# a byte cap (a large max_lora_rank allows fewer).
WORKSPACE_MAX_TOKENS = 512
WORKSPACE_MAX_BYTES = 64 << 20


class LoRAWorkspace:
    """The fp32 shrink outputs of one step, every layer and slice its own region, zeroed by one
    memset per step (LoRABatch), for a step of T tokens:

        workspace  [ num_layers x NUM_SLICES x T x max_rank ]

    Allocated once and never moved (CUDA graphs capture its address)."""

    def __init__(
        self,
        num_layers: int,
        max_rank: int,
        device: torch.device,
        max_tokens: int = WORKSPACE_MAX_TOKENS,
    ) -> None:
        self.num_layers = num_layers
        self.max_rank = max_rank
        per_token = num_layers * NUM_SLICES * max_rank
        self.max_tokens = max(0, min(max_tokens, WORKSPACE_MAX_BYTES // (4 * per_token)))
        self._buffer = torch.zeros(per_token * self.max_tokens, dtype=torch.float32, device=device)
        self.side_stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def for_step(self, num_tokens: int) -> torch.Tensor | None:
        """[num_layers, NUM_SLICES, num_tokens, max_rank] float32, contiguous; None if the step
        is too large."""
        if num_tokens > self.max_tokens:
            return None
        shape = (self.num_layers, NUM_SLICES, num_tokens, self.max_rank)
        return self._buffer[: math.prod(shape)].view(shape)


@dataclass(frozen=True)
class LoRAShrunk:
    """A projection's shrink output, waiting for its expand (`LoRABatch.begin` -> `finish`)."""

    layer_idx: int
    lora_out: torch.Tensor  # [num_slices, num_tokens, max_rank] float32
    slices: slice  # the launch's slices, as indices into SLICES
    y_offset: int
    slice_sizes: tuple[int, ...]
    ready: torch.cuda.Event | None  # recorded after the side stream's launches
    expanded: bool  # the deltas already went into begin's `delta_into`


@dataclass
class LoRABatch:
    pool: AdapterTables
    workspace: LoRAWorkspace
    sorted_token_ids: torch.Tensor  # [num_tokens] int32
    slot_start_loc: torch.Tensor  # [max_batch_loras + 1] int32
    slot_adapters: torch.Tensor  # [max_batch_loras] int32: batch slot -> resident id
    num_active_slots: torch.Tensor  # [1] int32: the step's adapters are slots [0, n)
    modules: set[str]  # modules some adapter of this step targets
    reduce: TPGroup | None = None  # tensor parallelism: row-parallel shrinks are summed
    _buffer: torch.Tensor | None = field(default=None, init=False, repr=False)
    _first_launch: tuple[int, str] | None = field(default=None, init=False, repr=False)
    # Steps too large for the workspace: (layer, its zeroed [NUM_SLICES, T, max_rank] buffer).
    _layer_buffer: tuple[int, torch.Tensor] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self._buffer = self.workspace.for_step(self.sorted_token_ids.shape[0])

    def begin(
        self,
        layer_idx: int,
        slice_names: tuple[str, ...],
        slice_sizes: tuple[int, ...],
        x: torch.Tensor,
        delta_into: torch.Tensor | None = None,
        all_slices: bool = False,
    ) -> LoRAShrunk | None:
        """Shrink x for every adapted slice (on the side stream at decode sizes); x and
        `delta_into` must stay alive until `finish`. None when no slice is adapted.

        `delta_into`, shaped like y: a tensor the caller adds y to before anyone reads y (the
        residual stream). The expand then adds the deltas there, right after the shrink.
        `all_slices`: shrink every slice of the projection if any is adapted (the others have
        rank 0 for every adapter of the step), for `silu_and_mul`, which takes both."""
        used = [i for i, name in enumerate(slice_names) if name in self.modules]
        if not used:
            return None
        assert delta_into is None or delta_into.shape == (x.shape[0], sum(slice_sizes))
        lo, hi = (0, len(slice_names)) if all_slices else (used[0], used[-1] + 1)
        first = SLICES.index(slice_names[0])
        slices = slice(first + lo, first + hi)
        shrunk = LoRAShrunk(
            layer_idx=layer_idx,
            lora_out=self._shrink_buffer(layer_idx, slice_names[0], slices, x),
            slices=slices,
            y_offset=sum(slice_sizes[:lo]),
            slice_sizes=slice_sizes[lo:hi],
            ready=None,
            expanded=delta_into is not None,
        )
        overlap = x.is_cuda and x.shape[0] <= OVERLAP_MAX_TOKENS
        side = self.workspace.side_stream if overlap else None
        if side is not None:
            side.wait_stream(torch.cuda.current_stream(x.device))  # x and the memset are ready
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            pool = self.pool
            rows = pool.slice_rows(slices)
            lora_shrink(
                x,
                pool.layer_pages[layer_idx],
                pool.page_table,
                rows.first_a,
                rows.ranks,
                self.slot_adapters,
                self.num_active_slots,
                self.sorted_token_ids,
                self.slot_start_loc,
                shrunk.lora_out,
                zero_out=False,
            )
            if delta_into is not None:
                if self.reduce is not None:  # a row-parallel shard's partial shrink
                    self.reduce.all_reduce(shrunk.lora_out)
                self._expand(shrunk, delta_into)
            ready = side.record_event() if side is not None else None
        return shrunk if ready is None else replace(shrunk, ready=ready)

    def finish(self, shrunk: LoRAShrunk | None, y: torch.Tensor) -> None:
        """Add the deltas of `begin`'s shrink into y (or, if they went into `delta_into`, only
        wait for them)."""
        if shrunk is None:
            return
        if shrunk.ready is not None:
            torch.cuda.current_stream(y.device).wait_event(shrunk.ready)
        if not shrunk.expanded:
            self._expand(shrunk, y)

    def silu_and_mul(self, shrunk: LoRAShrunk, y: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of gate_up_proj's output y [T, 2I] with the deltas of `begin`'s
        shrink (taken with `all_slices`) added on the way, never written back into y: one
        pass over y instead of the expand's read and write plus the activation's read."""
        assert not shrunk.expanded and shrunk.y_offset == 0 and len(shrunk.slice_sizes) == 2
        if shrunk.ready is not None:
            torch.cuda.current_stream(y.device).wait_event(shrunk.ready)
        return silu_and_mul_lora(y, shrunk.lora_out, *self._expand_tables(shrunk))

    def _shrink_buffer(
        self, layer_idx: int, first_name: str, slices: slice, x: torch.Tensor
    ) -> torch.Tensor:
        """A zeroed [num_slices, num_tokens, max_rank] float32 buffer for the shrink."""
        if self._first_launch is None:
            self._first_launch = (layer_idx, first_name)
        new_forward = self._first_launch == (layer_idx, first_name)
        if self._buffer is not None:
            if new_forward:  # one memset per forward
                self._buffer.zero_()
            return self._buffer[layer_idx, slices]
        if new_forward or self._layer_buffer is None or self._layer_buffer[0] != layer_idx:
            shape = (NUM_SLICES, x.shape[0], self.workspace.max_rank)
            buffer = torch.zeros(shape, dtype=torch.float32, device=x.device)
            self._layer_buffer = (layer_idx, buffer)
        return self._layer_buffer[1][slices]

    def _expand(self, shrunk: LoRAShrunk, y: torch.Tensor) -> None:
        tables = self._expand_tables(shrunk)
        lora_expand(shrunk.lora_out, *tables, y, shrunk.y_offset, shrunk.slice_sizes)

    def _expand_tables(self, shrunk: LoRAShrunk) -> tuple[torch.Tensor, ...]:
        """The expand's arguments between lora_out and y: the layer's pages, B's tables for the
        shrink's slices, the scalings and the step's mapping."""
        pool = self.pool
        rows = pool.slice_rows(shrunk.slices)
        return (
            pool.layer_pages[shrunk.layer_idx],
            pool.page_table,
            rows.first_b,
            rows.ranks,
            pool.scalings,
            self.slot_adapters,
            self.num_active_slots,
            self.sorted_token_ids,
            self.slot_start_loc,
        )

"""One step's multi-LoRA mapping, applied inside every adaptable projection.

The model's `MergedLinear` layers call `begin(x)` before their base GEMM and `finish(y)` after it.
All slices of the call (q/k/v of qkv_proj, gate/up of gate_up_proj) share x, so they take one
shrink launch into an fp32 [num_slices, num_tokens, max_rank] buffer and one expand launch that
adds every slice's scaled delta into its columns of y: two launches per projection.

Slices no adapter of the step targets (outside `modules`) are skipped by launching over the
contiguous range of slices that some adapter targets (a slice inside that range that nobody
targets has rank 0 in every busy slot, and its programs exit at once). The CUDA-graph batch
passes every module, so the captured launches always cover every slice.

Shrink buffers: steps of up to `LoRASlots.max_workspace_tokens` tokens shrink into their own
region of LoRASlots' step workspace, which one memset zeroes at the step's first launch (the
first adapted projection of the forward: the same one in every forward of this batch, warm-up,
capture and replay alike). Larger steps (prefill) take a zeroed buffer per launch.

Overlap: for decode-sized steps on CUDA, `begin` runs the shrink on LoRASlots' side stream, beside
the base GEMM (which only reads x too). A prefill GEMM already fills the GPU, so larger steps
stay on the main stream.

Deltas into the residual stream: o_proj's and down_proj's outputs are only ever added to the
residual stream (by the next fused_add_rms_norm), so `begin(..., delta_into=residual)` expands
into the residual instead of into y, right after the shrink on the same stream. Nothing of the
LoRA then waits for the GEMM, which hides it whole on decode steps; `finish` only joins:

    main stream:  ... | base GEMM  x -> y                  | join | norm(y + residual) ...
    side stream:      | shrink x -> lora_out | expand -> residual |
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace

import torch

from loraplex.engine.lora.lora_slots import LoRASlots
from loraplex.kernels import lora_expand, lora_shrink

# Steps of at most this many tokens shrink on the side stream (CUDA only).
OVERLAP_MAX_TOKENS = 64


@dataclass(frozen=True)
class LoRAShrunk:
    """A projection's shrink output, waiting for its expand (`LoRABatch.begin` -> `finish`)."""

    lora_out: torch.Tensor  # [num_slices, num_tokens, max_rank] float32
    lora_b: torch.Tensor  # [max_loras, sum(slice_sizes), max_rank]
    ranks: torch.Tensor  # [num_slices, max_loras] int32
    y_offset: int
    slice_sizes: tuple[int, ...]
    ready: torch.cuda.Event | None  # recorded after the side stream's launches
    expanded: bool  # the deltas already went into begin's `delta_into`


@dataclass
class LoRABatch:
    slots: LoRASlots
    sorted_token_ids: torch.Tensor  # [num_tokens] int32
    slot_start_loc: torch.Tensor  # [max_loras + 1] int32
    modules: set[str]  # modules some adapter of this step targets
    _workspace: torch.Tensor | None = field(default=None, init=False, repr=False)
    _first_launch: tuple[int, tuple[str, ...]] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self._workspace = self.slots.step_workspace(self.sorted_token_ids.shape[0])

    def begin(
        self,
        layer_idx: int,
        slice_names: tuple[str, ...],
        slice_sizes: tuple[int, ...],
        x: torch.Tensor,
        delta_into: torch.Tensor | None = None,
    ) -> LoRAShrunk | None:
        """Shrink x for every adapted slice (on the side stream at decode sizes); x and
        `delta_into` must stay alive until `finish`. None when no slice is adapted.

        `delta_into`, shaped like y: a tensor the caller adds y to before anyone reads y (the
        residual stream). The expand then adds the deltas there, right after the shrink."""
        used = [i for i, name in enumerate(slice_names) if name in self.modules]
        if not used:
            return None
        group = self.slots.groups[slice_names]
        assert group.slice_sizes == slice_sizes, f"{slice_names}: {slice_sizes} != slots'"
        assert delta_into is None or delta_into.shape == (x.shape[0], sum(slice_sizes))
        lo, hi = used[0], used[-1] + 1
        col_lo, col_hi = sum(slice_sizes[:lo]), sum(slice_sizes[:hi])
        lora_a = group.lora_a[layer_idx, :, lo:hi]  # [max_loras, slices, max_rank, in_dim]
        shrunk = LoRAShrunk(
            lora_out=self._shrink_buffer(layer_idx, group.first_slice, slice_names, lo, hi, x),
            lora_b=group.lora_b[layer_idx, :, col_lo:col_hi],  # [max_loras, cols, max_rank]
            ranks=group.ranks[lo:hi],  # [slices, max_loras]
            y_offset=col_lo,
            slice_sizes=slice_sizes[lo:hi],
            ready=None,
            expanded=delta_into is not None,
        )
        overlap = x.is_cuda and x.shape[0] <= OVERLAP_MAX_TOKENS
        side = self.slots.side_stream if overlap else None
        if side is not None:
            side.wait_stream(torch.cuda.current_stream(x.device))  # x and the memset are ready
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            mapping = (self.sorted_token_ids, self.slot_start_loc, shrunk.ranks)
            lora_shrink(x, lora_a, *mapping, shrunk.lora_out, zero_out=False)
            if delta_into is not None:
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

    def _shrink_buffer(
        self,
        layer_idx: int,
        first_slice: int,
        slice_names: tuple[str, ...],
        lo: int,
        hi: int,
        x: torch.Tensor,
    ) -> torch.Tensor:
        """A zeroed [hi - lo, num_tokens, max_rank] float32 buffer for the shrink to add into."""
        if self._workspace is None:
            shape = (hi - lo, x.shape[0], self.slots.max_lora_rank)
            return torch.zeros(shape, dtype=torch.float32, device=x.device)
        if self._first_launch is None:
            self._first_launch = (layer_idx, slice_names)
        if self._first_launch == (layer_idx, slice_names):  # a new forward: one memset
            self._workspace.zero_()
        return self._workspace[layer_idx, first_slice + lo : first_slice + hi]

    def _expand(self, shrunk: LoRAShrunk, y: torch.Tensor) -> None:
        lora_expand(
            shrunk.lora_out,
            shrunk.lora_b,
            self.sorted_token_ids,
            self.slot_start_loc,
            shrunk.ranks,
            self.slots.scalings,
            y,
            shrunk.y_offset,
            shrunk.slice_sizes,
        )

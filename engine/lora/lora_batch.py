"""One step's multi-LoRA mapping, applied inside every adaptable projection.

The runner's `MergedLinear` layers call `apply` after their base matmul. All slices of the call
(q/k/v of qkv_proj, gate/up of gate_up_proj) share x, so they take one shrink launch into an fp32
[num_slices, num_tokens, max_rank] buffer and one expand launch that adds every slice's scaled
delta into its columns of y: two launches per projection, eight per decoder layer.

Slices no adapter of the step targets (outside `modules`) are skipped by launching over the
contiguous range of slices that some adapter targets (a slice inside that range that nobody
targets has rank 0 in every busy slot, and its programs exit at once). The CUDA-graph path
passes every module, so the captured launches always cover every slice.

How the kernels are launched (`LoRAKernelPlan`; bench/kernels_check.py times the choices):
- step_workspace: the shrink adds into this step's region of LoRASlots' workspace, which one
  memset zeroes at the step's first launch (the first adapted projection of the forward, the
  same one every forward of this batch, warm-up, capture and replay alike), instead of into a
  fresh buffer with a memset per launch: 4 memsets per layer become 1 per step. Steps too big
  for the workspace (prefill) keep the buffer per launch.
- fused_max_tokens: steps of at most that many tokens launch `lora_shrink_expand`, one kernel
  per projection instead of two. It needs the workspace (whose memset also zeroes its counters).
- overlap_shrink: `begin` runs the shrink on LoRASlots' side stream. A caller that calls
  `begin(x)` before its base GEMM and `finish(y)` after it overlaps the two (the shrink reads x
  only); `apply` is both halves after the GEMM, so it never overlaps.

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

from loraplex.engine.lora.lora_slots import LoRASlots, StepWorkspace
from loraplex.kernels import lora_expand, lora_shrink, lora_shrink_expand


@dataclass(frozen=True)
class LoRAKernelPlan:
    step_workspace: bool = True  # one memset per step instead of one per shrink
    fused_max_tokens: int = 0  # steps up to this many tokens use lora_shrink_expand (0: never)
    # begin() shrinks on the side stream (CUDA), overlapping the base GEMM: measured on the
    # H200 at 28 us per layer of a decode step against 39 without (bench/results).
    overlap_shrink: bool = True


DEFAULT_PLAN = LoRAKernelPlan()
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


@dataclass(frozen=True)
class _Launch:
    """The launch arguments of one projection: its adapted slices' views."""

    lora_a: torch.Tensor  # [max_loras, num_slices, max_rank, in_dim]
    lora_b: torch.Tensor  # [max_loras, sum(slice_sizes), max_rank]
    ranks: torch.Tensor  # [num_slices, max_loras] int32
    y_offset: int
    slice_sizes: tuple[int, ...]
    lora_out: torch.Tensor | None  # zeroed workspace region; None: a buffer per launch
    counters: torch.Tensor | None  # [num_slices, max_loras] int32, zeroed with lora_out


@dataclass
class LoRABatch:
    slots: LoRASlots
    sorted_token_ids: torch.Tensor  # [num_tokens] int32
    slot_start_loc: torch.Tensor  # [max_loras + 1] int32
    modules: set[str]  # modules some adapter of this step targets
    plan: LoRAKernelPlan = DEFAULT_PLAN
    _workspace: StepWorkspace | None = field(default=None, init=False, repr=False)
    _first_launch: tuple[int, tuple[str, ...]] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.plan.step_workspace:
            self._workspace = self.slots.step_workspace(self.sorted_token_ids.shape[0])

    def apply(
        self,
        layer_idx: int,
        slice_names: tuple[str, ...],
        slice_sizes: tuple[int, ...],
        x: torch.Tensor,
        y: torch.Tensor,
    ) -> None:
        """y[:, slice] += scaling * x @ A.T @ B.T for every adapted slice (in place)."""
        launch = self._prepare(layer_idx, slice_names, slice_sizes)
        if launch is None:
            return
        fused = self.sorted_token_ids.shape[0] <= self.plan.fused_max_tokens
        if fused and launch.lora_out is not None and launch.counters is not None:
            lora_shrink_expand(
                x,
                launch.lora_a,
                launch.lora_b,
                self.sorted_token_ids,
                self.slot_start_loc,
                launch.ranks,
                self.slots.scalings,
                y,
                launch.y_offset,
                launch.slice_sizes,
                launch.lora_out,
                launch.counters,
            )
            return
        self.finish(self._shrink(launch, x, overlap=False, delta_into=None), y)

    def begin(
        self,
        layer_idx: int,
        slice_names: tuple[str, ...],
        slice_sizes: tuple[int, ...],
        x: torch.Tensor,
        delta_into: torch.Tensor | None = None,
    ) -> LoRAShrunk | None:
        """The shrink half of `apply`, on the side stream if the plan overlaps it; x (and
        `delta_into`) must stay alive until `finish`. None when no slice is adapted.

        `delta_into`, shaped like y: a tensor the caller adds y to before anyone reads y (the
        residual stream). The expand then adds the deltas there, right after the shrink."""
        launch = self._prepare(layer_idx, slice_names, slice_sizes)
        if launch is None:
            return None
        assert delta_into is None or delta_into.shape == (x.shape[0], sum(slice_sizes))
        # Only decode-sized launches gain: a prefill GEMM already fills the GPU, and sharing it
        # measured slower on the H200 (prefill steps 1.00 s against 0.89 s).
        overlap = self.plan.overlap_shrink and x.shape[0] <= OVERLAP_MAX_TOKENS
        return self._shrink(launch, x, overlap=overlap, delta_into=delta_into)

    def finish(self, shrunk: LoRAShrunk | None, y: torch.Tensor) -> None:
        """The expand half of `apply`: add the deltas of `begin`'s shrink into y (or, if they
        went into `delta_into`, only wait for them)."""
        if shrunk is None:
            return
        if shrunk.ready is not None:
            torch.cuda.current_stream(y.device).wait_event(shrunk.ready)
        if not shrunk.expanded:
            self._expand(shrunk, y)

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

    def _prepare(
        self, layer_idx: int, slice_names: tuple[str, ...], slice_sizes: tuple[int, ...]
    ) -> _Launch | None:
        used = [i for i, name in enumerate(slice_names) if name in self.modules]
        if not used:
            return None
        group = self.slots.groups[slice_names]
        assert group.slice_sizes == slice_sizes, f"{slice_names}: {slice_sizes} != slots'"
        lo, hi = used[0], used[-1] + 1
        col_lo, col_hi = sum(slice_sizes[:lo]), sum(slice_sizes[:hi])
        lora_a = group.lora_a[layer_idx]  # [max_loras, num_slices, max_rank, in_dim]
        lora_b = group.lora_b[layer_idx]  # [max_loras, sum(slice_sizes), max_rank]
        ranks = group.ranks  # [num_slices, max_loras]
        if (lo, hi) != (0, len(slice_names)):
            lora_a, lora_b, ranks = lora_a[:, lo:hi], lora_b[:, col_lo:col_hi], ranks[lo:hi]
        lora_out = counters = None
        if self._workspace is not None:
            if self._first_launch is None:
                self._first_launch = (layer_idx, slice_names)
            if self._first_launch == (layer_idx, slice_names):  # a new forward: one memset
                self._workspace.prefix.zero_()
            first, last = group.first_slice + lo, group.first_slice + hi
            lora_out = self._workspace.lora_out[layer_idx, first:last]
            counters = self._workspace.counters[layer_idx, first:last]
        return _Launch(lora_a, lora_b, ranks, col_lo, slice_sizes[lo:hi], lora_out, counters)

    def _shrink(
        self, launch: _Launch, x: torch.Tensor, overlap: bool, delta_into: torch.Tensor | None
    ) -> LoRAShrunk:
        """The shrink (and, given `delta_into`, the expand into it) on the side stream or not."""
        if launch.lora_out is None:
            shape = (len(launch.slice_sizes), x.shape[0], self.slots.max_lora_rank)
            lora_out = torch.empty(shape, dtype=torch.float32, device=x.device)  # zeroed below
        else:
            lora_out = launch.lora_out
        shrunk = LoRAShrunk(
            lora_out,
            launch.lora_b,
            launch.ranks,
            launch.y_offset,
            launch.slice_sizes,
            ready=None,
            expanded=delta_into is not None,
        )
        mapping = (self.sorted_token_ids, self.slot_start_loc, launch.ranks)
        side = self.slots.side_stream if overlap and x.is_cuda else None
        if side is not None:
            side.wait_stream(torch.cuda.current_stream(x.device))  # x and the memset are ready
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            lora_shrink(x, launch.lora_a, *mapping, lora_out, launch.lora_out is None)
            if delta_into is not None:
                self._expand(shrunk, delta_into)
        if side is None:
            return shrunk
        return replace(shrunk, ready=side.record_event())

"""What the scheduler tells the model runner, and what comes back."""

from __future__ import annotations

from dataclasses import dataclass, field

from loraplex.engine.request import Logprob, Request

BlockPairs = list[tuple[int, int]]
# (swap-outs, swap-ins, copies): the KV block copies of one step, made in that order.
BlockCopies = tuple[BlockPairs, BlockPairs, BlockPairs]


@dataclass
class ScheduledRequest:
    request: Request
    # Tokens computed this step: positions [start_position, start_position + num_new_tokens).
    num_new_tokens: int
    block_ids: list[int]
    # The request's num_computed_tokens when it was scheduled (the scheduler then advances it).
    start_position: int
    # True when this step computes the request's last token so far (logits wanted): a token
    # still being sampled by the step in flight counts (async scheduling).
    needs_sample: bool


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    # Requests that ended since the last step: the runner drops their per-request state.
    finished_request_ids: set[str] = field(default_factory=set)
    # KV copies the runner makes before the forward pass, swap-outs first:
    # (gpu block, cpu block) pairs out, then (cpu block, gpu block) pairs in.
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    # Copy-on-write (src gpu block, dst gpu block) pairs, made after the swaps.
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)

    @property
    def block_copies(self) -> BlockCopies:
        return self.blocks_to_swap_out, self.blocks_to_swap_in, self.blocks_to_copy

    @property
    def is_empty(self) -> bool:
        return not (
            self.scheduled
            or self.blocks_to_swap_out
            or self.blocks_to_swap_in
            or self.blocks_to_copy
        )


@dataclass
class ModelRunnerOutput:
    sampled_token_ids: dict[str, int] = field(default_factory=dict)
    logprobs: dict[str, tuple[Logprob, list[Logprob]]] = field(default_factory=dict)

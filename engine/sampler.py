"""Sampler: the last-position logits of a step → one token per row (+ optional logprobs).

Order, as vLLM: banned tokens (min_tokens) → penalties → greedy rows take the argmax → random
rows: temperature → top-k → top-p → min-p → exponential race. Logprobs come from the
log-softmax of the post-penalty, pre-temperature logits (vLLM's default "raw" logprobs).

The exponential race (Gumbel-max in another guise) samples `argmax(p_i / q_i)` with
`q_i ~ Exp(1)`; drawing each seeded row's `q` from that row's own generator makes its tokens
independent of whatever else shares the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loraplex.engine.device_copy import copy_to_host, to_device
from loraplex.engine.request import Logprob
from loraplex.engine.sampling_metadata import PAD_TOKEN_ID, SamplingMetadata, create_generator

__all__ = [
    "SampledTensors",
    "Sampler",
    "SamplerOutput",
    "SamplingMetadata",
    "apply_min_p",
    "apply_penalties",
    "apply_top_k",
    "apply_top_p",
    "create_generator",
    "sample_exponential_race",
]

RowLogprobs = tuple[Logprob, list[Logprob]]


@dataclass
class SamplerOutput:
    """One step's sampled tokens, row-aligned with the step's `SamplingMetadata`."""

    sampled_token_ids: list[int]  # one per row
    # Per row: (sampled token's logprob, top-N alternatives sorted by logprob, descending).
    # None for a row that did not ask; the whole list is None when no row asked.
    logprobs: list[RowLogprobs | None] | None = None


@dataclass
class SampledTensors:
    """One step's samples still as tensors (on the device until the host needs them)."""

    token_ids: torch.Tensor  # [num_seqs] int64
    # Logprobs, when a row asked: the sampled token's [num_seqs], the top-N
    # [num_seqs, max_num_logprobs] and their token ids [num_seqs, max_num_logprobs].
    logprobs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def to_host(self) -> SampledTensors:
        """Start copying to host memory (pinned, without waiting when on CUDA); the copies
        are complete once the stream has run this far (see ModelRunner's PendingOutput)."""
        if self.logprobs is None:
            return SampledTensors(copy_to_host(self.token_ids))
        sampled_lp, top_lp, top_ids = self.logprobs
        return SampledTensors(
            copy_to_host(self.token_ids),
            (copy_to_host(sampled_lp), copy_to_host(top_lp), copy_to_host(top_ids)),
        )

    def to_output(self, num_logprobs: list[int | None]) -> SamplerOutput:
        """As Python lists (a device sync when the tensors are still on the GPU)."""
        token_ids = self.token_ids.tolist()
        if self.logprobs is None:
            return SamplerOutput(sampled_token_ids=token_ids)
        sampled_lp, top_lp, top_ids = (t.tolist() for t in self.logprobs)
        out: list[RowLogprobs | None] = []
        for row, n in enumerate(num_logprobs):
            if n is None:
                out.append(None)
                continue
            top = [Logprob(t, lp) for t, lp in zip(top_ids[row][:n], top_lp[row][:n], strict=True)]
            out.append((Logprob(token_ids[row], sampled_lp[row]), top))
        return SamplerOutput(sampled_token_ids=token_ids, logprobs=out)


def _token_counts(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    # token_ids [num_seqs, max_len] with PAD_TOKEN_ID pads → counts [num_seqs, vocab_size]
    ids = torch.where(token_ids == PAD_TOKEN_ID, vocab_size, token_ids)
    counts = torch.zeros(ids.shape[0], vocab_size + 1, dtype=torch.int64, device=ids.device)
    counts.scatter_add_(1, ids, torch.ones_like(ids))
    return counts[:, :vocab_size]


def apply_penalties(
    logits: torch.Tensor,
    prompt_token_ids: torch.Tensor,
    output_token_ids: torch.Tensor,
    presence_penalties: torch.Tensor,
    frequency_penalties: torch.Tensor,
    repetition_penalties: torch.Tensor,
) -> torch.Tensor:
    """Repetition penalty over prompt+output tokens (HF/vLLM: divide positive logits, multiply
    negative ones), then OpenAI presence/frequency penalties over output tokens. Returns a new
    tensor; neutral rows (1.0 / 0.0 / 0.0) are unchanged bit for bit."""
    vocab_size = logits.shape[1]
    output_counts = _token_counts(output_token_ids, vocab_size)  # [num_seqs, vocab]
    output_mask = output_counts > 0
    seen = (_token_counts(prompt_token_ids, vocab_size) > 0) | output_mask
    rep = repetition_penalties.unsqueeze(1).expand_as(logits)  # [num_seqs, vocab]
    rep = torch.where(seen, rep, torch.ones_like(rep))
    logits = torch.where(logits > 0, logits / rep, logits * rep)
    logits = logits - frequency_penalties.unsqueeze(1) * output_counts.to(logits.dtype)
    return logits - presence_penalties.unsqueeze(1) * output_mask.to(logits.dtype)


def apply_top_k(logits: torch.Tensor, top_k: torch.Tensor, max_top_k: int) -> torch.Tensor:
    """Keep each row's `top_k` largest logits (-1 = off); ties with the k-th are kept too."""
    max_k = min(max_top_k, logits.shape[1])
    values = torch.topk(logits, max_k, dim=1).values  # [num_seqs, max_k], descending
    kth = values.gather(1, (top_k.clamp(1, max_k) - 1).unsqueeze(1))  # [num_seqs, 1]
    kth = kth.masked_fill((top_k <= 0).unsqueeze(1), float("-inf"))
    return logits.masked_fill(logits < kth, float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches `top_p`."""
    probs_sort, idx = logits.softmax(dim=1).sort(dim=1, descending=True, stable=True)
    # Mass strictly before each token; the first token is always kept (top_p > 0).
    mass_before = probs_sort.cumsum(dim=1) - probs_sort  # [num_seqs, vocab]
    # top_p == 1 rows keep everything (rounding could push mass_before past 1).
    remove_sorted = (mass_before > top_p.unsqueeze(1)) & (top_p < 1.0).unsqueeze(1)
    remove = torch.empty_like(remove_sorted).scatter_(1, idx, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below `min_p` times the row's top probability."""
    probs = logits.softmax(dim=1)  # [num_seqs, vocab]
    threshold = min_p.unsqueeze(1) * probs.amax(dim=1, keepdim=True)  # [num_seqs, 1]
    return logits.masked_fill(probs < threshold, float("-inf"))


def sample_exponential_race(
    probs: torch.Tensor,
    generators: list[torch.Generator | None],
    default_generator: torch.Generator | None = None,
) -> torch.Tensor:
    """`argmax(probs / q)` with `q ~ Exp(1)` per row: a draw from each row's distribution.

    A row with its own generator draws its `q` from it alone, so its tokens depend only on its
    seed; the other rows share one batched draw from `default_generator` (torch's global RNG
    when None)."""
    q = torch.empty_like(probs)  # [num_seqs, vocab]
    seeded = [i for i, g in enumerate(generators) if g is not None]
    if len(seeded) < len(generators):
        q.exponential_(generator=default_generator)
    for i in seeded:
        q[i].exponential_(generator=generators[i])
    # Exp(1) can round to 0; a tiny floor keeps p/q finite and leaves p == 0 at 0.
    q.clamp_min_(torch.finfo(q.dtype).tiny)
    return (probs / q).argmax(dim=1)


def _sample_random(
    logits: torch.Tensor, md: SamplingMetadata, default_generator: torch.Generator | None
) -> torch.Tensor:
    # logits [num_random_rows, vocab]: md.random_rows of the batch (all rows when None).
    rows = md.random_rows

    def pick(t: torch.Tensor) -> torch.Tensor:
        return t if rows is None else t[rows]

    logits = logits / pick(md.temperature).unsqueeze(1)
    if md.top_k is not None:
        logits = apply_top_k(logits, pick(md.top_k), md.max_top_k)
    if md.top_p is not None:
        logits = apply_top_p(logits, pick(md.top_p))
    if md.min_p is not None:
        logits = apply_min_p(logits, pick(md.min_p))
    generators = [md.generators[row] for row in md.random_row_ids]
    return sample_exponential_race(logits.softmax(dim=1), generators, default_generator)


def _gather_logprobs(
    logits: torch.Tensor, sampled: torch.Tensor, md: SamplingMetadata
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # logits [num_seqs, vocab] post-penalty, pre-temperature; sampled [num_seqs]
    assert md.max_num_logprobs is not None
    logprobs = logits.log_softmax(dim=1)
    sampled_lp = logprobs.gather(1, sampled.unsqueeze(1)).squeeze(1)  # [num_seqs]
    max_n = min(md.max_num_logprobs, logits.shape[1])
    top_lp, top_ids = torch.topk(logprobs, max_n, dim=1)  # [num_seqs, max_n]
    return sampled_lp, top_lp, top_ids


class Sampler:
    """Turns `[num_seqs, vocab]` logits into one token per row.

    `seed` seeds the generator shared by rows without their own; None uses torch's global RNG.
    """

    def __init__(self, seed: int | None = None) -> None:
        self.seed = seed
        self._default_generators: dict[torch.device, torch.Generator] = {}

    def _default_generator(self, device: torch.device) -> torch.Generator | None:
        if self.seed is None:
            return None
        if device not in self._default_generators:
            self._default_generators[device] = create_generator(self.seed, device)
        return self._default_generators[device]

    def __call__(self, logits: torch.Tensor, md: SamplingMetadata) -> SamplerOutput:
        """Sample one token per row of `logits` ([num_seqs, vocab], any float dtype)."""
        return self.sample(logits, md).to_output(md.num_logprobs)

    def sample(self, logits: torch.Tensor, md: SamplingMetadata) -> SampledTensors:
        """As `__call__`, leaving the results on the logits' device (no sync)."""
        assert logits.dim() == 2 and logits.shape[0] == md.num_seqs
        plain_greedy = md.all_greedy and md.no_penalties and md.max_num_logprobs is None
        if plain_greedy and md.banned_token_ids is None:
            # Argmax needs no float32 copy of the logits: the upcast is exact and keeps their
            # order, and ties resolve to the first maximum either way.
            return SampledTensors(logits.argmax(dim=1))
        logits = logits.float()  # a no-op for float32; sampling in half precision loses mass
        if md.banned_token_ids is not None:
            vocab_size = logits.shape[1]
            cells = [
                (row, token_id)
                for row, banned in enumerate(md.banned_token_ids)
                for token_id in banned
                if token_id < vocab_size
            ]
            where = to_device([i for cell in cells for i in cell], torch.int64, logits.device)
            logits = logits.clone()
            logits[where[0::2], where[1::2]] = float("-inf")
        if not md.no_penalties:
            assert md.prompt_token_ids is not None and md.output_token_ids is not None
            assert md.presence_penalties is not None and md.frequency_penalties is not None
            assert md.repetition_penalties is not None
            logits = apply_penalties(
                logits,
                md.prompt_token_ids,
                md.output_token_ids,
                md.presence_penalties,
                md.frequency_penalties,
                md.repetition_penalties,
            )

        if md.all_greedy:
            # Fast path: ties resolve to the first maximum, as torch.argmax (and HF) do.
            sampled = logits.argmax(dim=1)
        else:
            generator = self._default_generator(logits.device)
            if md.random_rows is None:
                sampled = _sample_random(logits, md, generator)
            else:
                sampled = logits.argmax(dim=1)
                rows = md.random_rows  # [num_random_rows]
                sampled[rows] = _sample_random(logits[rows], md, generator)

        logprobs = None if md.max_num_logprobs is None else _gather_logprobs(logits, sampled, md)
        return SampledTensors(sampled, logprobs)

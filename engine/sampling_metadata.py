"""Per-step sampling inputs: the batch's `SamplingParams` turned into row-aligned tensors.

Built once per step by the model runner, read by `Sampler`. The boolean flags let the common
cases (all greedy, no penalties, no top-k) skip whole stages without a device sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loraplex.engine.device_copy import tensor_to_device, to_device
from loraplex.engine.request import MAX_LOGPROBS, SamplingParams

# Pads ragged token-id lists; remapped to an out-of-vocab bin when penalties are applied.
PAD_TOKEN_ID = -1


def create_generator(seed: int, device: torch.device | str) -> torch.Generator:
    """A generator for one seeded request; the engine keeps it across the request's steps."""
    return torch.Generator(device=device).manual_seed(seed)


def _pad_token_ids(token_ids: list[list[int]], device: torch.device | str) -> torch.Tensor:
    max_len = max((len(ids) for ids in token_ids), default=0)
    padded = [ids + [PAD_TOKEN_ID] * (max_len - len(ids)) for ids in token_ids]
    # [num_seqs, max_len]
    host = torch.tensor(padded, dtype=torch.int64).reshape(len(token_ids), max_len)
    return tensor_to_device(host, device)


@dataclass
class SamplingMetadata:
    """Row-aligned sampling state of one step. Tensors are `[num_seqs]` unless noted.

    A tensor is `None` when its stage is off for every row (then the matching `no_*` flag is
    True). Rows whose parameter is neutral (top_k -1, top_p 1, min_p 0, penalties off) are no-ops.
    """

    temperature: torch.Tensor  # [num_seqs] float32; 0 marks a greedy row
    all_greedy: bool
    all_random: bool
    # Rows that sample (temperature > 0) when the batch mixes greedy and random rows, else None.
    random_rows: torch.Tensor | None  # [num_random_rows] int64
    random_row_ids: list[int]
    top_k: torch.Tensor | None  # [num_seqs] int64; -1 = off
    max_top_k: int  # largest top_k among rows that use it (0 when no_top_k)
    top_p: torch.Tensor | None  # [num_seqs] float32
    min_p: torch.Tensor | None  # [num_seqs] float32
    presence_penalties: torch.Tensor | None  # [num_seqs] float32
    frequency_penalties: torch.Tensor | None  # [num_seqs] float32
    repetition_penalties: torch.Tensor | None  # [num_seqs] float32
    prompt_token_ids: torch.Tensor | None  # [num_seqs, max_prompt_len] int64, PAD_TOKEN_ID pads
    output_token_ids: torch.Tensor | None  # [num_seqs, max_output_len] int64, PAD_TOKEN_ID pads
    # Tokens to forbid per row (EOS and stop ids while fewer than min_tokens were generated).
    banned_token_ids: list[list[int]] | None
    generators: list[torch.Generator | None]
    num_logprobs: list[int | None]  # per row, capped at MAX_LOGPROBS
    max_num_logprobs: int | None  # None when no row asked for logprobs

    @property
    def num_seqs(self) -> int:
        return len(self.generators)

    @property
    def no_top_k(self) -> bool:
        return self.top_k is None

    @property
    def no_top_p(self) -> bool:
        return self.top_p is None

    @property
    def no_min_p(self) -> bool:
        return self.min_p is None

    @property
    def no_penalties(self) -> bool:
        return self.repetition_penalties is None

    @classmethod
    def build(
        cls,
        params: list[SamplingParams],
        prompt_token_ids: list[list[int]],
        output_token_ids: list[list[int]],
        generators: list[torch.Generator | None],
        device: torch.device | str,
        stop_token_ids: list[list[int]] | None = None,
    ) -> SamplingMetadata:
        """Tensorise one step's sampling parameters (all lists row-aligned).

        `stop_token_ids` (per row: EOS plus the request's stop ids) is only needed to enforce
        `min_tokens`; without it `min_tokens` is not applied.
        """
        num_seqs = len(params)
        assert num_seqs > 0
        assert len(prompt_token_ids) == len(output_token_ids) == len(generators) == num_seqs

        def floats(values: list[float]) -> torch.Tensor:
            return to_device(values, torch.float32, device)

        greedy = [p.temperature == 0.0 for p in params]
        temperature = floats([p.temperature for p in params])
        random_row_ids = [row for row, g in enumerate(greedy) if not g]
        mixed = 0 < len(random_row_ids) < num_seqs

        top_ks = [p.top_k for p in params]
        use_top_k = any(k > 0 for k in top_ks)
        use_top_p = any(p.top_p < 1.0 for p in params)
        use_min_p = any(p.min_p > 0.0 for p in params)
        use_penalties = any(p.needs_penalties for p in params)

        banned: list[list[int]] | None = None
        if stop_token_ids is not None:
            assert len(stop_token_ids) == num_seqs
            banned = [
                list(stop_ids) if len(out) < p.min_tokens else []
                for p, out, stop_ids in zip(params, output_token_ids, stop_token_ids, strict=True)
            ]
            if not any(banned):
                banned = None

        num_logprobs = [
            None if p.logprobs is None else min(p.logprobs, MAX_LOGPROBS) for p in params
        ]
        asked = [n for n in num_logprobs if n is not None]

        return cls(
            temperature=temperature,
            all_greedy=not random_row_ids,
            all_random=len(random_row_ids) == num_seqs,
            random_rows=(to_device(random_row_ids, torch.int64, device) if mixed else None),
            random_row_ids=random_row_ids,
            top_k=to_device(top_ks, torch.int64, device) if use_top_k else None,
            max_top_k=max(top_ks) if use_top_k else 0,
            top_p=floats([p.top_p for p in params]) if use_top_p else None,
            min_p=floats([p.min_p for p in params]) if use_min_p else None,
            presence_penalties=(
                floats([p.presence_penalty for p in params]) if use_penalties else None
            ),
            frequency_penalties=(
                floats([p.frequency_penalty for p in params]) if use_penalties else None
            ),
            repetition_penalties=(
                floats([p.repetition_penalty for p in params]) if use_penalties else None
            ),
            prompt_token_ids=_pad_token_ids(prompt_token_ids, device) if use_penalties else None,
            output_token_ids=_pad_token_ids(output_token_ids, device) if use_penalties else None,
            banned_token_ids=banned,
            generators=list(generators),
            num_logprobs=num_logprobs,
            max_num_logprobs=max(asked) if asked else None,
        )

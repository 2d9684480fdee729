"""The token embedding split by vocabulary rows over the tensor-parallel ranks (Megatron's
VocabParallelEmbedding): each rank looks up the tokens in its rows, zeros for the others, and
one all-reduce sums the ranks' rows into every token's embedding."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from loraplex.engine.distributed.tp_group import TensorParallel


class VocabParallelEmbedding(nn.Module):
    def __init__(
        self, hidden_size: int, tp: TensorParallel, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__()
        layout = tp.layout
        self.group = tp.group
        self.vocab_start = layout.vocab_shard.start
        self.vocab_end = layout.vocab_shard.start + layout.vocab_shard.size
        # [vocab_padded, hidden_size]: this rank's rows, zero padding past the last real one.
        self.weight = nn.Parameter(
            torch.zeros(layout.vocab_padded, hidden_size, dtype=dtype, device=device),
            requires_grad=False,
        )

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [T] -> [T, hidden_size], the same on every rank."""
        mine = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)
        local_ids = torch.where(mine, input_ids - self.vocab_start, 0)
        hidden = F.embedding(local_ids, self.weight)
        hidden.masked_fill_(~mine[:, None], 0.0)
        return self.group.all_reduce(hidden)

    def extra_repr(self) -> str:
        return f"rows=[{self.vocab_start}, {self.vocab_end}), padded={self.weight.shape[0]}"

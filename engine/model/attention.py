"""Self-attention over the paged KV cache, for one decoder layer."""

from __future__ import annotations

import torch
from torch import nn

from loraplex.engine.distributed.sharding import as_dim
from loraplex.engine.distributed.tp_group import TensorParallel
from loraplex.engine.model.forward_context import ForwardContext
from loraplex.engine.model.hf_config import ModelArchConfig
from loraplex.engine.model.linear import MergedLinear
from loraplex.engine.model.quant.linear_method import QuantizedInput
from loraplex.engine.model.quant.quant_config import QuantConfig
from loraplex.kernels import paged_attention, rotary_and_cache


class Attention(nn.Module):
    """qkv projection, rotary, cache write, paged attention, output projection.

    With `tp`, this rank's heads only: qkv_proj column-parallel (its query heads and their KV
    heads), o_proj row-parallel (one all-reduce)."""

    def __init__(
        self,
        arch: ModelArchConfig,
        layer_idx: int,
        dtype: torch.dtype,
        device: torch.device,
        quant: QuantConfig | None = None,
        tp: TensorParallel | None = None,
    ) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = arch.head_dim
        if tp is None:
            self.num_heads, self.num_kv_heads = arch.num_attention_heads, arch.num_key_value_heads
            self.q_size, self.kv_size = arch.q_size, arch.kv_size
        else:
            layout = tp.layout
            self.num_heads, self.num_kv_heads = layout.num_heads, layout.num_kv_heads
            self.q_size, self.kv_size = layout.q_size, layout.kv_size
        self.scale = arch.head_dim**-0.5
        self.sliding_window = arch.sliding_windows[layer_idx]
        self.qkv_proj = MergedLinear(
            layer_idx,
            arch.hidden_size,
            ("q_proj", "k_proj", "v_proj"),
            (self.q_size, self.kv_size, self.kv_size),
            arch.qkv_bias,
            dtype,
            device,
            quant,
            shards=None if tp is None else (tp.layout.q_shard,) + (tp.layout.kv_shard,) * 2,
        )
        self.o_proj = MergedLinear(
            layer_idx,
            self.q_size,
            ("o_proj",),
            (arch.hidden_size,),
            arch.o_proj_bias,
            dtype,
            device,
            quant,
            shards=None if tp is None else (as_dim(tp.layout.q_shard, 1),),
            reduce=None if tp is None else tp.group,
        )

    def forward(
        self,
        hidden: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        ctx: ForwardContext,
        residual: torch.Tensor,
        quantized: QuantizedInput | None = None,
    ) -> torch.Tensor:
        """hidden [T, hidden_size]; cos, sin [T, head_dim] -> [T, hidden_size]

        `residual` [T, hidden_size]: the stream the output is added to next; o_proj's LoRA
        deltas go there (MergedLinear). `quantized`: hidden as FP8, for an FP8 qkv_proj; hidden
        may then be None in a step without adapters.
        """
        qkv = self.qkv_proj(hidden, ctx, quantized=quantized)  # [T, q_size + 2 * kv_size]
        num_tokens = qkv.shape[0]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        key_cache, value_cache = ctx.kv_caches[self.layer_idx]
        attn = ctx.attn
        # Strided views of qkv in, read in place; a new contiguous rotated q out. The rotated k
        # and v go straight into their cache slots: attention reads the keys from there.
        q = rotary_and_cache(
            q.view(num_tokens, self.num_heads, self.head_dim),
            k.view(num_tokens, self.num_kv_heads, self.head_dim),
            v.view(num_tokens, self.num_kv_heads, self.head_dim),
            cos,
            sin,
            key_cache,
            value_cache,
            attn.slot_mapping,
        )
        out = paged_attention(
            q,
            key_cache,
            value_cache,
            attn.block_tables,
            attn.seq_lens,
            attn.query_start_loc,
            self.scale,
            self.sliding_window,
            attn.num_decode_seqs,
        )
        return self.o_proj(out.view(num_tokens, self.q_size), ctx, residual)  # [T, hidden_size]

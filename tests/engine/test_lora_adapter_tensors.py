"""The weights as views of the file read once, mixed dtypes, and the NaN/Inf check."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from loraplex.engine.lora.adapter import _tensor_views, has_non_finite, load_lora_adapter
from loraplex.engine.lora.safetensors_header import data_section_start, parse_safetensors_header
from tests.engine.adapter_files import (
    ARCH,
    PREFIX,
    edit_weights,
    expect_invalid,
    f32_entry,
    write_raw_safetensors,
)


def last_in_file(path: Path) -> str:
    """The name of the tensor whose bytes end the data section."""
    data = (path / "adapter_model.safetensors").read_bytes()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_len])
    header.pop("__metadata__", None)
    return max(header, key=lambda name: header[name]["data_offsets"][1])


MIXED = {"q_proj": torch.bfloat16, "v_proj": torch.float16, "down_proj": torch.float32}


def make_mixed(path: Path) -> dict[str, torch.Tensor]:
    """One file with bf16 q_proj, fp16 v_proj and fp32 down_proj tensors."""

    def convert(t: dict[str, torch.Tensor]) -> None:
        for name, value in t.items():
            t[name] = value.to(next(d for m, d in MIXED.items() if f".{m}." in name))

    edit_weights(path, convert)
    return {k: v.clone() for k, v in load_file(str(path / "adapter_model.safetensors")).items()}


def test_mixed_dtypes_load_exactly(bad_dir: Path) -> None:
    want = make_mixed(bad_dir)
    adapter = load_lora_adapter(bad_dir, ARCH, 64)
    for (layer, module), (a, b) in adapter.weights.items():
        key = f"{PREFIX}.{layer}.{'mlp' if module == 'down_proj' else 'self_attn'}.{module}"
        assert a.dtype == b.dtype == MIXED[module]
        assert torch.equal(a, want[f"{key}.lora_A.weight"])
        assert torch.equal(b, want[f"{key}.lora_B.weight"])


@pytest.mark.parametrize(
    ("module", "value"),
    [("q_proj", float("nan")), ("v_proj", float("-inf")), ("down_proj", float("nan"))],
)
def test_non_finite_in_a_mixed_file_is_named(bad_dir: Path, module: str, value: float) -> None:
    make_mixed(bad_dir)
    block = "mlp" if module == "down_proj" else "self_attn"
    key = f"{PREFIX}.1.{block}.{module}.lora_B.weight"
    edit_weights(bad_dir, lambda t: t[key].__setitem__((3, 1), value))
    expect_invalid(bad_dir, f"lora_B for layer 1 {module} contains NaN or Inf values")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_nan_in_the_last_element_of_the_data_section_is_named(
    bad_dir: Path, dtype: torch.dtype
) -> None:
    edit_weights(bad_dir, lambda t: t.update({k: v.to(dtype) for k, v in t.items()}))
    name = last_in_file(bad_dir)
    edit_weights(bad_dir, lambda t: t[name].view(-1).__setitem__(-1, float("nan")))
    assert last_in_file(bad_dir) == name
    layer, module, side = name.split(".")[4], name.split(".")[6], name.split(".")[7][-1]
    expect_invalid(bad_dir, f"lora_{side} for layer {layer} {module} contains NaN or Inf")


@pytest.mark.parametrize(("dtype", "big"), [(torch.float16, 60000.0), (torch.float32, 3e38)])
def test_finite_weights_whose_sum_overflows_load(bad_dir: Path, dtype: torch.dtype, big: float):
    # The sum that proves finiteness overflows here: the exact test must clear the alarm.
    edit_weights(
        bad_dir, lambda t: t.update({k: torch.full_like(v, big, dtype=dtype) for k, v in t.items()})
    )
    adapter = load_lora_adapter(bad_dir, ARCH, 64)
    assert all(bool((a == big).all()) for a, _ in adapter.weights.values())


def test_fp32_data_not_aligned_in_the_file_loads(bad_dir: Path) -> None:
    # A header of odd length puts the fp32 data section at an odd offset: copied, not viewed.
    original = {
        k: v.clone() for k, v in load_file(str(bad_dir / "adapter_model.safetensors")).items()
    }
    header: dict[str, Any] = {}
    blobs, offset = [], 0
    for name, value in original.items():
        blob = value.contiguous().numpy().tobytes()
        header[name] = {
            "dtype": "F32",
            "shape": list(value.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    blob = json.dumps(header).encode()
    blob += b" " * (1 - len(blob) % 2 + 2)  # 8 + len(blob) odd
    write_raw_safetensors(bad_dir, {}, b"".join(blobs), header_json=blob)
    adapter = load_lora_adapter(bad_dir, ARCH, 64)
    a, b = adapter.weights[(1, "down_proj")]
    assert torch.equal(a, original[f"{PREFIX}.1.mlp.down_proj.lora_A.weight"])
    assert torch.equal(b, original[f"{PREFIX}.1.mlp.down_proj.lora_B.weight"])


def test_the_file_is_read_once_and_viewed(good_dir: Path) -> None:
    adapter = load_lora_adapter(good_dir, ARCH, 64)
    a, b = adapter.weights[(0, "q_proj")]
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_has_non_finite(dtype: torch.dtype) -> None:
    finfo = torch.finfo(dtype)
    assert not has_non_finite(torch.empty(0, 3, dtype=dtype))
    assert not has_non_finite(torch.full((64,), finfo.max, dtype=dtype))  # the sum overflows
    for value in (float("nan"), float("inf"), float("-inf")):
        t = torch.zeros(1000, dtype=dtype)
        t[999] = value
        assert has_non_finite(t)
        assert has_non_finite(t[990:].view(2, 5))


def test_zero_element_tensors_are_views_too() -> None:
    header = {
        "e": {"dtype": "BF16", "shape": [0, 4], "data_offsets": [0, 0]},
        "f": f32_entry([2], 0),
    }
    blob = json.dumps(header).encode()
    data = torch.frombuffer(
        bytearray(struct.pack("<Q", len(blob)) + blob + bytes(8)), dtype=torch.uint8
    )
    tensors = parse_safetensors_header(data.numpy().data)
    views = _tensor_views(data, data_section_start(data.numpy().data), tensors)
    assert views["e"].shape == (0, 4) and views["e"].dtype == torch.bfloat16
    assert torch.equal(views["f"], torch.zeros(2))

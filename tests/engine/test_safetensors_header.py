"""Malformed safetensors files: every attack on the header or the data section fails with a
reason (engine/lora/safetensors_header.py, through load_lora_adapter)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.engine.adapter_files import (
    PREFIX,
    edit_weights,
    expect_invalid,
    f32_entry,
    write_raw_safetensors,
)


def test_huge_header_length(bad_dir: Path) -> None:
    write_raw_safetensors(bad_dir, {}, b"", header_len=2**40)
    expect_invalid(bad_dir, "header length 1099511627776 exceeds the 104857600-byte limit")


def test_header_length_beyond_file(bad_dir: Path) -> None:
    write_raw_safetensors(bad_dir, {}, b"", header_len=5000)
    expect_invalid(bad_dir, "exceeds the file size")


def test_file_shorter_than_length_prefix(bad_dir: Path) -> None:
    (bad_dir / "adapter_model.safetensors").write_bytes(b"\x01\x02")
    expect_invalid(bad_dir, "truncated")


def test_overlapping_offsets(bad_dir: Path) -> None:
    header = {"a": f32_entry([4, 2], 0), "b": f32_entry([4, 2], 16)}
    write_raw_safetensors(bad_dir, header, bytes(48))
    expect_invalid(bad_dir, "overlaps")


def test_out_of_file_offsets(bad_dir: Path) -> None:
    header = {"a": f32_entry([4, 2], 0), "b": f32_entry([4, 2], 32)}
    write_raw_safetensors(bad_dir, header, bytes(40))
    expect_invalid(bad_dir, "outside the data section")


def test_hole_in_data_section(bad_dir: Path) -> None:
    header = {"a": f32_entry([2], 0), "b": f32_entry([2], 16)}
    write_raw_safetensors(bad_dir, header, bytes(24))
    expect_invalid(bad_dir, "unreferenced bytes")


def test_trailing_bytes(bad_dir: Path) -> None:
    write_raw_safetensors(bad_dir, {"a": f32_entry([2], 0)}, bytes(8 + 100))
    expect_invalid(bad_dir, "trailing unreferenced bytes")


def test_duplicate_tensor_names(bad_dir: Path) -> None:
    name = f"{PREFIX}.0.self_attn.q_proj.lora_A.weight"
    entry = json.dumps(f32_entry([4, 32], 0))
    blob = f'{{"{name}": {entry}, "{name}": {entry}}}'.encode()
    write_raw_safetensors(bad_dir, {}, bytes(512), header_json=blob)
    expect_invalid(bad_dir, "duplicate key", name)


def test_size_mismatch_between_shape_and_offsets(bad_dir: Path) -> None:
    write_raw_safetensors(
        bad_dir, {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8)
    )
    expect_invalid(bad_dir, "needs 12 bytes but data_offsets span 8")


@pytest.mark.parametrize(
    "entry",
    [
        {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]},
        {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]},
        {"dtype": "F32", "shape": [1], "data_offsets": [0]},
        {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "extra": 1},
        [1, 2, 3],
    ],
)
def test_malformed_entries(bad_dir: Path, entry: Any) -> None:
    write_raw_safetensors(bad_dir, {"a": entry}, bytes(4))
    expect_invalid(bad_dir, "safetensors tensor 'a'")


def test_header_not_json(bad_dir: Path) -> None:
    write_raw_safetensors(bad_dir, {}, b"", header_json=b"{oops")
    expect_invalid(bad_dir, "safetensors header is not valid JSON")


def test_bad_metadata(bad_dir: Path) -> None:
    write_raw_safetensors(bad_dir, {"__metadata__": {"format": 1}}, b"")
    expect_invalid(bad_dir, "__metadata__")


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64, torch.int8])
def test_wrong_dtype(bad_dir: Path, dtype: torch.dtype) -> None:
    edit_weights(bad_dir, lambda t: t.update({k: v.to(dtype) for k, v in t.items()}))
    expect_invalid(bad_dir, "is not allowed", "dtype")


def test_truncated_data(bad_dir: Path) -> None:
    file = bad_dir / "adapter_model.safetensors"
    file.write_bytes(file.read_bytes()[:-100])
    expect_invalid(bad_dir, "truncated")


def test_truncated_inside_header(bad_dir: Path) -> None:
    file = bad_dir / "adapter_model.safetensors"
    file.write_bytes(file.read_bytes()[:60])
    expect_invalid(bad_dir, "truncated")

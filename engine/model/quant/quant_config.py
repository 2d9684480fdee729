"""Which quantization a model runs with: the `quantization` option and the checkpoint's own
`quantization_config` (config.json), reconciled into one `QuantConfig` at load.

Supported (anything else is a `QuantizationError` before any weight is read):

    option   checkpoint quantization_config                        runs as
    fp8      none (a bf16 / fp16 / fp32 checkpoint)                online FP8 W8A8
    fp8      quant_method "fp8" (vLLM / AutoFP8 layout)            FP8 W8A8 from the checkpoint
    fp8      quant_method "compressed-tensors", float 8-bit        FP8 W8A8 from the checkpoint
    awq      quant_method "awq", bits 4, version "gemm"            W4A16 (AWQ packing)
    gptq     quant_method "gptq", bits 4 (desc_act with g_idx)     W4A16 (GPTQ packing)

The option may be left out (None): the checkpoint's method is used. When both are given they
must agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from loraplex.engine.errors import QuantizationError

QuantMethod = Literal["fp8", "awq", "gptq"]
QUANT_METHODS: tuple[str, ...] = ("fp8", "awq", "gptq")
FP8_CHECKPOINT_METHODS = ("fp8", "compressed-tensors")
SUPPORTED_BITS = 4
DEFAULT_INT4_GROUP_SIZE = 128  # for `load_format="dummy"` 4-bit models (benchmarks)


@dataclass(frozen=True)
class Fp8Config:
    """FP8 (e4m3) weights with per-output-channel scales; activations quantized per token."""

    # "online": quantize the checkpoint's high-precision weights at load; "fp8": vLLM's fp8
    # layout; "compressed-tensors": llm-compressor's float-quantized layout.
    checkpoint_format: Literal["online", "fp8", "compressed-tensors"] = "online"
    # Serialized weight scales: one per tensor (expanded per row of a fused projection) or one
    # per output channel.
    weight_scale_per_channel: bool = False
    has_input_scale: bool = False  # static activation scales: read, unused (see docs)

    @property
    def method(self) -> QuantMethod:
        return "fp8"


@dataclass(frozen=True)
class Int4Config:
    """4-bit integer weights, asymmetric with a zero point per group, 16-bit activations."""

    method: Literal["awq", "gptq"]
    group_size: int  # -1: one group over the whole input dim
    desc_act: bool = False  # GPTQ act-order: rows belong to groups by g_idx
    # GPTQ's original ("gptq") format stores zero - 1 in qzeros; "gptq_v2" stores the zero.
    zero_offset: int = 0

    def __post_init__(self) -> None:
        if self.group_size != -1 and self.group_size <= 0:
            raise QuantizationError(f"group_size must be > 0 or -1, got {self.group_size}")
        if self.group_size != -1 and self.group_size % 8:
            raise QuantizationError(f"group_size must be a multiple of 8, got {self.group_size}")

    def groups(self, input_size: int) -> int:
        """Groups along an input dim; raises unless the group size divides it."""
        if input_size % 8:
            raise QuantizationError(
                f"4-bit packing needs an input dim divisible by 8: {input_size}"
            )
        if self.group_size == -1:
            return 1
        if input_size % self.group_size:
            raise QuantizationError(
                f"group_size {self.group_size} does not divide the input dim {input_size}"
            )
        return input_size // self.group_size

    def group_size_for(self, input_size: int) -> int:
        return input_size if self.group_size == -1 else self.group_size


QuantConfig = Fp8Config | Int4Config


def resolve_quant_config(
    option: str | None, config_json: dict[str, Any], *, dummy: bool = False
) -> QuantConfig | None:
    """The `quantization` option + config.json's `quantization_config` -> what to run.
    `dummy`: random weights (no checkpoint tensors), so a 4-bit option needs no config."""
    if option is not None and option not in QUANT_METHODS:
        raise QuantizationError(
            f"unknown quantization {option!r}; supported: {', '.join(QUANT_METHODS)}"
        )
    raw = config_json.get("quantization_config")
    if raw is None:
        if option is None:
            return None
        if option == "fp8":
            return Fp8Config()
        if dummy:
            return Int4Config(method=option, group_size=DEFAULT_INT4_GROUP_SIZE)  # type: ignore[arg-type]
        raise QuantizationError(
            f"quantization={option!r} needs a checkpoint quantized with it (config.json has no "
            "quantization_config); only fp8 quantizes a 16/32-bit checkpoint at load"
        )
    if not isinstance(raw, dict):
        raise QuantizationError("config.json: quantization_config must be an object")
    quant = _parse_checkpoint_config(raw)
    if option is not None and option != quant.method:
        raise QuantizationError(
            f"quantization={option!r} but the checkpoint is quantized with {quant.method!r}"
        )
    return quant


def _parse_checkpoint_config(raw: dict[str, Any]) -> QuantConfig:
    method = str(raw.get("quant_method", "")).lower()
    if method == "awq":
        return _parse_awq(raw)
    if method == "gptq":
        return _parse_gptq(raw)
    if method == "fp8":
        return _parse_fp8(raw)
    if method == "compressed-tensors":
        return _parse_compressed_tensors(raw)
    raise QuantizationError(
        f"unknown quant_method {method!r} in quantization_config; supported: "
        "awq, gptq, fp8, compressed-tensors (FP8)"
    )


def _check_bits(raw: dict[str, Any], key: str = "bits") -> None:
    bits = raw.get(key, raw.get("w_bit"))
    if bits != SUPPORTED_BITS:
        raise QuantizationError(f"only {SUPPORTED_BITS}-bit weights are supported, got {bits!r}")


def _group_size(raw: dict[str, Any], *keys: str) -> int:
    for key in keys:
        if key in raw:
            try:
                return int(raw[key])
            except (TypeError, ValueError) as e:
                raise QuantizationError(f"{key} must be an integer, got {raw[key]!r}") from e
    raise QuantizationError(f"quantization_config has no group size ({' / '.join(keys)})")


def _check_no_skipped_modules(raw: dict[str, Any]) -> None:
    if raw.get("modules_to_not_convert"):
        raise QuantizationError(
            "modules_to_not_convert is not supported: every linear layer of the decoder must be "
            "quantized"
        )


def _parse_awq(raw: dict[str, Any]) -> Int4Config:
    _check_bits(raw)
    version = str(raw.get("version", "gemm")).lower()
    if version != "gemm":
        raise QuantizationError(f"AWQ version {version!r} is not supported (only 'gemm' packing)")
    if raw.get("zero_point", True) is not True:
        raise QuantizationError("AWQ without zero points is not supported")
    _check_no_skipped_modules(raw)
    return Int4Config(method="awq", group_size=_group_size(raw, "group_size", "q_group_size"))


def _parse_gptq(raw: dict[str, Any]) -> Int4Config:
    _check_bits(raw)
    fmt = str(raw.get("checkpoint_format", "gptq")).lower()
    if fmt not in ("gptq", "gptq_v2"):
        raise QuantizationError(f"GPTQ checkpoint_format {fmt!r} is not supported")
    _check_no_skipped_modules(raw)
    return Int4Config(
        method="gptq",
        group_size=_group_size(raw, "group_size"),
        desc_act=bool(raw.get("desc_act", False)),
        zero_offset=1 if fmt == "gptq" else 0,
    )


def _parse_fp8(raw: dict[str, Any]) -> Fp8Config:
    if raw.get("weight_block_size") is not None:
        raise QuantizationError("block-wise FP8 (weight_block_size) is not supported")
    scheme = raw.get("activation_scheme", "dynamic")
    if scheme not in ("dynamic", "static"):
        raise QuantizationError(f"unknown FP8 activation_scheme {scheme!r}")
    if raw.get("ignored_layers"):
        raise QuantizationError("FP8 ignored_layers is not supported")
    if raw.get("kv_cache_scheme"):
        raise QuantizationError("a quantized KV cache (kv_cache_scheme) is not supported")
    return Fp8Config(checkpoint_format="fp8", has_input_scale=scheme == "static")


def _parse_compressed_tensors(raw: dict[str, Any]) -> Fp8Config:
    groups = raw.get("config_groups")
    if not isinstance(groups, dict) or len(groups) != 1:
        raise QuantizationError("compressed-tensors: exactly one config group is supported")
    fmt = raw.get("format", "float-quantized")
    if fmt not in ("float-quantized", "naive-quantized"):
        raise QuantizationError(f"compressed-tensors format {fmt!r} is not supported")
    if raw.get("kv_cache_scheme"):
        raise QuantizationError("compressed-tensors: a quantized KV cache is not supported")
    ignore = [name for name in raw.get("ignore") or [] if name != "lm_head"]
    if ignore:
        raise QuantizationError(f"compressed-tensors: ignored layers {ignore} are not supported")
    group = next(iter(groups.values()))
    weights = group.get("weights") or {}
    if weights.get("type") != "float" or weights.get("num_bits") != 8:
        raise QuantizationError(
            "compressed-tensors: only 8-bit float (FP8) weights are supported, got "
            f"type={weights.get('type')!r} num_bits={weights.get('num_bits')!r}"
        )
    strategy = weights.get("strategy")
    if strategy not in ("tensor", "channel") or weights.get("symmetric") is False:
        raise QuantizationError(
            f"compressed-tensors: FP8 weight strategy {strategy!r} is not supported "
            "(symmetric 'tensor' or 'channel' only)"
        )
    activations = group.get("input_activations") or {}
    static = bool(activations) and not activations.get("dynamic", False)
    return Fp8Config(
        checkpoint_format="compressed-tensors",
        weight_scale_per_channel=strategy == "channel",
        has_input_scale=static,
    )

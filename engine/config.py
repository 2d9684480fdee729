"""Engine configuration: frozen dataclasses, validated on construction.

`EngineConfig` bundles the four parts the engine components read. The model's own architecture
(hidden size, heads, rope) lives in `model.hf_config.ModelArchConfig`, parsed from the checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from loraplex.engine.errors import ConfigError

DType = Literal["auto", "float32", "float16", "bfloat16"]
Device = Literal["auto", "cpu", "cuda"]
LoadFormat = Literal["auto", "dummy"]  # auto: the checkpoint's safetensors | dummy: random
# None: the checkpoint's own quantization_config, if any (docs/quantization.md).
Quantization = Literal["fp8", "awq", "gptq"]
SchedulingPolicy = Literal["fcfs", "priority"]
PreemptionMode = Literal["swap", "recompute"]


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _require_choice(value: object, choices: object, name: str) -> None:
    """Literal fields are checked at run time too: the keywords come from users."""
    allowed = get_args(choices)
    _require(value in allowed, f"{name} must be one of {' | '.join(allowed)}, got {value!r}")


@dataclass(frozen=True)
class ModelConfig:
    model: str
    dtype: DType = "auto"
    device: Device = "auto"
    max_model_len: int | None = None
    seed: int = 0
    load_format: LoadFormat = "auto"
    enforce_eager: bool = False  # True: no CUDA graphs
    quantization: Quantization | None = None

    def __post_init__(self) -> None:
        _require_choice(self.load_format, LoadFormat, "load_format")
        if self.quantization is not None:
            _require_choice(self.quantization, Quantization, "quantization")
        _require_choice(self.dtype, DType, "dtype")
        _require_choice(self.device, Device, "device")
        _require(self.max_model_len is None or self.max_model_len > 0, "max_model_len must be > 0")


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    num_kv_blocks: int | None = None  # overrides the size computed from memory
    gpu_memory_utilization: float = 0.9
    cpu_kv_cache_gb: float = 2.0  # KV pool budget when running on the CPU
    swap_space_gb: float = 4.0
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        _require(
            self.block_size in (1, 2, 4, 8, 16, 32, 64, 128),
            "block_size must be a power of 2 <= 128",
        )
        _require(self.num_kv_blocks is None or self.num_kv_blocks > 0, "num_kv_blocks must be > 0")
        _require(
            0.0 < self.gpu_memory_utilization <= 1.0, "gpu_memory_utilization must be in (0, 1]"
        )
        _require(self.cpu_kv_cache_gb > 0, "cpu_kv_cache_gb must be > 0")
        _require(self.swap_space_gb >= 0, "swap_space_gb must be >= 0")


# The chunked-prefill token budget of one step when none is given, by device. On CUDA a big
# step is what keeps the GPU busy. On the CPU a step's time grows with its tokens (a 256-token
# chunk of the 135M demo model takes ~0.3-0.5 s on two cores), so a small budget lets decode
# steps and urgent requests run between the chunks of a long prompt, at no cost in prefill
# speed (the linear layers are as efficient at 256 rows as at 8192 there).
DEFAULT_MAX_NUM_BATCHED_TOKENS: dict[str, int] = {"cuda": 8192, "cpu": 256}
# Sequences per step when none is given, by device. On CUDA a decode step of 512 rows costs less
# than two of 256 (the dense layers read their weights once per step), so a saturated engine
# runs more tokens per second; the KV cache still bounds how many run at once.
DEFAULT_MAX_NUM_SEQS: dict[str, int] = {"cuda": 512, "cpu": 256}


@dataclass(frozen=True)
class SchedulerConfig:
    # LLM(...) and AsyncEngine.from_engine_args pick DEFAULT_MAX_NUM_SEQS and
    # DEFAULT_MAX_NUM_BATCHED_TOKENS for the device when they are not given; these are CUDA's.
    max_num_seqs: int = 512
    max_num_batched_tokens: int = 8192
    scheduling_policy: SchedulingPolicy = "priority"
    preemption_mode: PreemptionMode = "swap"
    # sys.setswitchinterval for the process an engine runs in: about the longest the step loop
    # waits for the interpreter while another thread (the adapter loader, the engine process's
    # pipe threads) runs Python. CPython's default is 5 ms (decode steps were delayed by up to
    # 2.9 ms while an adapter loaded in one H200 run: docs/adapter_memory.md). None: leave it.
    switch_interval_ms: float | None = 0.5
    # Schedule and launch step N+1 while the GPU runs step N (vLLM's async scheduling); tensor
    # parallelism still runs one step at a time.
    async_scheduling: bool = True

    def __post_init__(self) -> None:
        _require(self.max_num_seqs > 0, "max_num_seqs must be > 0")
        _require(
            self.switch_interval_ms is None or self.switch_interval_ms > 0,
            "switch_interval_ms must be > 0 or None",
        )
        _require(self.max_num_batched_tokens > 0, "max_num_batched_tokens must be > 0")
        _require_choice(self.scheduling_policy, SchedulingPolicy, "scheduling_policy")
        _require_choice(self.preemption_mode, PreemptionMode, "preemption_mode")


@dataclass(frozen=True)
class LoRAConfig:
    enable_lora: bool = True
    # Most distinct adapters in one step (vLLM's max_loras); None: no cap but max_num_seqs.
    # Residency is not capped by it: adapters stay on the GPU, in the KV cache's blocks, as
    # long as memory allows (engine/lora/adapter_pool.py).
    max_loras: int | None = None
    max_lora_rank: int = 64
    max_cpu_loras: int = 64  # packed adapters kept in host memory (LRU)
    # Host memory for them, taken once at start (pinned on CUDA: asynchronous uploads).
    cpu_lora_cache_gb: float = 4.0
    max_gpu_loras: int = 2048  # adapters resident on the GPU at once (rows of its tables)

    def __post_init__(self) -> None:
        _require(self.max_loras is None or self.max_loras > 0, "max_loras must be > 0 or None")
        _require(0 < self.max_lora_rank <= 512, "max_lora_rank must be in (0, 512]")
        _require(self.max_cpu_loras > 0, "max_cpu_loras must be > 0")
        _require(self.cpu_lora_cache_gb >= 0, "cpu_lora_cache_gb must be >= 0")
        _require(self.max_gpu_loras > 0, "max_gpu_loras must be > 0")


@dataclass(frozen=True)
class ParallelConfig:
    # Ranks the model is sharded over (Megatron-style, docs/tensor_parallel.md); rank 0 runs in
    # the engine's process, each other rank in a worker process of its own. 1: no workers, no
    # collectives. Whether the model divides by it is checked once its config.json is read.
    tensor_parallel_size: int = 1

    def __post_init__(self) -> None:
        _require(
            isinstance(self.tensor_parallel_size, int) and self.tensor_parallel_size > 0,
            "tensor_parallel_size must be an integer > 0",
        )


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self) -> None:
        if self.parallel.tensor_parallel_size == 1:
            return
        # Not built yet under tensor parallelism (docs/tensor_parallel.md, limitations).
        _require(
            self.model.quantization is None,
            "tensor_parallel_size > 1 does not support quantized bases yet",
        )

"""The KV cache's size at start-up: how many blocks the runner allocates on the device (shared
with resident adapters' pages) and in host memory (swap space), and the longest request that
fits. The runner measures free memory; this module decides what to ask it for."""

from __future__ import annotations

from dataclasses import dataclass

from loraplex.engine.config import EngineConfig
from loraplex.engine.distributed.lora_sharding import shard_module_shapes
from loraplex.engine.distributed.tp_runner import TensorParallelRunner
from loraplex.engine.kv_cache.kv_cache_manager import cdiv
from loraplex.engine.lora.adapter import lora_module_shapes
from loraplex.engine.lora.page_layout import max_adapter_pages
from loraplex.engine.runner.model_runner import ModelRunner


@dataclass(frozen=True)
class CacheSizes:
    num_blocks: int  # device KV blocks, adapters' pages included
    num_cpu_blocks: int  # swap space
    max_model_len: int  # the model's context, cut to what the device pool holds


def allocate_kv_cache(
    config: EngineConfig, runner: ModelRunner | TensorParallelRunner
) -> CacheSizes:
    """Allocate the runner's KV cache and swap space: at most what max_num_seqs requests of
    max_model_len tokens and the largest resident adapters could use, within free memory."""
    arch, block_size = runner.arch, config.cache.block_size
    max_model_len = config.model.max_model_len or arch.max_position_embeddings
    max_model_len = min(max_model_len, arch.max_position_embeddings)
    max_kv_blocks = config.scheduler.max_num_seqs * cdiv(max_model_len, block_size)
    num_blocks = runner.determine_num_blocks(max_kv_blocks + max_lora_blocks(config, runner))
    runner.initialize_kv_cache(num_blocks)
    num_cpu_blocks = runner.num_swap_blocks(max_kv_blocks)
    runner.initialize_swap_space(num_cpu_blocks)
    # A lone request must always fit the pool, so nothing can wait for blocks forever.
    return CacheSizes(num_blocks, num_cpu_blocks, min(max_model_len, num_blocks * block_size))


def max_lora_blocks(config: EngineConfig, runner: ModelRunner | TensorParallelRunner) -> int:
    """KV blocks adapters could ever use (pages of max_gpu_loras largest adapters; the CPU
    cache's worth on the CPU, where the pool is host memory)."""
    lora = config.lora
    if not lora.enable_lora:
        return 0
    arch, tp = runner.arch, runner.tp
    page_size = 2 * config.cache.block_size * runner.num_kv_heads * arch.head_dim
    shapes = lora_module_shapes(arch)
    if tp is not None:  # a rank's shard of each adapter (the same size on every rank)
        shapes = shard_module_shapes(shapes, tp.layout)
    pages = max_adapter_pages(lora.max_lora_rank, shapes, page_size)
    count = lora.max_gpu_loras if runner.device.type == "cuda" else lora.max_cpu_loras
    return count * pages

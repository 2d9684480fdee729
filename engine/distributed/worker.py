"""A tensor-parallel worker: ranks 1 .. N-1, one spawned process each.

It joins the group, builds its `ModelRunner` on its shard, then serves the driver's messages
(rank 0, in the engine's process) over its pipe, one per step:

    driver ──ExecuteStep──▶ worker: adapter uploads (its shards), block copies, forward
                            (collectives with every rank, the step's LoRA mapping), no
                            sampling; nothing is sent back (the collectives keep step)
    driver ──DetermineNumBlocks──▶ worker ──int──▶ driver (the smallest over the ranks wins)

Messages are plain-pickled bytes (`send_bytes`), so tensors travel by value, not through the
shared-memory handles torch.multiprocessing's pickler would create each step. A closed pipe
(the engine is gone) ends the worker; an error is reported as a `WorkerFailed` and ends it.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
from dataclasses import dataclass
from multiprocessing.connection import Connection

import torch

from loraplex.engine.config import EngineConfig
from loraplex.engine.distributed.sharding import create_tp_layout
from loraplex.engine.distributed.tp_group import TensorParallel, destroy_tp_group, init_tp_group
from loraplex.engine.lora.adapter_pool import AdapterTables, ShardUpload
from loraplex.engine.lora.lora_batch import LoRABatch, LoRAWorkspace
from loraplex.engine.model.hf_config import ModelArchConfig
from loraplex.engine.model.weight_loader import resolve_device
from loraplex.engine.runner.input_batch import ModelInputs
from loraplex.engine.runner.model_runner import ModelRunner
from loraplex.engine.scheduler.output import BlockCopies

logger = logging.getLogger(__name__)


@dataclass
class LoRAStep:
    """A step's `LoRABatch` mapping, on the CPU (the worker's tables are its own)."""

    sorted_token_ids: torch.Tensor
    slot_start_loc: torch.Tensor
    slot_adapters: torch.Tensor
    num_active_slots: torch.Tensor
    modules: set[str]

    @classmethod
    def of(cls, lora: LoRABatch) -> LoRAStep:
        return cls(
            lora.sorted_token_ids.cpu(),
            lora.slot_start_loc.cpu(),
            lora.slot_adapters.cpu(),
            lora.num_active_slots.cpu(),
            set(lora.modules),
        )


@dataclass
class ExecuteStep:
    block_copies: BlockCopies
    inputs: ModelInputs | None  # on the CPU, no sample_requests; None: copies only
    uploads: list[ShardUpload]  # this rank's shards of the adapters uploaded since the last
    lora: LoRAStep | None  # None: no adapter in the step


@dataclass
class InitLoRA:
    max_resident: int
    max_pages: int
    max_lora_rank: int


@dataclass
class DetermineNumBlocks:
    max_useful_blocks: int


@dataclass
class InitKVCache:
    num_blocks: int


@dataclass
class InitSwapSpace:
    num_cpu_blocks: int


@dataclass
class Shutdown:
    pass


@dataclass
class WorkerReady:
    rank: int


@dataclass
class WorkerFailed:
    rank: int
    error: str


WorkerMessage = ExecuteStep | DetermineNumBlocks | InitKVCache | InitSwapSpace | InitLoRA | Shutdown


def send(conn: Connection, message: object) -> None:
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def receive(conn: Connection) -> object:
    return pickle.loads(conn.recv_bytes())


def create_tensor_parallel(config: EngineConfig, rank: int, init_method: str) -> TensorParallel:
    """Join the group as `rank` and work out this rank's share of the model."""
    world_size = config.parallel.tensor_parallel_size
    arch = ModelArchConfig.from_model_dir(config.model.model)
    layout = create_tp_layout(arch, rank, world_size)
    device = resolve_device(config.model.device)
    if device.type == "cuda":
        device = torch.device("cuda", rank)
    else:  # the ranks share the host's cores: oversubscribed, every GEMM is many times slower
        torch.set_num_threads(max(1, torch.get_num_threads() // world_size))
    group = init_tp_group(rank, world_size, init_method, device)
    return TensorParallel(group, layout)


def run_worker(config: EngineConfig, rank: int, init_method: str, conn: Connection) -> None:
    """The worker process's entry point (torch.multiprocessing, spawn)."""
    try:
        runner = ModelRunner(config, create_tensor_parallel(config, rank, init_method))
        send(conn, WorkerReady(rank))
        _serve(runner, conn)
    except EOFError:
        pass  # the driver's end closed: the engine is gone
    except BaseException as exc:
        logger.exception("tensor-parallel worker %d failed", rank)
        with contextlib.suppress(OSError):  # the driver is gone too
            send(conn, WorkerFailed(rank, repr(exc)))
        raise
    finally:
        destroy_tp_group()
        conn.close()


@dataclass
class _WorkerLoRA:
    tables: AdapterTables
    workspace: LoRAWorkspace


@torch.inference_mode()
def _serve(runner: ModelRunner, conn: Connection) -> None:
    lora: _WorkerLoRA | None = None
    while True:
        message = receive(conn)
        if isinstance(message, ExecuteStep):
            _execute(runner, lora, message)
        elif isinstance(message, DetermineNumBlocks):
            send(conn, runner.determine_num_blocks(message.max_useful_blocks))
        elif isinstance(message, InitKVCache):
            runner.initialize_kv_cache(message.num_blocks)
        elif isinstance(message, InitSwapSpace):
            runner.initialize_swap_space(message.num_cpu_blocks)
        elif isinstance(message, InitLoRA):
            tables = AdapterTables(runner.kv_pages, message.max_resident, message.max_pages)
            layers = runner.arch.num_hidden_layers
            lora = _WorkerLoRA(tables, LoRAWorkspace(layers, message.max_lora_rank, runner.device))
        elif isinstance(message, Shutdown):
            return
        else:
            raise TypeError(f"unexpected message {type(message).__name__}")


def _execute(runner: ModelRunner, lora: _WorkerLoRA | None, step: ExecuteStep) -> None:
    """Rank 0's step on this rank's share: uploads, block copies, forward (no sampling)."""
    if step.uploads:
        assert lora is not None, "adapters are uploaded only once LoRA is initialized"
        for upload in step.uploads:
            lora.tables.apply(upload)
    runner.copy_blocks(step.block_copies)
    if step.inputs is None:
        return
    batch = None
    if step.lora is not None:
        assert lora is not None and runner.tp is not None
        device = runner.device
        batch = LoRABatch(
            lora.tables,
            lora.workspace,
            step.lora.sorted_token_ids.to(device),
            step.lora.slot_start_loc.to(device),
            step.lora.slot_adapters.to(device),
            step.lora.num_active_slots.to(device),
            step.lora.modules,
            runner.tp.group,
        )
    runner.forward(to_device(step.inputs, runner.device), batch)


def to_device(inputs: ModelInputs, device: torch.device) -> ModelInputs:
    """The same inputs with every tensor on `device` (a no-op on the CPU)."""
    if device.type == "cpu":
        return inputs
    attn = inputs.attn
    return ModelInputs(
        input_ids=inputs.input_ids.to(device),
        positions=inputs.positions.to(device),
        attn=type(attn)(
            slot_mapping=attn.slot_mapping.to(device),
            block_tables=attn.block_tables.to(device),
            seq_lens=attn.seq_lens.to(device),
            query_start_loc=attn.query_start_loc.to(device),
            max_query_len=attn.max_query_len,
            max_seq_len=attn.max_seq_len,
            num_decode_seqs=attn.num_decode_seqs,
        ),
        logits_indices=inputs.logits_indices.to(device),
        sample_requests=inputs.sample_requests,
    )

"""A tensor-parallel worker: ranks 1 .. N-1, one spawned process each.

It joins the group, builds its `ModelRunner` on its shard, then serves the driver's messages
(rank 0, in the engine's process) over its pipe, one per step:

    driver ──ExecuteStep──▶ worker: block copies, forward (collectives with every rank), no
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
from loraplex.engine.model.hf_config import ModelArchConfig
from loraplex.engine.model.weight_loader import resolve_device
from loraplex.engine.runner.input_batch import ModelInputs
from loraplex.engine.runner.model_runner import ModelRunner
from loraplex.engine.scheduler.output import BlockCopies

logger = logging.getLogger(__name__)


@dataclass
class ExecuteStep:
    block_copies: BlockCopies
    inputs: ModelInputs | None  # on the CPU, no sample_requests; None: copies only


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


WorkerMessage = ExecuteStep | DetermineNumBlocks | InitKVCache | InitSwapSpace | Shutdown


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


@torch.inference_mode()
def _serve(runner: ModelRunner, conn: Connection) -> None:
    while True:
        message = receive(conn)
        if isinstance(message, ExecuteStep):
            runner.copy_blocks(message.block_copies)
            if message.inputs is not None:
                runner.forward(to_device(message.inputs, runner.device))
        elif isinstance(message, DetermineNumBlocks):
            send(conn, runner.determine_num_blocks(message.max_useful_blocks))
        elif isinstance(message, InitKVCache):
            runner.initialize_kv_cache(message.num_blocks)
        elif isinstance(message, InitSwapSpace):
            runner.initialize_swap_space(message.num_cpu_blocks)
        elif isinstance(message, Shutdown):
            return
        else:
            raise TypeError(f"unexpected message {type(message).__name__}")


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
        ),
        logits_indices=inputs.logits_indices.to(device),
        sample_requests=inputs.sample_requests,
    )

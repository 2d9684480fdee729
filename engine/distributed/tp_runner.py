"""The driver of a tensor-parallel group: rank 0's `ModelRunner`, in the engine's process,
plus one worker process per other rank (engine/distributed/worker.py).

    engine process                                  worker processes (spawn)
    Scheduler, KVCacheManager ─▶ TensorParallelRunner (rank 0) ─pipe─▶ rank 1 .. N-1
                                   │ one ExecuteStep per step to each worker
                                   │ forward on rank 0's shard ◀─ all-reduce / all-gather ─▶ theirs
                                   ▼ sampling (rank 0 only, on the gathered logits)

The scheduler and the managers never see the workers: this runner answers as a ModelRunner
does. Any failure of a step (a worker dead, a collective timed out) is fatal to the group
(the ranks may be out of step): it raises `WorkerDiedError`, and the engine fails its requests
and stops (LLMEngine.step).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
import weakref
from dataclasses import replace
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from loraplex.engine.config import EngineConfig
from loraplex.engine.distributed import worker as w
from loraplex.engine.distributed.sharding import validate_tensor_parallel
from loraplex.engine.distributed.tp_group import TensorParallel, destroy_tp_group
from loraplex.engine.errors import ConfigError, WorkerDiedError
from loraplex.engine.lora.adapter_pool import ShardUpload
from loraplex.engine.lora.lora_batch import LoRABatch
from loraplex.engine.lora.lora_manager import LoRAManager
from loraplex.engine.model.hf_config import ModelArchConfig, read_config_json
from loraplex.engine.model.quant.quant_config import resolve_quant_config
from loraplex.engine.model.weight_loader import check_tp_quantization
from loraplex.engine.runner.input_batch import prepare_inputs
from loraplex.engine.runner.model_runner import ModelRunner, PendingOutput
from loraplex.engine.scheduler.output import SchedulerOutput

logger = logging.getLogger(__name__)

READY_TIMEOUT_S = 1800.0  # a worker loading its shard of a large model
REPLY_TIMEOUT_S = 600.0  # a worker profiling its memory
EXIT_WAIT_S = 5.0
JOIN_POLL_S = 0.2  # how long a failed step waits to see a worker's exit or error


class _Worker:
    def __init__(self, rank: int, process: BaseProcess, conn: Connection) -> None:
        self.rank = rank
        self.process = process
        self.conn = conn
        self.error: str | None = None  # what it reported before it ended

    def collect_error(self) -> None:
        """Read a `WorkerFailed` it left in the pipe, if any (a dead worker's last words)."""
        try:
            while self.error is None and self.conn.poll(0):
                reply = w.receive(self.conn)
                if isinstance(reply, w.WorkerFailed):
                    self.error = reply.error
        except (EOFError, OSError):
            pass

    def describe(self) -> str:
        code = self.process.exitcode
        state = "alive" if code is None else f"exit code {code}"
        return f"rank {self.rank} ({state}" + (f": {self.error})" if self.error else ")")


class TensorParallelRunner(ModelRunner):
    # Workers read their input tokens from the host's message (see _launch).
    supports_async_scheduling = False

    def __init__(self, config: EngineConfig) -> None:
        world_size = config.parallel.tensor_parallel_size
        if dist.is_initialized():  # the group is torch.distributed's default one
            raise ConfigError(
                "one tensor-parallel engine per process at a time: shut the other one down "
                "first (LLM.shutdown / LLMEngine.shutdown)"
            )
        # Checked here, before any process starts: a worker failing them would leave rank 0
        # waiting for the group.
        validate_tensor_parallel(ModelArchConfig.from_model_dir(config.model.model), world_size)
        config_json = read_config_json(config.model.model)
        dummy = config.model.load_format == "dummy"
        check_tp_quantization(
            resolve_quant_config(config.model.quantization, config_json, dummy=dummy), world_size
        )
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        context = mp.get_context("spawn")
        self.workers: list[_Worker] = []
        self.lora_manager: LoRAManager | None = None
        for rank in range(1, world_size):
            parent, child = context.Pipe()
            process = context.Process(
                target=w.run_worker,
                args=(config, rank, init_method, child),
                name=f"loraplex-tp-worker-{rank}",
                daemon=True,
            )
            process.start()
            child.close()
            self.workers.append(_Worker(rank, process, parent))
        self._finalizer = weakref.finalize(self, _stop_workers, list(self.workers))
        try:
            super().__init__(config, self._join_group(config, init_method))
            for worker in self.workers:
                self._reply(worker, READY_TIMEOUT_S)
        except BaseException:
            self.shutdown()
            raise
        logger.info("tensor parallel: %d ranks (%d worker processes)", world_size, world_size - 1)

    def _join_group(self, config: EngineConfig, init_method: str) -> TensorParallel:
        """Join as rank 0, watching the workers meanwhile: one that dies before it joins
        fails the start at once, not after the group's timeout."""
        joined: list[TensorParallel] = []
        errors: list[BaseException] = []

        def join() -> None:
            try:
                joined.append(w.create_tensor_parallel(config, 0, init_method))
            except BaseException as exc:  # handed to the caller's thread
                errors.append(exc)

        thread = threading.Thread(target=join, name="loraplex-tp-join", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(JOIN_POLL_S)
            self._check_alive()
        if errors:
            raise errors[0]
        return joined[0]

    # ---- set-up: every rank does the same ------------------------------------------------

    def determine_num_blocks(self, max_useful_blocks: int) -> int:
        self._broadcast(w.DetermineNumBlocks(max_useful_blocks))
        mine = super().determine_num_blocks(max_useful_blocks)
        replies = [self._reply(worker, REPLY_TIMEOUT_S) for worker in self.workers]
        return min([mine, *(int(r) for r in replies)])  # type: ignore[call-overload]

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self._broadcast(w.InitKVCache(num_blocks))
        super().initialize_kv_cache(num_blocks)

    def initialize_swap_space(self, num_cpu_blocks: int) -> None:
        self._broadcast(w.InitSwapSpace(num_cpu_blocks))
        super().initialize_swap_space(num_cpu_blocks)

    def initialize_lora(self, lora_manager: LoRAManager | None) -> None:
        """The workers' adapter tables (their pages are their KV caches, same block ids)."""
        self.lora_manager = lora_manager
        if lora_manager is not None:
            pool, max_rank = lora_manager.pool, lora_manager.config.max_lora_rank
            self._broadcast(w.InitLoRA(pool.max_resident, pool.max_pages, max_rank))

    # ---- one step ------------------------------------------------------------------------

    @torch.inference_mode()
    def launch(
        self, scheduler_output: SchedulerOutput, lora: LoRABatch | None = None
    ) -> PendingOutput:
        """One message to each worker, then rank 0's share of the step, then sampling."""
        try:
            return self._launch(scheduler_output, lora)
        except Exception as exc:
            raise self._failure(exc) from exc

    def _launch(self, scheduler_output: SchedulerOutput, lora: LoRABatch | None) -> PendingOutput:
        self._check_alive()
        for request_id in scheduler_output.finished_request_ids:
            self._generators.pop(request_id, None)
        scheduled = scheduler_output.scheduled
        inputs = (
            prepare_inputs(scheduled, self.block_size, torch.device("cpu")) if scheduled else None
        )
        # The workers get their input tokens from the host: no step may run ahead of it.
        assert inputs is None or not inputs.placeholder_rows, "no async scheduling under TP"
        uploads = self._take_uploads()
        if inputs is not None or not scheduler_output.is_empty or any(uploads):
            sent = None if inputs is None else replace(inputs, sample_requests=[])
            lora_step = None if lora is None else w.LoRAStep.of(lora)
            for worker, mine in zip(self.workers, uploads, strict=True):
                step = w.ExecuteStep(scheduler_output.block_copies, sent, mine, lora_step)
                w.send(worker.conn, step)
        self.copy_blocks(scheduler_output.block_copies)
        if inputs is None:
            return PendingOutput.empty()
        inputs = w.to_device(inputs, self.device)
        logits = self.forward(inputs, lora)
        return PendingOutput.empty() if logits is None else self._start_sample(logits, inputs)

    def _take_uploads(self) -> list[list[ShardUpload]]:
        """Per worker, the adapter shards to write before its next forward."""
        if self.lora_manager is None:
            return [[] for _ in self.workers]
        pending = self.lora_manager.pool.shard_uploads
        taken = [list(uploads) for uploads in pending]
        for uploads in pending:
            uploads.clear()
        return taken

    # ---- workers -------------------------------------------------------------------------

    def _broadcast(self, message: w.WorkerMessage) -> None:
        for worker in self.workers:
            w.send(worker.conn, message)

    def _reply(self, worker: _Worker, timeout_s: float) -> object:
        """The worker's next message; WorkerDiedError if it fails, dies or stays silent."""
        deadline = time.monotonic() + timeout_s
        while not worker.conn.poll(1.0):
            if not worker.process.is_alive():
                raise WorkerDiedError(f"tensor-parallel worker {worker.describe()} died")
            if time.monotonic() > deadline:
                raise WorkerDiedError(
                    f"tensor-parallel worker rank {worker.rank} did not answer in {timeout_s} s"
                )
        reply = w.receive(worker.conn)
        if isinstance(reply, w.WorkerFailed):
            worker.error = reply.error
            raise WorkerDiedError(f"tensor-parallel worker rank {reply.rank} failed: {reply.error}")
        return reply

    def _check_alive(self) -> None:
        dead = [worker for worker in self.workers if not worker.process.is_alive()]
        for worker in dead:
            worker.collect_error()
        if dead:
            raise WorkerDiedError(_describe_dead(dead))

    def _failure(self, exc: Exception) -> WorkerDiedError:
        """What to report for a failed step: the workers that died (waiting a little for
        them to exit and say why), else rank 0's own error."""
        if isinstance(exc, WorkerDiedError):
            return exc
        deadline = time.monotonic() + EXIT_WAIT_S
        for worker in self.workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
            worker.collect_error()
        dead = [worker for worker in self.workers if not worker.process.is_alive()]
        if dead:
            return WorkerDiedError(_describe_dead(dead))
        return WorkerDiedError(f"a tensor-parallel step failed on rank 0: {exc!r}")

    def shutdown(self) -> None:
        """Stop the workers and leave the group (idempotent)."""
        self._finalizer()


def _describe_dead(dead: list[_Worker]) -> str:
    return "tensor-parallel worker died: " + ", ".join(worker.describe() for worker in dead)


def _stop_workers(workers: list[_Worker]) -> None:
    for worker in workers:
        with contextlib.suppress(OSError):  # already gone
            w.send(worker.conn, w.Shutdown())
    deadline = time.monotonic() + EXIT_WAIT_S
    for worker in workers:
        worker.process.join(max(0.0, deadline - time.monotonic()))
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join(EXIT_WAIT_S)
        worker.conn.close()
    destroy_tp_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])

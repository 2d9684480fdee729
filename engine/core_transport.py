"""Where the EngineCore loop runs: a thread of this process, or a process of its own.

Both take `Command`s (`send`) and hand every `StepMessage` to a callback, called from a
background thread of this process (AsyncEngine moves it onto its event loop).

- `ThreadTransport` runs the loop beside the caller (tests, embedding the engine in-process).
- `ProcessTransport` spawns a process that loads the model and runs the loop there, talking
  over a pipe (vLLM v1's split): the engine's Python work (scheduling, input preparation,
  detokenization) never competes with the web server's event loop for one interpreter. The
  process is started with `spawn` (CUDA cannot be forked) and dies with its parent.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import queue
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Protocol

from loraplex.engine.config import EngineConfig
from loraplex.engine.engine_core import Command, EngineCore, StepMessage
from loraplex.engine.errors import EngineDeadError
from loraplex.engine.llm_engine import LLMEngine

logger = logging.getLogger(__name__)

# How long a spawned core may take to load the model and report ready.
START_TIMEOUT_S = 900.0
# How long the core's last messages may take to leave when it stops.
CLOSE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class CoreInfo:
    """What AsyncEngine needs to know about the engine before the first request."""

    max_model_len: int
    vocab_size: int


class CoreTransport(Protocol):
    info: CoreInfo

    def start(self, on_message: Callable[[StepMessage], None]) -> None: ...

    def send(self, command: Command) -> None: ...

    def join(self) -> None: ...

    @property
    def is_alive(self) -> bool: ...


def _info(engine: LLMEngine) -> CoreInfo:
    return CoreInfo(engine.max_model_len, engine.runner.arch.vocab_size)


class ThreadTransport:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.info = _info(engine)
        self._inbox: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def start(self, on_message: Callable[[StepMessage], None]) -> None:
        core = EngineCore(self.engine, self._receive, on_message)
        self._thread = threading.Thread(target=core.run, name="loraplex-engine", daemon=True)
        self._thread.start()

    def _receive(self, timeout: float | None) -> Command | None:
        try:
            return self._inbox.get(timeout=timeout) if timeout else self._inbox.get_nowait()
        except queue.Empty:
            return None

    def send(self, command: Command) -> None:
        self._inbox.put(command)

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


def _core_main(config: EngineConfig, conn: Connection) -> None:
    """The spawned process: load the engine, report ready, serve until Shutdown. It never stops
    on a terminal's Ctrl-C (the server drains first, then sends Shutdown); if the server dies,
    the pipe's end closes and the loop ends on the EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        engine = LLMEngine(config, output_deltas=True)
    except BaseException as exc:
        conn.send(exc)
        raise
    freeze_startup_heap()
    conn.send(_info(engine))
    pipe = CorePipeEnd(conn)
    try:
        EngineCore(engine, pipe.receive, pipe.send).run()
    finally:
        pipe.close()


def freeze_startup_heap() -> None:
    """Move every object alive now into the collector's permanent generation.

    After start-up the process holds ~750,000 objects that live as long as it does (modules,
    the model's modules and tensor wrappers, tokenizer tables). Each full collection walked all
    of them: ~290 ms on a CPU core here, a pause of the step loop (about one per 10 s in a CPU
    run of the offline engine). Frozen, they are never walked again: a full collection then
    costs only what the objects made since cost. Garbage is collected first, so nothing dead is
    frozen; objects frozen here are still freed by reference counting when they die."""
    gc.collect()
    gc.freeze()


class CorePipeEnd:
    """The engine process's end of the pipe, with a thread per direction (as vLLM v1's engine
    core has for its sockets): the step loop never waits for the server to read a message, and
    the server's commands leave the pipe while a step runs, so the server's event loop never
    blocks on a full pipe either. Messages keep their order in both directions."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._inbox: queue.SimpleQueue[Command | None] = queue.SimpleQueue()  # None: EOF
        self._outbox: queue.SimpleQueue[StepMessage | None] = queue.SimpleQueue()  # None: stop
        self._reader = threading.Thread(target=self._read, name="loraplex-core-in", daemon=True)
        self._writer = threading.Thread(target=self._write, name="loraplex-core-out", daemon=True)
        self._reader.start()
        self._writer.start()

    def _read(self) -> None:
        try:
            while True:
                self._inbox.put(self._conn.recv())
        except (EOFError, OSError):
            self._inbox.put(None)  # the server is gone

    def _write(self) -> None:
        while (message := self._outbox.get()) is not None:
            try:
                self._conn.send(message)
            except (BrokenPipeError, OSError):
                return  # the server is gone: the reader sees the EOF, and the loop ends

    def receive(self, timeout: float | None) -> Command | None:
        """The next command, or None if none came within `timeout` (None: do not wait)."""
        try:
            command = self._inbox.get(timeout=timeout) if timeout else self._inbox.get_nowait()
        except queue.Empty:
            return None
        if command is None:
            raise EOFError("the server closed the engine's pipe")
        return command

    def send(self, message: StepMessage) -> None:
        self._outbox.put(message)

    def close(self) -> None:
        """Send what is queued (the last message included), then close the pipe."""
        self._outbox.put(None)
        self._writer.join(timeout=CLOSE_TIMEOUT_S)
        self._conn.close()


class ProcessTransport:
    def __init__(self, config: EngineConfig) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        # A daemonic process may not start processes: under tensor parallelism the core
        # starts its workers, so it is not one (AsyncEngine.shutdown still ends it).
        daemon = config.parallel.tensor_parallel_size == 1
        self._process = context.Process(
            target=_core_main, args=(config, child), name="loraplex-engine-core", daemon=daemon
        )
        self._process.start()
        child.close()
        if not self._conn.poll(START_TIMEOUT_S):
            self._process.kill()
            raise EngineDeadError("the engine process did not start in time")
        first = self._receive_or_dead()
        if isinstance(first, BaseException):
            self._process.join()
            raise first
        assert isinstance(first, CoreInfo)
        self.info = first
        self._send_lock = threading.Lock()
        self._reader: threading.Thread | None = None

    def _receive_or_dead(self) -> object:
        try:
            return self._conn.recv()
        except (EOFError, OSError) as exc:
            raise EngineDeadError(f"the engine process exited ({exc!r})") from exc

    def start(self, on_message: Callable[[StepMessage], None]) -> None:
        def read() -> None:
            while True:
                try:
                    message = self._conn.recv()
                except (EOFError, OSError):
                    if self._process.is_alive():
                        self._process.join(timeout=5)
                    code = self._process.exitcode
                    on_message(StepMessage(died=f"the engine process exited (code {code})"))
                    return
                except Exception as exc:  # a message that cannot be read: nothing is reliable
                    logger.exception("unreadable message from the engine process")
                    self._process.kill()
                    on_message(StepMessage(died=f"unreadable engine message: {exc!r}"))
                    return
                on_message(message)

        self._reader = threading.Thread(target=read, name="loraplex-engine-reader", daemon=True)
        self._reader.start()

    def send(self, command: Command) -> None:
        try:
            with self._send_lock:
                self._conn.send(command)
        except (BrokenPipeError, OSError) as exc:
            raise EngineDeadError("the engine process is gone") from exc

    def join(self) -> None:
        self._process.join()
        if self._reader is not None:
            self._reader.join(timeout=5)

    @property
    def is_alive(self) -> bool:
        return self._process.is_alive()

"""The load check: before an uploaded adapter version is `ready`, the engine loads it and runs
one short greedy generation with it. A version that fails is `failed` with the reason and is
never served; one the server stopped checking (a crash, a restart) is checked again at start-up.
"""

from __future__ import annotations

import logging
import math
import secrets

import anyio

from loraplex.engine.errors import InvalidAdapterError, InvalidParameterError
from loraplex.engine.request import RequestOutput, SamplingParams, join_output
from loraplex.platform import crud
from loraplex.platform.crud import AdapterRef
from loraplex.platform.db import Adapter, AdapterStatus, Database
from loraplex.platform.engine_client import EngineClient

logger = logging.getLogger(__name__)

LOAD_CHECK_PROMPT = "Hello"
LOAD_CHECK_TOKENS = 2
LOAD_CHECK_TIMEOUT_S = 120.0


async def load_check(engine: EngineClient, ref: AdapterRef) -> str | None:
    """None when the engine loads the adapter and generates with it; else why not."""
    try:
        with anyio.fail_after(LOAD_CHECK_TIMEOUT_S):
            # The generation loads it: in the background, on the engine's loader threads, as
            # any request's adapter (never a pause of the engine's steps); a load that fails
            # raises here.
            return await _generate(engine, ref)
    except InvalidAdapterError as e:
        return f"the engine could not load it: {e}"
    except InvalidParameterError as e:  # e.g. too large for the KV cache beside a request
        return f"the engine could not run it: {e.message}"
    except TimeoutError:
        return f"the load check did not finish within {LOAD_CHECK_TIMEOUT_S:.0f} s"


async def _generate(engine: EngineClient, ref: AdapterRef) -> str | None:
    prompt = await engine.encode_text(LOAD_CHECK_PROMPT) or [0]
    params = SamplingParams(
        max_tokens=LOAD_CHECK_TOKENS, temperature=0.0, ignore_eos=True, logprobs=0
    )
    final: RequestOutput | None = None
    stream = engine.generate(
        request_id=f"load-check-{ref.adapter_id}-{secrets.token_hex(4)}",
        prompt_token_ids=prompt,
        sampling_params=params,
        adapter=ref,
        priority=0,
        tenant_key=f"load-check-{secrets.token_hex(8)}",  # shares no prefix cache
        stream=False,
    )
    try:
        async for output in stream:
            final = output if final is None else join_output(final, output)  # deltas
    finally:  # a check cut short (its timeout) aborts its request in the engine
        await stream.close()
    if final is None or len(final.outputs[0].token_ids) != LOAD_CHECK_TOKENS:
        return "the load check generated no tokens"
    logprobs = final.outputs[0].logprobs or []
    if not all(math.isfinite(sampled.logprob) for sampled, _ in logprobs):
        return "the adapter's outputs are not finite numbers (NaN or infinite weights?)"
    return None


async def check_adapter(db: Database, engine: EngineClient, adapter_id: int) -> Adapter:
    """Run the load check on a `loading` version and record the outcome."""

    def read() -> AdapterRef:
        with db.session() as session:
            row = crud.read_adapter(session, adapter_id)
            return AdapterRef(row.id, f"{row.name}@v{row.version}", row.path, row.sha256)

    ref = await anyio.to_thread.run_sync(read)
    reason = await load_check(engine, ref)
    if reason is not None:
        logger.warning("adapter %s failed its load check: %s", ref.model_id, reason)
        await engine.engine.remove_lora(ref.adapter_id)
    status = AdapterStatus.READY if reason is None else AdapterStatus.FAILED

    def record() -> Adapter:
        with db.session() as session:
            return crud.set_adapter_status(session, adapter_id, status, reason)

    return await anyio.to_thread.run_sync(record)


async def check_pending_adapters(db: Database, engine: EngineClient) -> None:
    """Finish the load checks a stopped server left `loading` (idempotent: run by every
    server that starts; each records the same outcome)."""

    def pending() -> list[int]:
        with db.session() as session:
            return [a.id for a in crud.read_adapters(session, status=AdapterStatus.LOADING)]

    for adapter_id in await anyio.to_thread.run_sync(pending):
        await check_adapter(db, engine, adapter_id)

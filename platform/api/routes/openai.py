"""The OpenAI-compatible tenant API: /v1/models, /v1/completions, /v1/chat/completions."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel
from starlette.background import BackgroundTask

from loraplex.platform import crud
from loraplex.platform.api.deps import CurrentTenant, RateLimitHeaders, SessionDep, StateDep
from loraplex.platform.api.openapi import error_responses
from loraplex.platform.api.streaming import start_stream
from loraplex.platform.schemas import ChatCompletionRequest, CompletionRequest, ModelList
from loraplex.platform.schemas.openai_requests import SamplingFields
from loraplex.platform.schemas.openai_responses import (
    ChatCompletionResponse,
    CompletionResponse,
    ModelCard,
)
from loraplex.platform.services import (
    GenerationRun,
    admit,
    collect_chat,
    collect_completion,
    plan_chat,
    plan_completion,
    stream_chat,
    stream_completion,
)

router = APIRouter(prefix="/v1", tags=["openai"])
T = TypeVar("T", bound=BaseModel)


@router.get("/models", response_model=ModelList, dependencies=[RateLimitHeaders])
def read_models(state: StateDep, session: SessionDep, tenant: CurrentTenant) -> ModelList:
    base = state.engine.model_name
    max_len = state.engine.max_model_len
    cards = [ModelCard(id=base, created=0, owned_by="loraplex", root=base, max_model_len=max_len)]
    for usable in crud.read_usable_models(session, tenant.tenant_id):
        assert usable.adapter is not None
        cards.append(
            ModelCard(
                id=usable.model_id,
                owned_by=usable.adapter.tenant.name,
                created=int(usable.adapter.created_at.timestamp()),
                parent=base,
                root=base,
                max_model_len=max_len,
            )
        )
    return ModelList(data=cards)


# Beyond every tenant route's errors: the model does not resolve, a body too large, the
# tenant's limits or the engine's queue (429), the engine failing the request.
GENERATION_ERRORS = error_responses(404, 413, 429, 500)
# A stream's 200 is server-sent events: `data: {chunk}` lines, then `data: [DONE]`.
GENERATION_CONTENT = {
    200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}},
    **GENERATION_ERRORS,
}


@router.post("/completions", response_model=CompletionResponse, responses=GENERATION_CONTENT)
async def create_completion(
    body: CompletionRequest, state: StateDep, tenant: CurrentTenant
) -> Response:
    run = await admit(state, tenant, await plan_completion(state, tenant, body))
    return await _serve(run, body, stream_completion, collect_completion)


@router.post(
    "/chat/completions", response_model=ChatCompletionResponse, responses=GENERATION_CONTENT
)
async def create_chat_completion(
    body: ChatCompletionRequest, state: StateDep, tenant: CurrentTenant
) -> Response:
    run = await admit(state, tenant, await plan_chat(state, tenant, body))
    return await _serve(run, body, stream_chat, collect_chat)


async def _serve(
    run: GenerationRun,
    body: SamplingFields,
    stream: Callable[[GenerationRun, bool], AsyncGenerator[str, None]],
    collect: Callable[[GenerationRun], Awaitable[T]],
) -> Response:
    """The run as server-sent events (`stream: true`) or as one JSON body."""
    if body.stream:
        return await _stream(run, stream(run, body.include_usage))
    return await _respond(run, collect)


async def _stream(run: GenerationRun, events: AsyncGenerator[str, None]) -> StreamingResponse:
    try:
        body = await start_stream(events)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await run.finish("aborted")  # a no-op unless the run never got to settle itself
        raise

    async def settle() -> None:
        # Runs after the response, however it ended. If the client left before the stream
        # started, this is what aborts the engine request and settles the run.
        await events.aclose()
        await run.finish("aborted")  # a no-op when the stream settled it already

    return StreamingResponse(
        body,
        media_type="text/event-stream",
        headers={**run.headers, "cache-control": "no-cache"},
        background=BackgroundTask(settle),
    )


async def _respond(
    run: GenerationRun, collect: Callable[[GenerationRun], Awaitable[T]]
) -> Response:
    """Collect the whole response. A client that disconnects first cancels this (the
    middleware binds every request to its connection), which aborts the engine request."""
    try:
        result = await collect(run)
    finally:
        with anyio.CancelScope(shield=True):
            await run.finish("aborted")  # a no-op unless the run never got to settle itself
    payload: Any = result.model_dump(mode="json")
    return JSONResponse(payload, headers=run.headers)

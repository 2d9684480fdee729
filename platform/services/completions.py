"""POST /v1/completions: plan, collect, stream."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing

from loraplex.platform.auth import TenantContext
from loraplex.platform.errors import InvalidRequestError
from loraplex.platform.schemas import CompletionRequest
from loraplex.platform.schemas.openai_responses import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    Usage,
)
from loraplex.platform.services.generation import GenerationPlan, GenerationRun
from loraplex.platform.services.outputs import (
    DONE,
    TokenLogprobs,
    final_output,
    sse,
    stream_deltas,
    token_logprobs,
    usage_of,
)
from loraplex.platform.services.planning import build_plan, check_text, resolve_adapter
from loraplex.platform.state import AppState


async def plan_completion(
    state: AppState, tenant: TenantContext, body: CompletionRequest
) -> GenerationPlan:
    adapter = await resolve_adapter(state, tenant, body.model)
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        if len(prompt) != 1:
            raise InvalidRequestError(
                "batched prompts are not supported: send one prompt per request", param="prompt"
            )
        prompt = prompt[0]
    if isinstance(prompt, str):
        check_text(prompt, "prompt")
        prompt_token_ids = await state.engine.encode_text(prompt) if prompt else []
    else:
        # Token ids go to the engine as they are: it checks them against its vocabulary.
        prompt_token_ids = list(prompt)  # type: ignore[arg-type]
    return build_plan(
        state,
        tenant,
        body,
        endpoint="completions",
        adapter=adapter,
        prompt_token_ids=prompt_token_ids,
        prompt_param="prompt",
        requested_max_tokens=body.max_tokens,
        logprobs=body.logprobs,
    )


def _logprobs(tokens: list[TokenLogprobs] | None, text_offset: int) -> CompletionLogprobs | None:
    """OpenAI's legacy logprobs: parallel lists, offsets into the choice's text."""
    if tokens is None:
        return None
    result = CompletionLogprobs()
    for t in tokens:
        result.tokens.append(t.token)
        result.token_logprobs.append(t.logprob)
        result.top_logprobs.append(dict(t.top))
        result.text_offset.append(text_offset)
        text_offset += len(t.token)
    return result


async def collect_completion(run: GenerationRun) -> CompletionResponse:
    final = await final_output(run)
    engine = run.state.engine
    choices = [
        CompletionChoice(
            index=o.index,
            text=o.text,
            finish_reason=o.finish_reason,
            logprobs=_logprobs(token_logprobs(engine, o.logprobs), 0),
        )
        for o in final.outputs
    ]
    return _response(run, choices, usage_of(run))


async def stream_completion(run: GenerationRun, include_usage: bool) -> AsyncGenerator[str, None]:
    async with aclosing(stream_deltas(run)) as stream:
        async for deltas in stream:
            if deltas:
                choices = [
                    CompletionChoice(
                        index=d.index,
                        text=d.text,
                        logprobs=_logprobs(d.logprobs, d.text_offset),
                        finish_reason=d.finish_reason,
                    )
                    for d in deltas
                ]
                yield sse(_response(run, choices))
    if include_usage:
        yield sse(_response(run, [], usage_of(run)))
    yield DONE


def _response(
    run: GenerationRun, choices: list[CompletionChoice], usage: Usage | None = None
) -> CompletionResponse:
    plan = run.plan
    return CompletionResponse(
        id=plan.request_id, created=plan.created, model=plan.model, choices=choices, usage=usage
    )

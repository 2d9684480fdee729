"""POST /v1/completions: plan, collect, stream."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing

from loraplex.engine.request import CompletionOutput, RequestOutput
from loraplex.platform.auth import TenantContext
from loraplex.platform.engine_client import EngineClient
from loraplex.platform.errors import InvalidRequestError
from loraplex.platform.schemas import CompletionRequest
from loraplex.platform.schemas.openai_responses import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    PromptTokensDetails,
    Usage,
)
from loraplex.platform.services.generation import GenerationPlan, GenerationRun
from loraplex.platform.services.planning import (
    build_sampling_params,
    check_prompt,
    check_text,
    new_request_id,
    resolve_adapter,
    resolve_max_tokens,
    resolve_priority,
)
from loraplex.platform.services.sse import DONE, sse
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
        prompt_token_ids = list(prompt)  # type: ignore[arg-type]
        vocab_size = state.engine.tokenizer.vocab_size
        if any(not 0 <= t < vocab_size for t in prompt_token_ids):
            raise InvalidRequestError(f"token ids must be in [0, {vocab_size})", param="prompt")
    check_prompt(state, prompt_token_ids, "prompt")
    max_tokens = resolve_max_tokens(state, body.max_tokens, len(prompt_token_ids))
    return GenerationPlan(
        request_id=new_request_id("cmpl"),
        endpoint="completions",
        model=body.model,
        adapter=adapter,
        prompt_token_ids=prompt_token_ids,
        sampling_params=build_sampling_params(body, max_tokens=max_tokens, logprobs=body.logprobs),
        priority=resolve_priority(tenant, body.priority),
    )


def _usage(run: GenerationRun) -> Usage:
    num_prompt = len(run.plan.prompt_token_ids)
    return Usage(
        prompt_tokens=num_prompt,
        completion_tokens=run.num_completion_tokens,
        total_tokens=num_prompt + run.num_completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=run.num_cached_tokens),
    )


def _logprobs(
    engine: EngineClient, output: CompletionOutput, start: int, text_offset: int
) -> CompletionLogprobs | None:
    if output.logprobs is None:
        return None
    result = CompletionLogprobs()
    for sampled, top in output.logprobs[start:]:
        token = engine.token_string(sampled.token_id)
        result.tokens.append(token)
        result.token_logprobs.append(sampled.logprob)
        result.top_logprobs.append({engine.token_string(t.token_id): t.logprob for t in top})
        result.text_offset.append(text_offset)
        text_offset += len(token)
    return result


async def collect_completion(run: GenerationRun) -> CompletionResponse:
    final: RequestOutput | None = None
    async with aclosing(run.outputs()) as outputs:
        async for output in outputs:
            final = output
    assert final is not None and final.finished
    engine = run.state.engine
    choices = [
        CompletionChoice(
            index=o.index,
            text=o.text,
            finish_reason=o.finish_reason,
            logprobs=_logprobs(engine, o, 0, 0),
        )
        for o in final.outputs
    ]
    return CompletionResponse(
        id=run.plan.request_id,
        created=run.plan.created,
        model=run.plan.model,
        choices=choices,
        usage=_usage(run),
    )


async def stream_completion(run: GenerationRun, include_usage: bool) -> AsyncGenerator[str, None]:
    plan, engine = run.plan, run.state.engine
    n = plan.sampling_params.n
    sent_text = [0] * n
    sent_logprobs = [0] * n
    finished = [False] * n
    async with aclosing(run.outputs()) as outputs:
        async for output in outputs:
            choices = []
            for o in output.outputs:
                j = o.index
                if finished[j]:
                    continue
                delta = o.text[sent_text[j] :]
                if not delta and o.finish_reason is None:
                    continue
                logprobs = _logprobs(engine, o, sent_logprobs[j], sent_text[j])
                sent_text[j] = len(o.text)
                sent_logprobs[j] = len(o.logprobs or ())
                finished[j] = o.finish_reason is not None
                choices.append(
                    CompletionChoice(
                        index=j, text=delta, logprobs=logprobs, finish_reason=o.finish_reason
                    )
                )
            if choices:
                yield sse(
                    CompletionResponse(
                        id=plan.request_id, created=plan.created, model=plan.model, choices=choices
                    )
                )
    if include_usage:
        yield sse(
            CompletionResponse(
                id=plan.request_id,
                created=plan.created,
                model=plan.model,
                choices=[],
                usage=_usage(run),
            )
        )
    yield DONE

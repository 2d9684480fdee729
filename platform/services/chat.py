"""POST /v1/chat/completions: plan (chat template), collect, stream."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing

from loraplex.engine.request import MAX_LOGPROBS, CompletionOutput, RequestOutput
from loraplex.engine.tokenizer import ChatTemplateError
from loraplex.platform.auth import TenantContext
from loraplex.platform.engine_client import EngineClient
from loraplex.platform.errors import InvalidRequestError
from loraplex.platform.schemas import ChatCompletionRequest
from loraplex.platform.schemas.openai_responses import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    ChatLogprobs,
    ChatMessageOut,
    PromptTokensDetails,
    TokenLogprob,
    TopLogprob,
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


async def plan_chat(
    state: AppState, tenant: TenantContext, body: ChatCompletionRequest
) -> GenerationPlan:
    if len(body.messages) > state.settings.max_messages:
        raise InvalidRequestError(
            f"at most {state.settings.max_messages} messages", param="messages"
        )
    adapter = await resolve_adapter(state, tenant, body.model)
    messages = []
    for i, message in enumerate(body.messages):
        text = message.text()
        check_text(text, f"messages[{i}].content")
        # Templates know system/user/assistant; OpenAI's "developer" is the new "system".
        role = "system" if message.role == "developer" else message.role
        messages.append({"role": role, "content": text})
    try:
        prompt_token_ids = await state.engine.encode_chat(messages)
    except ChatTemplateError as e:
        raise InvalidRequestError(str(e), param="messages") from e
    check_prompt(state, prompt_token_ids, "messages")
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    max_tokens = resolve_max_tokens(state, body.requested_max_tokens, len(prompt_token_ids), param)
    if body.top_logprobs is not None and not 0 <= body.top_logprobs <= MAX_LOGPROBS:
        raise InvalidRequestError(
            f"top_logprobs must be in [0, {MAX_LOGPROBS}]", param="top_logprobs"
        )
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    return GenerationPlan(
        request_id=new_request_id("chatcmpl"),
        endpoint="chat.completions",
        model=body.model,
        adapter=adapter,
        prompt_token_ids=prompt_token_ids,
        sampling_params=build_sampling_params(body, max_tokens=max_tokens, logprobs=logprobs),
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


def _top(engine: EngineClient, token_id: int, logprob: float) -> TopLogprob:
    token = engine.token_string(token_id)
    return TopLogprob(token=token, logprob=logprob, bytes=list(token.encode("utf-8")))


def _logprobs(engine: EngineClient, output: CompletionOutput, start: int) -> ChatLogprobs | None:
    if output.logprobs is None:
        return None
    content = []
    for sampled, top in output.logprobs[start:]:
        first = _top(engine, sampled.token_id, sampled.logprob)
        content.append(
            TokenLogprob(
                token=first.token,
                logprob=first.logprob,
                bytes=first.bytes,
                top_logprobs=[_top(engine, t.token_id, t.logprob) for t in top],
            )
        )
    return ChatLogprobs(content=content)


async def collect_chat(run: GenerationRun) -> ChatCompletionResponse:
    final: RequestOutput | None = None
    async with aclosing(run.outputs()) as outputs:
        async for output in outputs:
            final = output
    assert final is not None and final.finished
    engine = run.state.engine
    choices = [
        ChatChoice(
            index=o.index,
            message=ChatMessageOut(content=o.text),
            finish_reason=o.finish_reason,
            logprobs=_logprobs(engine, o, 0),
        )
        for o in final.outputs
    ]
    return ChatCompletionResponse(
        id=run.plan.request_id,
        created=run.plan.created,
        model=run.plan.model,
        choices=choices,
        usage=_usage(run),
    )


async def stream_chat(run: GenerationRun, include_usage: bool) -> AsyncGenerator[str, None]:
    plan, engine = run.plan, run.state.engine
    n = plan.sampling_params.n
    sent_role = False

    def chunk(choices: list[ChatChunkChoice], usage: Usage | None = None) -> str:
        return sse(
            ChatCompletionChunk(
                id=plan.request_id,
                created=plan.created,
                model=plan.model,
                choices=choices,
                usage=usage,
            )
        )

    sent_text = [0] * n
    sent_logprobs = [0] * n
    finished = [False] * n
    async with aclosing(run.outputs()) as outputs:
        async for output in outputs:
            if not sent_role:  # the role chunk goes out once the engine accepted the request
                sent_role = True
                yield chunk(
                    [
                        ChatChunkChoice(index=j, delta=ChatDelta(role="assistant", content=""))
                        for j in range(n)
                    ]
                )
            choices = []
            for o in output.outputs:
                j = o.index
                if finished[j]:
                    continue
                delta = o.text[sent_text[j] :]
                if not delta and o.finish_reason is None:
                    continue
                logprobs = _logprobs(engine, o, sent_logprobs[j])
                sent_text[j] = len(o.text)
                sent_logprobs[j] = len(o.logprobs or ())
                finished[j] = o.finish_reason is not None
                choices.append(
                    ChatChunkChoice(
                        index=j,
                        delta=ChatDelta(content=delta) if delta else ChatDelta(),
                        logprobs=logprobs,
                        finish_reason=o.finish_reason,
                    )
                )
            if choices:
                yield chunk(choices)
    if include_usage:
        yield chunk([], _usage(run))
    yield DONE

"""POST /v1/chat/completions: plan (chat template), collect, stream."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing

from loraplex.engine.errors import ChatTemplateError
from loraplex.engine.request import MAX_LOGPROBS
from loraplex.platform.auth import TenantContext
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
    TokenLogprob,
    TopLogprob,
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
    if body.top_logprobs is not None and not 0 <= body.top_logprobs <= MAX_LOGPROBS:
        raise InvalidRequestError(
            f"top_logprobs must be in [0, {MAX_LOGPROBS}]", param="top_logprobs"
        )
    return build_plan(
        state,
        tenant,
        body,
        endpoint="chat.completions",
        adapter=adapter,
        prompt_token_ids=prompt_token_ids,
        prompt_param="messages",
        requested_max_tokens=body.requested_max_tokens,
        max_tokens_param=(
            "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        ),
        logprobs=(body.top_logprobs or 0) if body.logprobs else None,
    )


def _logprobs(tokens: list[TokenLogprobs] | None) -> ChatLogprobs | None:
    if tokens is None:
        return None
    content = [
        TokenLogprob(
            token=t.token,
            logprob=t.logprob,
            bytes=_utf8(t.token),
            top_logprobs=[
                TopLogprob(token=token, logprob=logprob, bytes=_utf8(token))
                for token, logprob in t.top
            ],
        )
        for t in tokens
    ]
    return ChatLogprobs(content=content)


def _utf8(token: str) -> list[int]:
    return list(token.encode("utf-8"))


async def collect_chat(run: GenerationRun) -> ChatCompletionResponse:
    final = await final_output(run)
    engine = run.state.engine
    choices = [
        ChatChoice(
            index=o.index,
            message=ChatMessageOut(content=o.text),
            finish_reason=o.finish_reason,
            logprobs=_logprobs(token_logprobs(engine, o.logprobs)),
        )
        for o in final.outputs
    ]
    plan = run.plan
    return ChatCompletionResponse(
        id=plan.request_id,
        created=plan.created,
        model=plan.model,
        choices=choices,
        usage=usage_of(run),
    )


async def stream_chat(run: GenerationRun, include_usage: bool) -> AsyncGenerator[str, None]:
    plan = run.plan
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

    async with aclosing(stream_deltas(run)) as stream:
        async for deltas in stream:
            if not sent_role:  # the role chunk goes out once the engine accepted the request
                sent_role = True
                role = ChatDelta(role="assistant", content="")
                yield chunk(
                    [ChatChunkChoice(index=j, delta=role) for j in range(plan.sampling_params.n)]
                )
            if deltas:
                yield chunk(
                    [
                        ChatChunkChoice(
                            index=d.index,
                            delta=ChatDelta(content=d.text) if d.text else ChatDelta(),
                            logprobs=_logprobs(d.logprobs),
                            finish_reason=d.finish_reason,
                        )
                        for d in deltas
                    ]
                )
    if include_usage:
        yield chunk([], usage_of(run))
    yield DONE

"""What completions and chat completions share after admission: one run's engine outputs
(deltas) as whole choices or as per-choice deltas, their logprobs as token strings, the usage block and
the SSE framing. Each endpoint only puts these into its own OpenAI schema family.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass

from pydantic import BaseModel

from loraplex.engine.request import Logprob, RequestOutput, join_output
from loraplex.platform.engine_client import EngineClient
from loraplex.platform.schemas.openai_responses import PromptTokensDetails, Usage
from loraplex.platform.services.generation import GenerationRun

DONE = "data: [DONE]\n\n"


def sse(payload: BaseModel) -> str:
    """One server-sent event as OpenAI streams them: `data: {json}\\n\\n`."""
    return f"data: {payload.model_dump_json()}\n\n"


@dataclass(frozen=True)
class TokenLogprobs:
    """One generated token's logprob and its top alternatives, as text."""

    token: str
    logprob: float
    top: list[tuple[str, float]]


@dataclass(frozen=True)
class ChoiceDelta:
    """What one choice added since the previous event."""

    index: int
    text: str
    text_offset: int  # where `text` starts in the choice's whole text
    logprobs: list[TokenLogprobs] | None  # of the new tokens; None unless requested
    finish_reason: str | None


def token_logprobs(
    engine: EngineClient, logprobs: list[tuple[Logprob, list[Logprob]]] | None
) -> list[TokenLogprobs] | None:
    """A completion's logprobs (`CompletionOutput.logprobs`) as text; None when not requested."""
    if logprobs is None:
        return None
    return [
        TokenLogprobs(
            token=engine.token_string(sampled.token_id),
            logprob=sampled.logprob,
            top=[(engine.token_string(t.token_id), t.logprob) for t in top],
        )
        for sampled, top in logprobs
    ]


def usage_of(run: GenerationRun) -> Usage:
    """The usage block: prompt and completion tokens, and the prompt tokens the cache served."""
    num_prompt = len(run.plan.prompt_token_ids)
    return Usage(
        prompt_tokens=num_prompt,
        completion_tokens=run.num_completion_tokens,
        total_tokens=num_prompt + run.num_completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=run.num_cached_tokens),
    )


async def final_output(run: GenerationRun) -> RequestOutput:
    """Run to the end; the whole output (the deltas joined). Not streamed: woken for the first
    output and the last, not at every step."""
    final: RequestOutput | None = None
    async with aclosing(run.outputs(stream=False)) as outputs:
        async for output in outputs:
            final = output if final is None else join_output(final, output)
    assert final is not None and final.finished
    return final


async def stream_deltas(run: GenerationRun) -> AsyncGenerator[list[ChoiceDelta], None]:
    """Per engine output, the choices that changed (new text, or their finish). The list may
    be empty: the first one still says the engine accepted the request."""
    n = run.plan.sampling_params.n
    engine = run.state.engine
    sent_text = [0] * n
    finished = [False] * n
    # Logprobs of tokens whose text is still held back (a possible stop string, a partial
    # character): they go out with the event that carries that text.
    held: list[list[tuple[Logprob, list[Logprob]]]] = [[] for _ in range(n)]
    async with aclosing(run.outputs()) as outputs:
        async for output in outputs:
            deltas = []
            for o in output.outputs:
                j = o.index
                if finished[j]:
                    continue
                held[j].extend(o.logprobs or ())
                if not o.text and o.finish_reason is None:
                    continue
                logprobs = None if o.logprobs is None else held[j]
                held[j] = []
                deltas.append(
                    ChoiceDelta(
                        index=j,
                        text=o.text,
                        text_offset=sent_text[j],
                        logprobs=token_logprobs(engine, logprobs),
                        finish_reason=o.finish_reason,
                    )
                )
                sent_text[j] += len(o.text)
                finished[j] = o.finish_reason is not None
            yield deltas

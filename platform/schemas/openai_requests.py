"""OpenAI protocol request bodies (completions, chat completions).

Types are strict (no "5" for 5, no true for 1) and non-finite floats are rejected. Unknown fields
are ignored, as the OpenAI API does for forward compatibility; fields we know but do not support
(tools, logit_bias, echo, suffix, ...) are rejected when set, rather than silently dropped.
Every number carries its documented range, so the OpenAPI schema states it and no value a
client can send reaches code that cannot hold it; the engine's `SamplingParams` checks the
relations between fields (min_tokens <= max_tokens, ...), the planner the model's context.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, model_validator

from loraplex.engine.request import MAX_LOGPROBS, MAX_N

Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict()]

MAX_INT32 = 2**31 - 1  # token ids, token counts: far beyond any vocabulary or context
MAX_LIST = 1 << 20  # token-id prompts; the real cap is max_prompt_tokens, checked later
MAX_STOP_ITEMS = 1024  # SamplingParams allows far fewer; this only bounds parsing work
MAX_PRIORITY = 1000

TokenId = Annotated[int, Strict(), Field(ge=0, le=MAX_INT32)]
TokenCount = Annotated[int, Strict(), Field(ge=1, le=MAX_INT32)]
Logprobs = Annotated[int, Strict(), Field(ge=0, le=MAX_LOGPROBS)]
Penalty = Annotated[float, Strict(), Field(ge=-2.0, le=2.0)]


class _OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class StreamOptions(_OpenAIModel):
    include_usage: Bool = False


class SamplingFields(_OpenAIModel):
    """Fields shared by both endpoints (OpenAI's plus vLLM's extras)."""

    model: Annotated[str, Strict(), Field(min_length=1, max_length=256)]
    temperature: Annotated[float, Strict(), Field(ge=0.0, le=100.0)] | None = None
    top_p: Annotated[float, Strict(), Field(gt=0.0, le=1.0)] | None = None
    n: Annotated[int, Strict(), Field(ge=1, le=MAX_N)] = 1
    stream: Bool = False
    stream_options: StreamOptions | None = None
    stop: Str | Annotated[list[Str], Field(max_length=MAX_STOP_ITEMS)] | None = None
    seed: Annotated[int, Strict(), Field(ge=0, le=2**63 - 1)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    user: Annotated[str, Field(max_length=256)] | None = None
    # Extensions (vLLM names)
    top_k: Annotated[int, Strict(), Field(ge=-1, le=MAX_INT32)] | None = None  # -1: off
    min_p: Annotated[float, Strict(), Field(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Strict(), Field(gt=0.0, le=2.0)] | None = None
    ignore_eos: Bool = False
    min_tokens: Annotated[int, Strict(), Field(ge=0, le=MAX_INT32)] = 0
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_ITEMS)] | None = None
    # Engine priority; may only be less urgent than the tenant's tier.
    priority: Annotated[int, Strict(), Field(ge=0, le=MAX_PRIORITY)] | None = None
    # Known, unsupported: rejected when set.
    logit_bias: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _reject_unsupported(self) -> SamplingFields:
        if self.logit_bias:
            raise ValueError("logit_bias is not supported")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self

    @property
    def include_usage(self) -> bool:
        """A stream ends with a usage chunk (`stream_options.include_usage`)."""
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(SamplingFields):
    # The OpenAPI example; `api/openapi.py` names the served model in it.
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"model": "MODEL", "prompt": "The capital of France is", "max_tokens": 8}]
        }
    )

    # A string or token ids; a list holding exactly one of those is accepted too.
    prompt: (
        Str
        | Annotated[list[TokenId], Field(max_length=MAX_LIST)]
        | list[Str]
        | list[Annotated[list[TokenId], Field(max_length=MAX_LIST)]]
    )
    max_tokens: TokenCount | None = 16
    logprobs: Logprobs | None = None
    echo: Bool = False
    suffix: Str | None = None
    best_of: Annotated[int, Strict(), Field(ge=1, le=MAX_N)] | None = None

    @model_validator(mode="after")
    def _check_completion(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("echo is not supported")
        if self.suffix:
            raise ValueError("suffix is not supported")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of other than n is not supported")
        return self


class TextContentPart(_OpenAIModel):
    type: Literal["text"]
    text: Str


class ChatMessage(_OpenAIModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: Str | Annotated[list[TextContentPart], Field(max_length=1024)] | None = None
    name: Annotated[str, Field(max_length=64)] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "model": "MODEL",
                    "messages": [{"role": "user", "content": "What is the capital of France?"}],
                    "max_completion_tokens": 16,
                    "temperature": 0,
                }
            ]
        }
    )

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: TokenCount | None = None
    max_completion_tokens: TokenCount | None = None
    logprobs: Bool = False
    top_logprobs: Logprobs | None = None
    # Known, unsupported: rejected when set.
    tools: list[Any] | None = None
    tool_choice: Any | None = None
    functions: list[Any] | None = None
    response_format: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check_chat(self) -> ChatCompletionRequest:
        if self.tools or self.functions or self.tool_choice not in (None, "none"):
            raise ValueError("tools and functions are not supported")
        if self.response_format and self.response_format.get("type") != "text":
            raise ValueError("only response_format {'type': 'text'} is supported")
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    @property
    def requested_max_tokens(self) -> int | None:
        return (
            self.max_completion_tokens
            if self.max_completion_tokens is not None
            else self.max_tokens
        )

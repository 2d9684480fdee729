"""OpenAI protocol request bodies (completions, chat completions).

Types are strict (no "5" for 5, no true for 1) and non-finite floats are rejected. Unknown fields
are ignored, as the OpenAI API does for forward compatibility; fields we know but do not support
(tools, logit_bias, echo, suffix, ...) are rejected when set, rather than silently dropped.
Value ranges are checked once, by the engine's `SamplingParams`; only sizes are capped here so
that a body cannot make us do much work before that check.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, model_validator

Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict()]

MAX_LIST = 1 << 20  # token-id prompts; the real cap is max_prompt_tokens, checked later
MAX_STOP_ITEMS = 1024  # SamplingParams allows far fewer; this only bounds parsing work


class _OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class StreamOptions(_OpenAIModel):
    include_usage: Bool = False


class SamplingFields(_OpenAIModel):
    """Fields shared by both endpoints (OpenAI's plus vLLM's extras)."""

    model: Annotated[str, Strict(), Field(min_length=1, max_length=256)]
    temperature: Float | None = None
    top_p: Float | None = None
    n: Int = 1
    stream: Bool = False
    stream_options: StreamOptions | None = None
    stop: Str | Annotated[list[Str], Field(max_length=MAX_STOP_ITEMS)] | None = None
    seed: Int | None = None
    presence_penalty: Float | None = None
    frequency_penalty: Float | None = None
    user: Annotated[str, Field(max_length=256)] | None = None
    # Extensions (vLLM names)
    top_k: Int | None = None
    min_p: Float | None = None
    repetition_penalty: Float | None = None
    ignore_eos: Bool = False
    min_tokens: Int = 0
    stop_token_ids: Annotated[list[Int], Field(max_length=MAX_STOP_ITEMS)] | None = None
    priority: Int | None = None  # engine priority; may only be less urgent than the tier
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
    # A string or token ids; a list holding exactly one of those is accepted too.
    prompt: (
        Str
        | Annotated[list[Int], Field(max_length=MAX_LIST)]
        | list[Str]
        | list[Annotated[list[Int], Field(max_length=MAX_LIST)]]
    )
    max_tokens: Int | None = 16
    logprobs: Int | None = None
    echo: Bool = False
    suffix: Str | None = None
    best_of: Int | None = None

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
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Int | None = None
    max_completion_tokens: Int | None = None
    logprobs: Bool = False
    top_logprobs: Int | None = None
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

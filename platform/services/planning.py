"""From a validated OpenAI body to a `GenerationPlan`: model resolution, prompt checks, the
max_tokens budget, sampling parameters and the engine priority. Shared by both endpoints: each
resolves its adapter, tokenizes its prompt (through the EngineClient), then calls `build_plan`."""

from __future__ import annotations

import secrets
from typing import Any

from loraplex.engine.request import SamplingParams
from loraplex.platform.auth import TenantContext
from loraplex.platform.crud import AdapterRef, resolve_model
from loraplex.platform.errors import ContextLengthExceededError, InvalidRequestError
from loraplex.platform.registry_cache import ModelEntry
from loraplex.platform.schemas.openai_requests import MAX_PRIORITY, SamplingFields
from loraplex.platform.services.generation import GenerationPlan
from loraplex.platform.state import AppState
from loraplex.platform.usage import Endpoint

_OPTIONAL_SAMPLING = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)
_ID_PREFIXES: dict[Endpoint, str] = {"completions": "cmpl", "chat.completions": "chatcmpl"}


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def check_text(text: str, param: str) -> None:
    """Refuse strings that are not valid Unicode text (lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidRequestError(
            "must be valid UTF-8 text (no lone surrogates)", param=param
        ) from e


async def resolve_adapter(state: AppState, tenant: TenantContext, model: str) -> AdapterRef | None:
    """None for the base model; the tenant's (own or granted) adapter, from the registry cache
    or the database; else 404."""
    base = state.engine.model_name
    if model == base:
        return None

    def lookup() -> AdapterRef | None:
        with state.db.session() as session:
            return resolve_model(session, tenant.tenant_id, model, base)

    return await state.registry_cache.load_adapter(ModelEntry(tenant.tenant_id, model), lookup)


def check_prompt(state: AppState, prompt_token_ids: list[int], param: str) -> None:
    if not prompt_token_ids:
        raise InvalidRequestError("the prompt is empty", param=param)
    max_model_len = state.engine.max_model_len
    limit = min(state.settings.max_prompt_tokens or max_model_len - 1, max_model_len - 1)
    if len(prompt_token_ids) > limit:
        raise ContextLengthExceededError(
            f"This model's maximum context length is {max_model_len} tokens and prompts may "
            f"have at most {limit}; your prompt has {len(prompt_token_ids)} tokens.",
            param=param,
        )


def resolve_max_tokens(
    state: AppState, requested: int | None, num_prompt_tokens: int, param: str = "max_tokens"
) -> int:
    """The completion budget: as requested (capped), or what the context leaves."""
    max_model_len = state.engine.max_model_len
    cap = state.settings.max_completion_tokens
    room = max_model_len - num_prompt_tokens
    if requested is None:
        return max(1, min(room, cap))
    if requested < 1:
        raise InvalidRequestError(f"{param} must be an integer >= 1", param=param)
    if requested > cap:
        raise InvalidRequestError(f"{param} must be at most {cap}", param=param)
    if requested > room:
        raise ContextLengthExceededError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {num_prompt_tokens + requested} tokens ({num_prompt_tokens} in the "
            f"prompt, {requested} for the completion).",
            param=param,
        )
    return requested


def resolve_priority(tenant: TenantContext, requested: int | None) -> int:
    """The tenant's tier, or a *less* urgent value the client asked for (never more urgent)."""
    tier = tenant.tier.engine_priority
    if requested is None:
        return tier
    if not 0 <= requested <= MAX_PRIORITY:
        raise InvalidRequestError(f"priority must be in [0, {MAX_PRIORITY}]", param="priority")
    return max(tier, requested)


def build_plan(
    state: AppState,
    tenant: TenantContext,
    body: SamplingFields,
    *,
    endpoint: Endpoint,
    adapter: AdapterRef | None,
    prompt_token_ids: list[int],
    prompt_param: str,
    requested_max_tokens: int | None,
    max_tokens_param: str = "max_tokens",
    logprobs: int | None,
) -> GenerationPlan:
    """The plan of a tokenized request: the prompt and the completion budget checked against
    the context, the sampling parameters validated, the priority resolved; 400 otherwise."""
    check_prompt(state, prompt_token_ids, prompt_param)
    max_tokens = resolve_max_tokens(
        state, requested_max_tokens, len(prompt_token_ids), max_tokens_param
    )
    given = requested_max_tokens is not None
    return GenerationPlan(
        request_id=new_request_id(_ID_PREFIXES[endpoint]),
        endpoint=endpoint,
        model=body.model,
        adapter=adapter,
        prompt_token_ids=prompt_token_ids,
        sampling_params=build_sampling_params(body, max_tokens=max_tokens, logprobs=logprobs),
        priority=resolve_priority(tenant, body.priority),
        reserved_completion_tokens=(
            max_tokens if given else min(max_tokens, state.settings.reserved_completion_tokens)
        ),
        max_tokens_given=given,
        budget_param=max_tokens_param if given else prompt_param,
    )


def build_sampling_params(
    body: SamplingFields, *, max_tokens: int, logprobs: int | None
) -> SamplingParams:
    """Raises the engine's InvalidParameterError (mapped to 400 with `param`) on bad values."""
    stop = body.stop
    for i, s in enumerate([stop] if isinstance(stop, str) else stop or []):
        check_text(s, f"stop[{i}]" if not isinstance(stop, str) else "stop")
    kwargs: dict[str, Any] = {
        "max_tokens": max_tokens,
        "n": body.n,
        "stop": stop,
        "stop_token_ids": body.stop_token_ids,
        "seed": body.seed,
        "logprobs": logprobs,
        "ignore_eos": body.ignore_eos,
        "min_tokens": body.min_tokens,
    }
    for name in _OPTIONAL_SAMPLING:
        value = getattr(body, name)
        if value is not None:
            kwargs[name] = value
    return SamplingParams(**kwargs)

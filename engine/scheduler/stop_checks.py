"""When a request ends: on a sampled token (EOS, a stop id, max_tokens, the context's end), or
before its next step is scheduled (async scheduling: the tokens in flight reach the limit)."""

from __future__ import annotations

from loraplex.engine.request import Request, RequestStatus


def check_stop(request: Request, token_id: int, max_model_len: int) -> RequestStatus | None:
    """The status `token_id` (just appended to the request's outputs) ends it with, if any."""
    params = request.sampling_params
    if request.num_output_tokens >= params.min_tokens:
        if not params.ignore_eos and token_id in request.eos_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if token_id in params.stop_token_ids:
            return RequestStatus.FINISHED_STOPPED
    if request.num_output_tokens >= params.max_tokens:
        return RequestStatus.FINISHED_LENGTH
    if request.num_tokens >= max_model_len:
        return RequestStatus.FINISHED_LENGTH
    return None


def reaches_length_limit(request: Request, max_model_len: int) -> bool:
    """Whether the tokens steps in flight sample take the request to max_tokens or the
    context's end (never true without placeholders: then the last step's check ended it)."""
    if not request.num_output_placeholders:
        return False
    num_outputs = request.num_output_tokens + request.num_output_placeholders
    return (
        num_outputs >= request.sampling_params.max_tokens
        or request.num_tokens_with_placeholders >= max_model_len
    )

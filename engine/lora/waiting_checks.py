"""Waiting requests that can never run because of their adapter.

Two reasons, found each step by `LLMEngine`: the adapter failed to load (or was deleted while
the request waited), or the request could never fit the KV cache beside the adapter's pages.
The requests are returned with `error` set; the engine finishes them (nobody else is affected).
"""

from __future__ import annotations

from collections.abc import Iterable

from loraplex.engine.errors import AdapterRemovedError, InvalidAdapterError, RequestTooLongError
from loraplex.engine.kv_cache.kv_cache_manager import cdiv
from loraplex.engine.lora.lora_manager import LoRAManager
from loraplex.engine.request import LoRARequest, Request


def failed_adapter_requests(
    waiting: Iterable[Request],
    load_failures: dict[str, str],
    lora_manager: LoRAManager,
    num_blocks: int,
    block_size: int,
    max_model_len: int,
) -> list[Request]:
    """The waiting requests to fail, each with its `error` set. `load_failures`: reason by
    adapter content hash (LoRAManager.poll)."""
    failed = []
    for request in waiting:
        lora = request.lora_request
        if lora is None:
            continue
        if lora.content_hash in load_failures:
            request.error = _load_failure(lora_manager, lora, load_failures[lora.content_hash])
        elif request.fits_beside_adapter:
            continue
        else:
            error = _check_fit(request, lora_manager, num_blocks, block_size, max_model_len)
            if error is None:
                continue
            request.error = error
        failed.append(request)
    return failed


def _load_failure(lora_manager: LoRAManager, lora: LoRARequest, reason: str) -> Exception:
    if lora_manager.is_registered(lora):
        return InvalidAdapterError(f"adapter {lora.lora_name!r} failed to load: {reason}")
    # Removed while the request waited, its files deleted with it (the platform's delete).
    return AdapterRemovedError(
        f"adapter {lora.lora_name!r} was deleted before this request could load it"
    )


def _check_fit(
    request: Request,
    lora_manager: LoRAManager,
    num_blocks: int,
    block_size: int,
    max_model_len: int,
) -> RequestTooLongError | None:
    """Whether the request could ever fit the KV cache beside its adapter's pages; checked
    once, when the adapter's size is first known (a long queue costs little per step)."""
    assert request.lora_request is not None
    adapter_blocks = lora_manager.adapter_blocks(request.lora_request)
    if adapter_blocks is None:
        return None  # not loaded yet: checked again next step
    max_len = request.num_prompt_tokens + request.sampling_params.max_tokens
    need = adapter_blocks + cdiv(min(max_len, max_model_len), block_size)
    if need <= num_blocks:
        request.fits_beside_adapter = True
        return None
    return RequestTooLongError(
        f"with adapter {request.lora_request.lora_name!r} ({adapter_blocks} KV blocks of "
        f"weights) this request needs {need} KV blocks; the cache has {num_blocks}",
        param="max_tokens",
    )

"""The life of one inference request after validation: admission, the engine stream, and the
accounting at the end (rate-limit refund, usage record, metrics) — exactly once, whether the
request finishes, fails, or is cancelled by a client disconnect.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field, replace

import anyio
import anyio.lowlevel

from loraplex.engine.request import RequestOutput, SamplingParams
from loraplex.platform.auth import TenantContext
from loraplex.platform.crud import AdapterRef
from loraplex.platform.engine_stream import StreamTotals
from loraplex.platform.errors import (
    EngineFailureError,
    EngineOverloadedError,
    RateLimitedError,
    RequestTooLargeError,
    ServiceUnavailableError,
)
from loraplex.platform.ratelimit import RateLimitDecision, rate_limit_headers
from loraplex.platform.state import AppState
from loraplex.platform.token_times import TokenTimes
from loraplex.platform.usage import Endpoint, RequestStatus, UsageEvent

logger = logging.getLogger(__name__)


# Tokens beyond a request's reservation are charged in steps of this many (fewer limiter calls).
CHARGE_STEP = 64


@dataclass(frozen=True)
class GenerationPlan:
    """Everything decided before admission."""

    request_id: str  # the engine's id and the response's `id`
    endpoint: Endpoint
    model: str  # as the client named it
    adapter: AdapterRef | None
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    priority: int
    # Per choice: held at admission (max_tokens, or an estimate when the client left it out).
    reserved_completion_tokens: int
    max_tokens_given: bool  # the client chose max_tokens: it must fit the limits in full
    budget_param: str | None = None  # the field to blame when it cannot fit
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def reserved_tokens(self) -> int:
        """Held against tokens per minute at admission."""
        return len(self.prompt_token_ids) + self.sampling_params.n * self.reserved_completion_tokens

    @property
    def least_tokens(self) -> int:
        """The fewest tokens the request can cost, as asked."""
        per_choice = self.sampling_params.max_tokens if self.max_tokens_given else 1
        return len(self.prompt_token_ids) + self.sampling_params.n * per_choice


async def admit(state: AppState, tenant: TenantContext, plan: GenerationPlan) -> GenerationRun:
    """Reserve the tenant's limits for `plan`; 429 / 503 when it must wait, 400 when no wait
    can make it fit."""
    try:
        state.engine.check_admission()
    except EngineOverloadedError:
        state.metrics.observe_rate_limited(tenant.name, "engine_overloaded")
        raise
    tokens = plan.reserved_tokens
    tpm = tenant.limits.tokens_per_minute
    if tpm is not None:
        if plan.least_tokens > tpm:
            raise RequestTooLargeError(
                f"This request needs at least {plan.least_tokens} tokens "
                f"({len(plan.prompt_token_ids)} in the prompt, the rest to generate) and this "
                f"tenant's limit is {tpm} tokens per minute: no retry can succeed; shorten the "
                "prompt or lower max_tokens.",
                param=plan.budget_param,
            )
        tokens = min(tokens, tpm)  # an estimate larger than the bucket: hold the bucket
    # Shielded: a client that leaves now must not strand a reservation the limiter has taken.
    # The run is built in the same scope, and the caller settles it on any exit.
    with anyio.CancelScope(shield=True):
        decision = await state.limiter.acquire(str(tenant.tenant_id), tenant.limits, tokens)
        if decision.allowed:
            return GenerationRun(state, tenant, plan, decision)
    kind = decision.kind or "requests"
    if decision.exceeds_capacity:  # a limit of 0
        raise RequestTooLargeError(f"this tenant's {kind} limit admits no request")
    state.metrics.observe_rate_limited(tenant.name, kind)
    raise RateLimitedError(
        f"Rate limit reached for {kind}: retry after the time in retry-after.",
        kind=kind,
        retry_after_s=decision.retry_after_s or 1.0,
        headers=rate_limit_headers(decision),
    )


class GenerationRun:
    """One admitted request. Iterate `outputs()` once; `finish` runs exactly once after it."""

    def __init__(
        self,
        state: AppState,
        tenant: TenantContext,
        plan: GenerationPlan,
        decision: RateLimitDecision,
    ) -> None:
        self.state = state
        self.tenant = tenant
        self.plan = plan
        self.reservation = decision.reservation  # grows as tokens beyond it are charged
        self.headers = rate_limit_headers(decision)
        self.started = time.monotonic()
        self.num_completion_tokens = 0
        self.num_cached_tokens = 0
        self._token_times = TokenTimes()
        self._finished = False
        state.metrics.request_started(tenant.name)

    async def outputs(self, stream: bool = True) -> AsyncGenerator[RequestOutput, None]:
        """The engine's delta outputs (`outputs.py` puts them together); without `stream`, the
        first and then the rest in one (a consumer that only joins them is not woken per step;
        the first still times the first token). However the consumer leaves (done, failed, or
        cancelled by a client disconnect at any point), the engine request is ended and the run
        settled with the engine's own final counts."""
        status: RequestStatus | None = None  # stays None if cancelled or the consumer leaves
        # A client that left while admission was shielded has cancelled this task already, but
        # nothing has delivered it yet: deliver it here, before the request reaches the engine
        # (generate() starts the engine's work at once, and its abort would race the steps).
        # The caller settles the run on this exit, as on any other.
        await anyio.lowlevel.checkpoint_if_cancelled()
        engine_stream = self.state.engine.generate(
            request_id=self.plan.request_id,
            prompt_token_ids=self.plan.prompt_token_ids,
            sampling_params=self.plan.sampling_params,
            adapter=self.plan.adapter,
            priority=self.plan.priority,
            tenant_key=str(self.tenant.tenant_id),
            stream=stream,
        )
        try:
            async for output in engine_stream:
                self._count(engine_stream.totals)
                self._token_times.observe(self.num_completion_tokens)
                await self._charge_tokens()
                if output.finished:
                    status = _status_of(engine_stream.totals)
                    _raise_if_failed(engine_stream.totals)
                yield output
        except Exception:
            status = status or "error"
            raise
        finally:
            # Shielded: on a client disconnect this runs inside a cancelled scope, and the
            # abort, the refund, the usage row and the metrics must not be lost with it.
            with anyio.CancelScope(shield=True):
                self._count(await engine_stream.close())
                await self.finish(status or "aborted")

    def _count(self, totals: StreamTotals) -> None:
        """Token counts as the engine has sent them so far."""
        self.num_completion_tokens = totals.num_completion_tokens
        self.num_cached_tokens = totals.num_cached_tokens

    async def _charge_tokens(self) -> None:
        """Settle as it streams (at each read: every step of a stream, the first output and the
        last of a non-streamed request): tokens beyond the reservation are taken from the
        tenant's bucket now (debt allowed), so its other requests see them at once."""
        reservation = self.reservation
        if reservation is None or reservation.tokens_per_minute is None:
            return
        excess = len(self.plan.prompt_token_ids) + self.num_completion_tokens - reservation.tokens
        if excess <= 0:
            return
        tokens = -(-excess // CHARGE_STEP) * CHARGE_STEP
        # Shielded: a charge applied but not recorded here would be charged twice at release.
        with anyio.CancelScope(shield=True):
            try:
                charged = await self.state.limiter.charge(reservation, tokens)
            except Exception:  # best effort: the release settles whatever is left
                logger.exception("rate-limit charge failed for %s", self.plan.request_id)
                return
        if charged:
            self.reservation = replace(reservation, tokens=reservation.tokens + tokens)

    async def finish(self, status: RequestStatus) -> None:
        if self._finished:
            return
        self._finished = True
        plan, tenant, state = self.plan, self.tenant, self.state
        num_prompt = len(plan.prompt_token_ids)
        elapsed = time.monotonic() - self.started
        reservation = self.reservation
        try:
            if reservation is not None:
                await state.limiter.release(reservation, num_prompt + self.num_completion_tokens)
        except Exception:
            logger.exception("rate-limit release failed for %s", plan.request_id)
        usage = UsageEvent(
            request_id=plan.request_id,
            tenant_id=tenant.tenant_id,
            api_key_id=tenant.api_key_id,
            adapter_id=plan.adapter.adapter_id if plan.adapter else None,
            model=plan.model,
            endpoint=plan.endpoint,
            prompt_tokens=num_prompt,
            completion_tokens=self.num_completion_tokens,
            latency_ms=int(elapsed * 1000),
            status=status,
        )
        if status == "aborted":  # nobody waits for this answer
            state.usage.record(usage)
        else:  # the client sees the end only once its usage row is committed
            await state.usage.write(usage)
        state.metrics.request_finished(tenant.name)
        first_token_at = self._token_times.first_token_at
        ttft = None if first_token_at is None else first_token_at - self.started
        state.metrics.observe_request(
            tenant.name,
            plan.model,  # the adapter's name, or the base model's
            status,
            prompt_tokens=num_prompt,
            completion_tokens=self.num_completion_tokens,
            ttft_s=ttft,
            e2e_s=elapsed,
            inter_token_s=self._token_times.gaps,
        )


def _status_of(totals: StreamTotals) -> RequestStatus:
    reasons = set(totals.finish_reasons.values())
    if "error" in reasons:
        return "error"
    if "abort" in reasons:
        return "aborted"
    return "ok"


def _raise_if_failed(totals: StreamTotals) -> None:
    """A request the engine failed or aborted (shutdown) must not look like a success."""
    reasons = set(totals.finish_reasons.values())
    if "error" in reasons:
        raise EngineFailureError("the engine failed while generating this request")
    if "abort" in reasons:
        raise ServiceUnavailableError("the request was aborted (the server is shutting down)")

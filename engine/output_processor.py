"""Turns finished steps into user-facing outputs: detokenization, stop strings, n > 1.

A user request with `n` completions runs as `n` engine requests ("children"); this module
gathers them back into one `RequestOutput`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loraplex.engine.request import CompletionOutput, Logprob, Request, RequestOutput
from loraplex.engine.tokenizer import IncrementalDetokenizer, Tokenizer, find_stop_string


@dataclass
class _Completion:
    request: Request
    detokenizer: IncrementalDetokenizer
    text: str = ""
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: list[tuple[Logprob, list[Logprob]]] | None = None


@dataclass
class _UserRequest:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    completions: list[_Completion] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return all(c.finish_reason is not None for c in self.completions)


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._users: dict[str, _UserRequest] = {}
        self._child_to_user: dict[str, tuple[str, int]] = {}

    def add(self, request_id: str, prompt: str | None, children: list[Request]) -> None:
        user = _UserRequest(request_id, prompt, children[0].prompt_token_ids)
        for index, child in enumerate(children):
            detokenizer = IncrementalDetokenizer(self.tokenizer, child.prompt_token_ids)
            logprobs: list[tuple[Logprob, list[Logprob]]] | None = (
                [] if child.sampling_params.logprobs is not None else None
            )
            user.completions.append(_Completion(child, detokenizer, logprobs=logprobs))
            self._child_to_user[child.request_id] = (request_id, index)
        self._users[request_id] = user

    def child_ids(self, request_id: str) -> list[str]:
        user = self._users.get(request_id)
        return [c.request.request_id for c in user.completions] if user else []

    def has(self, request_id: str) -> bool:
        return request_id in self._users

    def process(
        self, updated: list[Request], logprobs: dict[str, tuple[Logprob, list[Logprob]]]
    ) -> tuple[list[RequestOutput], list[str]]:
        """Outputs for users whose completions advanced, and child ids a stop string ended."""
        stopped: list[str] = []
        touched: dict[str, _UserRequest] = {}
        for request in updated:
            user_id, index = self._child_to_user[request.request_id]
            user = self._users[user_id]
            completion = user.completions[index]
            if completion.logprobs is not None and request.request_id in logprobs:
                completion.logprobs.append(logprobs[request.request_id])
            if self._advance(completion):
                stopped.append(request.request_id)
            touched[user_id] = user
        return [self._output(user) for user in touched.values()], stopped

    def finish(self, child_ids: list[str], finish_reason: str) -> list[RequestOutput]:
        """Mark children ended from outside a step (abort, error)."""
        touched: dict[str, _UserRequest] = {}
        for child_id in child_ids:
            if child_id not in self._child_to_user:
                continue
            user_id, index = self._child_to_user[child_id]
            user = self._users[user_id]
            completion = user.completions[index]
            if completion.finish_reason is None:
                completion.finish_reason = finish_reason
            touched[user_id] = user
        return [self._output(user) for user in touched.values()]

    def _advance(self, completion: _Completion) -> bool:
        """Detokenize the new token; True if a stop string ended the completion here."""
        request = completion.request
        if not request.sampling_params.detokenize:
            if request.is_finished:
                completion.finish_reason = request.status.finish_reason
            return False
        delta = completion.detokenizer.append(request.output_token_ids[-1:])
        completion.text += delta
        stops = request.sampling_params.stop
        cut = find_stop_string(completion.text, len(delta), stops) if stops else None
        if cut is not None:
            matched = next(s for s in stops if completion.text[cut:].startswith(s))
            completion.text = completion.text[:cut]
            completion.finish_reason = "stop"
            completion.stop_reason = matched
            return not request.is_finished
        if request.is_finished:
            completion.text += completion.detokenizer.flush()
            completion.finish_reason = request.status.finish_reason
            token = request.output_token_ids[-1]
            if token in request.sampling_params.stop_token_ids:
                completion.stop_reason = token
        return False

    def _output(self, user: _UserRequest) -> RequestOutput:
        outputs = []
        for index, c in enumerate(user.completions):
            text = c.text
            if c.finish_reason is None:
                text = text[: len(text) - self._holdback(c)]
            outputs.append(
                CompletionOutput(
                    index=index,
                    text=text,
                    token_ids=list(c.request.output_token_ids),
                    finish_reason=c.finish_reason,
                    logprobs=c.logprobs,
                    stop_reason=c.stop_reason,
                )
            )
        finished = user.finished
        if finished:
            self._forget(user)
        return RequestOutput(
            request_id=user.request_id,
            prompt=user.prompt,
            prompt_token_ids=user.prompt_token_ids,
            outputs=outputs,
            finished=finished,
            num_cached_tokens=user.completions[0].request.num_cached_tokens,
            error=next((c.request.error for c in user.completions if c.request.error), None),
        )

    @staticmethod
    def _holdback(completion: _Completion) -> int:
        # Hold back what could be the start of a stop string, so streamed text never has to
        # be taken back.
        stops = completion.request.sampling_params.stop
        return max((len(s) - 1 for s in stops), default=0)

    def _forget(self, user: _UserRequest) -> None:
        del self._users[user.request_id]
        for c in user.completions:
            self._child_to_user.pop(c.request.request_id, None)

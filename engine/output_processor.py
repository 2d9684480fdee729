"""Turns finished steps into user-facing outputs: detokenization, stop strings, n > 1.

A user request with `n` completions runs as `n` engine requests ("children"); this module
gathers them back into one `RequestOutput`.

Detokenizing is about half the host's work after a step. Only two things a step decides depend on
the text: whether a stop string ended a completion, and the text of a finished one. A user
request that has no stop strings and none of whose completions finished this step is
*deferred*: its new tokens are detokenized by `flush`, which the engine calls while the next
step's forward runs on the GPU, and its output comes out with the next step's outputs.

    step N:    schedule, forward(N) ─┬─ flush(): outputs of step N-1's deferred users
                                     └─ sample, update, process(N): the others now, the rest deferred

Outputs are cumulative (everything so far, as `LLM.generate` returns) or, with `deltas`, only
what each completion gained since the request's last output (the engine core's messages): a
step's outputs then cost the same however long the completions have grown, where cumulative ones
copy every token id of every running request at every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loraplex.engine.request import (
    CompletionOutput,
    Logprob,
    Request,
    RequestOutput,
    join_output,
)
from loraplex.engine.tokenizer import IncrementalDetokenizer, Tokenizer, find_stop_string

_Logprobs = tuple[Logprob, list[Logprob]]  # one token's logprob and the top ones


@dataclass
class _Completion:
    request: Request
    detokenizer: IncrementalDetokenizer
    text: str = ""
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: list[_Logprobs] | None = None
    # With deltas: what earlier outputs held (token ids, characters of text, logprobs).
    num_sent_tokens: int = 0
    num_sent_chars: int = 0
    num_sent_logprobs: int = 0


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
    def __init__(self, tokenizer: Tokenizer, deltas: bool = False) -> None:
        """`deltas`: outputs hold only what is new since the request's last output."""
        self.tokenizer = tokenizer
        self.deltas = deltas
        self._users: dict[str, _UserRequest] = {}
        self._child_to_user: dict[str, tuple[str, int]] = {}
        # Deferred completions whose newest token is not detokenized yet (with its logprobs),
        # and the outputs `flush` made of them, for the next `process` to return.
        self._pending: list[tuple[_UserRequest, _Completion, _Logprobs | None]] = []
        self._ready: dict[str, RequestOutput] = {}

    def add(self, request_id: str, prompt: str | None, children: list[Request]) -> None:
        user = _UserRequest(request_id, prompt, children[0].prompt_token_ids)
        for index, child in enumerate(children):
            detokenizer = IncrementalDetokenizer(self.tokenizer, child.prompt_token_ids)
            logprobs: list[_Logprobs] | None = (
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
        self, updated: list[Request], logprobs: dict[str, _Logprobs]
    ) -> tuple[list[RequestOutput], list[str]]:
        """The step's outputs: users whose completions advanced (the deferred ones of the step
        before included), and child ids a stop string ended. `updated` each gained one token."""
        self.flush()
        deferred = self._deferrable(updated)
        stopped: list[str] = []
        touched: dict[str, _UserRequest] = {}
        for request in updated:
            user, completion = self._completion(request.request_id)
            entry = logprobs.get(request.request_id) if completion.logprobs is not None else None
            if user.request_id in deferred:
                self._pending.append((user, completion, entry))
                continue
            if entry is not None:
                assert completion.logprobs is not None
                completion.logprobs.append(entry)
            if self._advance(completion, request.is_finished):
                stopped.append(request.request_id)
            touched[user.request_id] = user
        outputs, self._ready = self._ready, {}
        for user_id, user in touched.items():
            outputs[user_id] = self._after(outputs.pop(user_id, None), self._output(user))
        return list(outputs.values()), stopped

    def flush(self) -> None:
        """Detokenize the deferred completions' newest tokens; their outputs are returned by
        the next `process`. Runs before anything else changes those requests' tokens."""
        pending, self._pending = self._pending, []
        touched: dict[str, _UserRequest] = {}
        for user, completion, entry in pending:
            if entry is not None:
                assert completion.logprobs is not None
                completion.logprobs.append(entry)
            # Its token did not finish it (else it was not deferred), whatever happened since.
            stopped = self._advance(completion, finished=False)
            assert not stopped, "a completion with stop strings was deferred"
            touched[user.request_id] = user
        for user_id, user in touched.items():
            self._ready[user_id] = self._output(user)

    def _deferrable(self, updated: list[Request]) -> set[str]:
        """Users of `updated` whose text this step decides nothing: no stop strings, and no
        completion finished (all of a user's completions share their stop strings)."""
        users, sync = set(), set()
        for request in updated:
            user_id = self._child_to_user[request.request_id][0]
            users.add(user_id)
            if request.is_finished or request.sampling_params.stop:
                sync.add(user_id)
        return users - sync

    def _completion(self, child_id: str) -> tuple[_UserRequest, _Completion]:
        user_id, index = self._child_to_user[child_id]
        user = self._users[user_id]
        return user, user.completions[index]

    def finish(self, child_ids: list[str], finish_reason: str) -> list[RequestOutput]:
        """Mark children ended from outside a step (abort, error)."""
        self.flush()
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
        return [
            self._after(self._ready.pop(user_id, None), self._output(user))
            for user_id, user in touched.items()
        ]

    def _advance(self, completion: _Completion, finished: bool) -> bool:
        """Detokenize the newest token (`finished`: the step that sampled it finished the
        request); True if a stop string ended the completion here."""
        request = completion.request
        if not request.sampling_params.detokenize:
            if finished:
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
            return not finished
        if finished:
            completion.text += completion.detokenizer.flush()
            completion.finish_reason = request.status.finish_reason
            token = request.output_token_ids[-1]
            if token in request.sampling_params.stop_token_ids:
                completion.stop_reason = token
        return False

    def _output(self, user: _UserRequest) -> RequestOutput:
        outputs = [
            self._delta(index, c) if self.deltas else self._cumulative(index, c)
            for index, c in enumerate(user.completions)
        ]
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

    def _cumulative(self, index: int, c: _Completion) -> CompletionOutput:
        return CompletionOutput(
            index=index,
            text=c.text[: self._visible_chars(c)],
            token_ids=list(c.request.output_token_ids),
            finish_reason=c.finish_reason,
            logprobs=None if c.logprobs is None else list(c.logprobs),  # kept intact later
            stop_reason=c.stop_reason,
        )

    def _delta(self, index: int, c: _Completion) -> CompletionOutput:
        """What `c` gained since its last output; marks it sent. The visible text only grows:
        a stop string cuts the text no earlier than the held-back part (`_holdback`)."""
        token_ids = c.request.output_token_ids
        visible = max(self._visible_chars(c), c.num_sent_chars)
        logprobs = None
        if c.logprobs is not None:
            logprobs = c.logprobs[c.num_sent_logprobs :]
            c.num_sent_logprobs = len(c.logprobs)
        output = CompletionOutput(
            index=index,
            text=c.text[c.num_sent_chars : visible],
            token_ids=token_ids[c.num_sent_tokens :],
            finish_reason=c.finish_reason,
            logprobs=logprobs,
            stop_reason=c.stop_reason,
        )
        c.num_sent_tokens, c.num_sent_chars = len(token_ids), visible
        return output

    def _after(self, earlier: RequestOutput | None, later: RequestOutput) -> RequestOutput:
        """The output that replaces `earlier` (made by `flush`, not returned yet) by `later`
        of the same request: `later` itself when cumulative, the two deltas joined else."""
        if earlier is None or not self.deltas:
            return later
        return join_output(earlier, later)

    def _visible_chars(self, c: _Completion) -> int:
        """How much of c's text may be shown now (never taken back later)."""
        if c.finish_reason is not None:
            return len(c.text)
        return max(0, len(c.text) - self._holdback(c))

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

"""StepMessage crosses the pipe of a core in its own process: its pickled form (deltas as plain
tuples) must give back the same message, records and all."""

from __future__ import annotations

import pickle

from loraplex.engine.engine_core import CommandResult, CompletionDelta, OutputDelta, StepMessage
from loraplex.engine.request import Logprob
from loraplex.engine.stats import AdapterLoad, EngineStats


def test_a_step_message_survives_pickling_whole() -> None:
    top = [Logprob(7, -0.1), Logprob(9, -2.5)]
    message = StepMessage(
        deltas=[
            OutputDelta("a", [CompletionDelta(0, [5, 6], "hi", None, None, None)], False, 16, None),
            OutputDelta(
                "b",
                [
                    CompletionDelta(0, [7], "x", [(Logprob(7, -0.1), top)], "stop", "</s>"),
                    CompletionDelta(1, [], "", None, "length", 3),
                ],
                True,
                0,
                None,
            ),
            OutputDelta("c", [], True, 0, ValueError("bad prompt")),
        ],
        results=[CommandResult(request_id="a"), CommandResult(command_id=4, value=True)],
        stats=EngineStats(num_running=2, num_waiting=1),
        adapter_loads=[AdapterLoad("bot", "gpu", 0.25)],
        died=None,
    )
    copy = pickle.loads(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))

    assert isinstance(copy, StepMessage)
    assert all(type(d) is OutputDelta for d in copy.deltas)
    assert all(type(c) is CompletionDelta for d in copy.deltas for c in d.completions)
    # Exceptions do not compare equal: check that one apart, then the rest field by field.
    error = copy.deltas[2].error
    assert isinstance(error, ValueError) and error.args == ("bad prompt",)
    assert copy.deltas[:2] == message.deltas[:2]
    assert copy.deltas[2]._replace(error=None) == message.deltas[2]._replace(error=None)
    assert copy.deltas[1].completions[0].logprobs == [(Logprob(7, -0.1), top)]
    assert copy.deltas[1].completions[1].completion_index == 1
    assert (copy.results, copy.stats, copy.adapter_loads, copy.died) == (
        message.results,
        message.stats,
        message.adapter_loads,
        None,
    )


def test_an_empty_message_and_a_dying_one_survive_pickling() -> None:
    for message in (StepMessage(), StepMessage(died="engine core died: boom")):
        copy = pickle.loads(pickle.dumps(message))
        assert copy == message

"""Request's token views; joining delta outputs."""

from __future__ import annotations

from loraplex.engine.request import (
    CompletionOutput,
    Logprob,
    Request,
    RequestOutput,
    SamplingParams,
    join_output,
)


def test_token_ids_between_equals_slices_of_all_token_ids() -> None:
    request = Request("r", [1, 2, 3, 4], SamplingParams(max_tokens=8, temperature=0.0))
    request.output_token_ids.extend([5, 6, 7])
    every = request.all_token_ids
    assert every == [1, 2, 3, 4, 5, 6, 7]
    for start in range(len(every) + 1):
        for end in range(start, len(every) + 1):
            assert request.token_ids_between(start, end) == every[start:end], (start, end)


def test_join_output_appends_each_completions_delta_by_index() -> None:
    lp = Logprob(7, -0.5)
    earlier = RequestOutput("r", None, [1], [CompletionOutput(1, "a", [7], None, [(lp, [])])])
    later = RequestOutput(
        "r", None, [1],
        [CompletionOutput(0, "x", [9], None), CompletionOutput(1, "b", [8], "stop", [(lp, [])])],
        finished=True, num_cached_tokens=16,
    )  # fmt: skip
    joined = join_output(earlier, later)
    assert joined is earlier and joined.finished and joined.num_cached_tokens == 16
    assert [(c.index, c.text, c.token_ids) for c in joined.outputs] == [
        (0, "x", [9]),
        (1, "ab", [7, 8]),
    ]
    assert joined.outputs[1].finish_reason == "stop" and joined.outputs[1].logprobs == [
        (lp, []),
        (lp, []),
    ]

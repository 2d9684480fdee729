"""Request's token views."""

from __future__ import annotations

from loraplex.engine.request import Request, SamplingParams


def test_token_ids_between_equals_slices_of_all_token_ids() -> None:
    request = Request("r", [1, 2, 3, 4], SamplingParams(max_tokens=8, temperature=0.0))
    request.output_token_ids.extend([5, 6, 7])
    every = request.all_token_ids
    assert every == [1, 2, 3, 4, 5, 6, 7]
    for start in range(len(every) + 1):
        for end in range(start, len(every) + 1):
            assert request.token_ids_between(start, end) == every[start:end], (start, end)

"""Waiting queues: first-come-first-served, or by (priority, fair share, arrival)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from loraplex.engine.config import SchedulingPolicy
from loraplex.engine.request import Request


def priority_key(request: Request) -> tuple[int, float]:
    """Lower sorts first: more urgent, then older (vLLM's convention)."""
    return (request.priority, request.arrival_time)


class WaitingQueue:
    """Waiting requests in admission order. Small (hundreds), so a sorted list is enough.

    Under the priority policy, requests of equal priority are ordered by their fairness
    key's share so far (`fair_share`, lower first), then by arrival. Shares change every step,
    so the scheduler re-ranks (`sort`) before each pass; a new request is appended and takes
    its rank then (sorting on every add would cost O(n log n) per request).
    """

    def __init__(
        self, policy: SchedulingPolicy, fair_share: Callable[[str], float] | None = None
    ) -> None:
        self.policy = policy
        self.fair_share = fair_share
        self._requests: list[Request] = []

    def add(self, request: Request) -> None:
        self._requests.append(request)

    def add_front(self, request: Request) -> None:
        """A preempted request goes back ahead of its equals (FCFS: ahead of everyone)."""
        self._requests.insert(0, request)
        self.sort()

    def remove(self, request: Request) -> None:
        self._requests.remove(request)

    def sort(self) -> None:
        """Re-rank (fair shares change every step); stable, so ties keep their order."""
        if self.policy != "priority":
            return
        share = self.fair_share
        if share is None:
            self._requests.sort(key=priority_key)
        else:
            self._requests.sort(key=lambda r: (r.priority, share(r.fairness_key), r.arrival_time))

    def __iter__(self) -> Iterator[Request]:
        return iter(list(self._requests))

    def __len__(self) -> int:
        return len(self._requests)

    def __bool__(self) -> bool:
        return bool(self._requests)

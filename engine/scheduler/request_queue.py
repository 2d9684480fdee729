"""Waiting queues: first-come-first-served, or by (priority, arrival)."""

from __future__ import annotations

from collections.abc import Iterator

from loraplex.engine.request import Request


def priority_key(request: Request) -> tuple[int, float]:
    """Lower sorts first: more urgent, then older (vLLM's convention)."""
    return (request.priority, request.arrival_time)


class WaitingQueue:
    """Waiting requests in admission order. Small (hundreds), so a sorted list is enough."""

    def __init__(self, policy: str) -> None:
        self.policy = policy
        self._requests: list[Request] = []

    def add(self, request: Request) -> None:
        self._requests.append(request)
        self._sort()

    def add_front(self, request: Request) -> None:
        """A preempted request goes back ahead of its equals (FCFS: ahead of everyone)."""
        self._requests.insert(0, request)
        self._sort()

    def remove(self, request: Request) -> None:
        self._requests.remove(request)

    def _sort(self) -> None:
        if self.policy == "priority":
            self._requests.sort(key=priority_key)  # stable: ties keep insertion order

    def __iter__(self) -> Iterator[Request]:
        return iter(list(self._requests))

    def __len__(self) -> int:
        return len(self._requests)

    def __bool__(self) -> bool:
        return bool(self._requests)

    def peek(self) -> Request:
        return self._requests[0]

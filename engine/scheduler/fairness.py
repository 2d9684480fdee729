"""Fair sharing among tenants of one priority: a virtual token counter (S-LoRA's VTC).

Each fairness key (a tenant) accumulates the tokens the engine computed for it; waiting
requests of equal priority are admitted lowest counter first. A tenant that goes idle and
comes back is lifted to the smallest counter among active tenants, so idle time is not
banked as credit against the others.
"""

from __future__ import annotations

from collections import Counter


class VirtualTokenCounter:
    def __init__(self) -> None:
        self.served: dict[str, float] = {}
        self._active: Counter[str] = Counter()  # unfinished requests per key

    def on_add(self, key: str) -> None:
        if self._active[key] == 0:
            active = [self.served.get(k, 0.0) for k, n in self._active.items() if n > 0]
            floor = min(active) if active else 0.0
            self.served[key] = max(self.served.get(key, 0.0), floor)
        self._active[key] += 1

    def on_finish(self, key: str) -> None:
        self._active[key] -= 1
        if self._active[key] <= 0:
            del self._active[key]

    def charge(self, key: str, num_tokens: int) -> None:
        self.served[key] = self.served.get(key, 0.0) + num_tokens

    def __call__(self, key: str) -> float:
        return self.served.get(key, 0.0)

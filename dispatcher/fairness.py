"""Fair sharing of lease slots between priority classes (pure, no I/O).

Smooth weighted round-robin (as in nginx): each pick adds every class's weight to
its running total and serves the class with the largest total, which then pays
the sum of weights. With weights 6:3:1 ten picks are H D H L H D H H D H-like, so
every class gets its share evenly spread rather than in bursts. The lease script
falls back to the highest non-empty class when a picked class has nothing ready.
"""

from __future__ import annotations

from .config import FairnessPolicy
from .states import Priority


class FairPicker:
    def __init__(self, policy: FairnessPolicy) -> None:
        self.policy = policy
        self._current = [0, 0, 0]

    def picks(self, n: int) -> list[Priority]:
        if self.policy.strict:
            return [Priority.HIGH] * n
        weights = self.policy.weights
        total = sum(weights)
        out = []
        for _ in range(n):
            for i, w in enumerate(weights):
                self._current[i] += w
            best = max(range(3), key=lambda i: self._current[i])
            self._current[best] -= total
            out.append(Priority(best))
        return out

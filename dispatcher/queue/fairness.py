"""Fair sharing of lease slots between priority classes (pure, no I/O).

Smooth weighted round-robin (as in nginx): each pick adds every class's weight to
its running total and serves the class with the largest total, which then pays
the sum of weights. With weights 6:3:1 ten picks are H D H L H D H H D H-like, so
every class gets its share evenly spread rather than in bursts. The lease script
falls back to the highest non-empty class when a picked class has nothing ready.
"""

from __future__ import annotations

from ..config import FairnessPolicy
from .states import PRIORITIES, Priority


class FairPicker:
    def __init__(self, policy: FairnessPolicy) -> None:
        self.policy = policy
        self._current = [0, 0, 0]

    def picks(self, n: int) -> list[Priority]:
        if self.policy.strict:
            return [Priority.HIGH] * n
        w0, w1, w2 = self.policy.weights
        total = w0 + w1 + w2
        current = self._current
        out = []
        for _ in range(n):  # smooth weighted round robin; ties go to the higher class
            current[0] += w0
            current[1] += w1
            current[2] += w2
            best = (
                0
                if current[0] >= current[1] and current[0] >= current[2]
                else (1 if current[1] >= current[2] else 2)
            )
            current[best] -= total
            out.append(PRIORITIES[best])
        return out

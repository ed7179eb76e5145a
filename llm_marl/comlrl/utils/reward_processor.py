"""CoMLRL's ``comlrl.utils.reward_processor``: ready-made ``reward_processor`` callables.

A reward processor is a plain function ``float -> float`` that the trainer applies to the
reward of every joint answer (element 0 of what ``reward_func`` returns) before returns and
advantages are computed. As CoMLRL documents them:

- ``RewardProcessors.scale(factor=1.0)`` multiplies the reward by ``factor``;
- ``RewardProcessors.shift(value=0.0)`` adds ``value`` to it.

They compose as plain functions; companion scripts scale first, then shift::

    scale, shift = RewardProcessors.scale(factor=0.5), RewardProcessors.shift(value=-4)
    reward_processor = lambda x: shift(scale(x))   # 8.0 -> 0.0

One addition: an argument that is not a finite real number is refused when the processor is
made (ValueError naming it), not when the first reward goes through it.
"""

from __future__ import annotations

import math
import numbers
from typing import Callable

RewardProcessor = Callable[[float], float]


class RewardProcessors:
    """Factories of reward processors (``float -> float``)."""

    @staticmethod
    def scale(factor: float = 1.0) -> RewardProcessor:
        """A processor that multiplies every reward by ``factor``."""
        factor = _finite("factor", factor)

        def scaled(reward: float) -> float:
            return reward * factor

        return scaled

    @staticmethod
    def shift(value: float = 0.0) -> RewardProcessor:
        """A processor that adds ``value`` to every reward."""
        value = _finite("value", value)

        def shifted(reward: float) -> float:
            return reward + value

        return shifted


def _finite(name: str, number: object) -> float:
    if isinstance(number, bool) or not isinstance(number, numbers.Real) or not math.isfinite(number):
        raise ValueError(f"RewardProcessors: {name} must be a finite real number, got {number!r}")
    return number  # type: ignore[return-value]


__all__ = ["RewardProcessors"]

"""A call as an observation, and the observation space of a program's agents.

A chat call (``/v1/chat/completions``) becomes the list of its ``{"role", "content"}`` messages
(content as plain text; roles system/user/assistant, ``developer`` read as system), which a
:class:`~llm_marl.policies.CausalLMPolicy` renders with the agent's chat template. A text
completion call (``/v1/completions``) becomes its prompt string. An agent that does not call at a
step is given the empty string.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from gymnasium.spaces import Space


def first_difference(recorded: Any, now: Any) -> str:
    """Where two observations first differ, in words: ``message 2 (content): 'a...' vs 'b...'``."""
    if isinstance(recorded, str) or isinstance(now, str):
        if recorded == now:
            return "none"
        return f"prompt: recorded {str(recorded)!r:.80}, now {str(now)!r:.80}"
    for index, (old, new) in enumerate(zip(recorded, now)):
        if old != new:
            key = "role" if old.get("role") != new.get("role") else "content"
            return f"message {index} ({key}): recorded {old.get(key)!r:.80}, now {new.get(key)!r:.80}"
    if len(recorded) != len(now):
        return f"message {min(len(recorded), len(now))}: recorded {len(recorded)} messages, now {len(now)}"
    return "none"


class Messages(Space):
    """A chat call's messages (a list of ``{"role", "content"}`` strings, at most ``max_length``
    characters of content in all) or a completion call's prompt (a string)."""

    def __init__(self, max_length: int = 1_000_000, seed: int | np.random.Generator | None = None):
        super().__init__(shape=None, dtype=None, seed=seed)
        self.max_length = max_length

    def contains(self, x: Any) -> bool:
        if isinstance(x, str):
            return len(x) <= self.max_length
        if not isinstance(x, Sequence):
            return False
        total = 0
        for message in x:
            if not isinstance(message, dict) or not isinstance(message.get("role"), str) or not isinstance(message.get("content"), str):
                return False
            total += len(message["content"])
        return total <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> list[dict[str, str]]:
        words = ["hello", "team", "write", "a", "line", "please"]
        count = int(self.np_random.integers(1, 6))
        return [{"role": "user", "content": " ".join(self.np_random.choice(words, count))}]

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"Messages({self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Messages) and other.max_length == self.max_length

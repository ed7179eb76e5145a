"""Text spaces for dialogue environments.

Gymnasium's :class:`~gymnasium.spaces.Text` defaults to an alphanumeric charset with
``min_length=1``, so it rejects ``"hello world"``, punctuation, non-ASCII text and the empty
answer. :class:`Utterance` keeps the ``Text`` type (tools that dispatch on it still work) but
``contains`` accepts any Unicode string of at most ``max_length`` characters.
"""

from __future__ import annotations

import string
from typing import Any

import numpy as np
from gymnasium.spaces import Text

_SAMPLE_CHARSET = string.ascii_letters + string.digits + string.punctuation + " \n"


class Utterance(Text):
    """Any Unicode string with ``min_length <= len(s) <= max_length``.

    ``sample()`` draws printable ASCII text (letters, digits, punctuation, spaces, newlines);
    environments must accept such noise as an answer.
    """

    def __init__(self, max_length: int = 4096, *, min_length: int = 0, seed: int | np.random.Generator | None = None):
        super().__init__(max_length=max_length, min_length=min_length, charset=_SAMPLE_CHARSET, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"Utterance({self.min_length}, {self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Utterance) and (self.min_length, self.max_length) == (other.min_length, other.max_length)

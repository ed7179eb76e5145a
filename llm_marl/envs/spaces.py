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

    ``sample()`` draws printable ASCII text (letters, digits, punctuation, spaces, newlines) of
    at most ``sample_max_length`` characters (default 64; Gymnasium's ``Text`` would draw lengths
    uniformly up to ``max_length``, i.e. ~500,000-character strings for a 10**6 limit);
    environments must accept such noise as an answer. An explicit length in ``mask`` or
    ``probability`` is honoured as in ``Text``.
    """

    sample_max_length = 64

    def __init__(self, max_length: int = 4096, *, min_length: int = 0, seed: int | np.random.Generator | None = None):
        super().__init__(max_length=max_length, min_length=min_length, charset=_SAMPLE_CHARSET, seed=seed)

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        if mask is None and probability is None:
            high = max(self.min_length, min(self.max_length, self.sample_max_length))
            mask = (int(self.np_random.integers(self.min_length, high + 1)), None)
        return super().sample(mask=mask, probability=probability)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"Utterance({self.min_length}, {self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Utterance) and (self.min_length, self.max_length) == (other.min_length, other.max_length)

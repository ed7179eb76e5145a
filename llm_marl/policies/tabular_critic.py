"""TabularCritic: a table of values, one row per distinct observation (or observation + answer).

The toy critic of the library, for matrix games and tests: V(h) is ``table[row(h)]`` and Q(h, a)
is ``table[row(h, a)]``, with ``num_outputs`` columns (1 for IAC, one per agent for MAAC's central
critic). Every entry starts at ``initial_value``. Rows are assigned as :class:`TabularPolicy`
assigns them (new keys of one call in sorted order; ``pending_observations`` /
``add_observations`` let data-parallel ranks keep identical tables), so a run repeats exactly.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from llm_marl.policies.base import Completion
from llm_marl.policies.tabular import observation_key

_SEPARATOR = "\x1f"


class TabularCritic(nn.Module):
    """Values ``table[row(key)]`` over observation keys (or observation + answer keys)."""

    def __init__(self, num_outputs: int = 1, *, capacity: int = 4096, initial_value: float = 0.0):
        super().__init__()
        if num_outputs < 1:
            raise ValueError(f"num_outputs must be >= 1, got {num_outputs}")
        self.num_outputs = num_outputs
        self.capacity = capacity
        self.table = nn.Parameter(torch.full((capacity, num_outputs), float(initial_value)))
        self.initial_value = float(initial_value)
        self.rows: dict[str, int] = {}
        self.pending: set[str] = set()

    @staticmethod
    def key(observation: Any, completion: Completion | None = None) -> str:
        """The table key of an observation, or of an observation and an answer."""
        base = observation_key(observation)
        return base if completion is None else base + _SEPARATOR + completion.text

    def add_observations(self, keys: Sequence[str]) -> None:
        """Give each new key a row, in sorted order."""
        for key in sorted(set(keys) - self.rows.keys()):
            if len(self.rows) >= self.capacity:
                raise RuntimeError(f"TabularCritic is full: {self.capacity} distinct keys (raise capacity)")
            self.rows[key] = len(self.rows)
            self.pending.discard(key)

    def pending_observations(self) -> list[str]:
        """Keys met by :meth:`values` under ``torch.no_grad`` that have no row yet, sorted."""
        return sorted(self.pending - self.rows.keys())

    def values(self, observations: Sequence[Any], completions: Sequence[Completion] | None = None) -> torch.Tensor:
        """``[batch, num_outputs]`` values; differentiable when grad is enabled (rows are then
        assigned), else unknown keys read the initial value and stay pending."""
        if completions is not None and len(completions) != len(observations):
            raise ValueError(f"{len(observations)} observations but {len(completions)} completions")
        keys = [self.key(o, None if completions is None else completions[i]) for i, o in enumerate(observations)]
        if torch.is_grad_enabled():
            self.add_observations(keys)
            return self.table[torch.tensor([self.rows[k] for k in keys], dtype=torch.long)]
        self.pending.update(k for k in keys if k not in self.rows)
        table = self.table.detach()
        out = torch.full((len(keys), self.num_outputs), self.initial_value)
        for i, k in enumerate(keys):
            if k in self.rows:
                out[i] = table[self.rows[k]]
        return out

    def get_extra_state(self) -> dict[str, Any]:
        return {"rows": dict(self.rows)}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.rows = dict(state["rows"])
        self.pending = set()

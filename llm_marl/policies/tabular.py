"""TabularPolicy: a softmax table over a fixed menu of answers, one row per distinct observation.

The toy policy of the library: it samples and is trained through the same ``Policy`` protocol and
the same loss as a language model, so learners can be tested in seconds. An answer is one
"token" (its menu index), so ``reduction="sum"`` and ``"mean"`` agree.

Rows: an observation seen for the first time is answered from all-zero logits (the uniform
policy, exactly what a fresh row holds) and stays *pending*; it gets its row when it is first
scored (``log_probs``) or added with :meth:`add_observations`, new observations of one call in
sorted order, up to ``capacity``. So the table's layout depends only on which observations were
scored together, not on the order they were met — data-parallel ranks that add the union of
their pending observations before each update hold identical tables. Observations that are not
strings (e.g. numpy arrays from other PettingZoo environments) are keyed by dtype, shape and a
digest of their bytes. Sampling uses torch's global RNG unless a generator is given.
"""

from __future__ import annotations

import math

import hashlib
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from llm_marl.policies.base import Completion, GapMeter, sampler_record


def observation_key(observation: Any) -> str:
    """A stable string key for an observation: the string itself, or a digest of an array."""
    if isinstance(observation, str):
        return observation
    array = np.asarray(observation)
    digest = hashlib.sha1(array.tobytes()).hexdigest()
    return f"<{array.dtype}{array.shape}:{digest}>"


class TabularPolicy(nn.Module):
    """A softmax policy ``pi(a | o) = softmax(logits[row(o)])[a]`` over ``actions``."""

    def __init__(self, actions: Sequence[Any], *, capacity: int = 1024, generator: torch.Generator | None = None):
        super().__init__()
        if len(actions) < 1:
            raise ValueError("TabularPolicy needs at least one action")
        self.actions = list(actions)
        self._index = {str(a): i for i, a in enumerate(self.actions)}
        if len(self._index) != len(self.actions):
            raise ValueError(f"actions must be distinct, got {self.actions}")
        self.capacity = capacity
        self.logits = nn.Parameter(torch.zeros(capacity, len(self.actions)))
        self.rows: dict[str, int] = {}
        self.pending: set[str] = set()
        self.generator = generator
        self.sampler_gap = GapMeter("float32")
        """The sampler–scorer gap of this policy's answers (exactly 0 unless the table changed unannounced)."""

    def add_observations(self, keys: Sequence[str]) -> None:
        """Give each new observation key a row, in sorted order."""
        for key in sorted(set(keys) - self.rows.keys()):
            if len(self.rows) >= self.capacity:
                raise RuntimeError(f"TabularPolicy is full: {self.capacity} distinct observations (raise capacity)")
            self.rows[key] = len(self.rows)
            self.pending.discard(key)

    def pending_observations(self) -> list[str]:
        """Keys of observations met by ``sample`` that have no row yet, sorted."""
        return sorted(self.pending - self.rows.keys())

    def row(self, observation: Any) -> int:
        """The table row of ``observation`` (assigned now if it has none)."""
        key = observation_key(observation)
        self.add_observations([key])
        return self.rows[key]

    def _logits(self, observations: Sequence[Any]) -> torch.Tensor:
        """Logits per observation without assigning rows (unknown ones are 0 and become pending)."""
        keys = [observation_key(o) for o in observations]
        self.pending.update(k for k in keys if k not in self.rows)
        logits = torch.zeros(len(keys), len(self.actions))
        known = [i for i, k in enumerate(keys) if k in self.rows]
        if known:
            logits[known] = self.logits.detach()[[self.rows[keys[i]] for i in known]]
        return logits

    def menu_logits(self, observation: Any) -> torch.Tensor:
        """The logits of ``observation``'s row (differentiable; a row is assigned if it has none)."""
        return self.logits[self.row(observation)]

    def probabilities(self, observation: Any) -> torch.Tensor:
        """The action distribution at ``observation`` (no gradient, no row assigned)."""
        return torch.softmax(self._logits([observation])[0], dim=-1)

    def sample(
        self, observations: Sequence[Any], num_samples: int, generators: Sequence[torch.Generator] | None = None
    ) -> list[list[Completion]]:
        """``num_samples`` answers per observation; row i draws from ``generators[i]`` when given,
        else from ``self.generator`` (or torch's global RNG)."""
        with torch.no_grad():
            logits = self._logits(observations)
            log_probs = torch.log_softmax(logits, dim=-1)
            probs = torch.softmax(logits, dim=-1)
            if generators is None:
                picks = torch.multinomial(probs, num_samples, replacement=True, generator=self.generator)
            else:
                picks = torch.stack(
                    [torch.multinomial(p, num_samples, replacement=True, generator=g) for p, g in zip(probs, generators)]
                )
        return [
            [Completion(str(self.actions[a]), action=int(a), sampler=sampler_record(self, [float(log_probs[i, a])])) for a in row.tolist()]
            for i, row in enumerate(picks)
        ]

    def action_of(self, completion: Completion) -> int:
        if completion.action is not None:
            return completion.action
        if completion.text not in self._index:
            raise ValueError(f"{completion.text!r} is not one of this policy's actions {self.actions}")
        return self._index[completion.text]

    def log_probs(
        self, observations: Sequence[Any], completions: Sequence[Completion], reduction: str = "sum"
    ) -> torch.Tensor:
        if len(observations) != len(completions):
            raise ValueError(f"{len(observations)} observations but {len(completions)} completions")
        keys = [observation_key(o) for o in observations]
        self.add_observations(keys)
        rows = torch.tensor([self.rows[k] for k in keys], dtype=torch.long)
        picks = torch.tensor([self.action_of(c) for c in completions], dtype=torch.long)
        table = torch.log_softmax(self.logits[rows], dim=-1)
        values = table.gather(1, picks[:, None]).squeeze(1)
        entropy = -torch.where(table > -math.inf, table.exp() * table, 0.0).sum(dim=-1, keepdim=True)  # the row's entropy
        self.last_token_entropy = (entropy, torch.ones_like(entropy, dtype=torch.bool))
        self.sampler_gap.measure(self, [self.logits], completions, values.unsqueeze(1), torch.ones(len(completions), 1, dtype=torch.bool))
        return values

    def get_extra_state(self) -> dict[str, Any]:
        return {"rows": dict(self.rows)}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.rows = dict(state["rows"])
        self.pending = set()

"""What acts: the policy protocol every learner drives.

A policy answers observations (prompt strings) with completions and scores completions it
(or another policy with the same vocabulary) produced. Tabular, scripted and language-model
policies all speak this protocol, so the learners have one code path for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Protocol, Sequence, runtime_checkable

import torch


@dataclass(frozen=True)
class Completion:
    """One answer of a policy.

    Attributes:
        text: the answer as the environment sees it.
        token_ids: the generated token ids, end-of-sequence included and padding excluded
            (language-model policies); None otherwise.
        action: the index of the answer in a fixed menu (tabular policies); None otherwise.
    """

    text: str
    token_ids: tuple[int, ...] | None = None
    action: int | None = None


@runtime_checkable
class Policy(Protocol):
    """The protocol the learners use.

    ``sample(observations, n)`` returns, for each observation, a list of ``n`` completions.
    ``log_probs(observations, completions)`` returns a differentiable 1-D tensor with one value per
    (observation, completion) pair: the log-probability of the whole completion, i.e. the sum
    over its tokens (``reduction="sum"``) or their mean (``reduction="mean"``).
    ``parameters()`` yields the trainable parameters (none for scripted policies).
    """

    def sample(self, observations: Sequence[str], num_samples: int) -> list[list[Completion]]: ...

    def log_probs(
        self,
        observations: Sequence[str],
        completions: Sequence[Completion],
        reduction: str = "sum",
    ) -> torch.Tensor: ...

    def parameters(self) -> Iterator[torch.nn.Parameter]: ...


def token_log_probs_of(
    policy: Policy, observations: Sequence[str], completions: Sequence[Completion]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probabilities ``(values, mask)``, both of shape ``[batch, max_tokens]``.

    Policies that score several tokens per answer implement ``token_log_probs`` themselves; for
    any other policy an answer is one token whose log-probability is ``log_probs``.
    """
    own = getattr(policy, "token_log_probs", None)
    if own is not None:
        return own(observations, completions)
    values = policy.log_probs(observations, completions).unsqueeze(1)
    return values, torch.ones_like(values, dtype=torch.bool)

"""ScriptedPolicy: answers from a plain function; not trainable.

For tests, fixed partners and baselines. ``fn(observation, num_samples)`` returns
``num_samples`` strings. ``log_probs`` is 0 for every answer (the policy has no parameters), and
learners skip the update of an agent whose policy has no trainable parameters.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

import torch

from llm_marl.policies.base import Completion


class ScriptedPolicy:
    """A policy whose answers are ``fn(observation, num_samples) -> list[str]``."""

    def __init__(self, fn: Callable[[str, int], Sequence[str]], name: str = "scripted"):
        self.fn = fn
        self.name = name

    def sample(self, observations: Sequence[str], num_samples: int) -> list[list[Completion]]:
        answers = []
        for i, observation in enumerate(observations):
            texts = list(self.fn(observation, num_samples))
            if len(texts) != num_samples or not all(isinstance(t, str) for t in texts):
                raise ValueError(
                    f"ScriptedPolicy {self.name!r} must return {num_samples} strings for observation {i}, got {texts!r}"
                )
            answers.append([Completion(t) for t in texts])
        return answers

    def log_probs(
        self, observations: Sequence[str], completions: Sequence[Completion], reduction: str = "sum"
    ) -> torch.Tensor:
        return torch.zeros(len(completions))

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return iter(())

"""Reward-blind control runs for learning tests.

A learning test that only checks a threshold also passes for a learner that ignores the reward
wherever sharpening a policy on its own samples (or random drift) reaches that threshold. The
control is the same run with advantages that carry no information about the reward:

- ``"shuffle"``: each group's K advantages are permuted at random (same values, same spread,
  assigned to the wrong answers);
- ``"constant"``: every advantage is 1 (maximum likelihood on the policy's own samples).

``with reward_blind("shuffle", seed): trainer.train()`` patches the trainer's samples for the
duration of the block.
"""

from __future__ import annotations

import random
from contextlib import contextmanager
from typing import Iterator

import llm_marl.learners.reinforce.trainer as reinforce


@contextmanager
def reward_blind(kind: str, seed: int = 0) -> Iterator[None]:
    if kind not in ("shuffle", "constant"):
        raise ValueError(f"kind must be 'shuffle' or 'constant', got {kind!r}")
    original = reinforce.samples_from_trees
    rng = random.Random(seed)

    def blind(*args, **kwargs):
        samples = original(*args, **kwargs)
        for sample in samples:
            if kind == "shuffle":
                rng.shuffle(sample.advantages)
            else:
                sample.advantages = [1.0] * len(sample.advantages)
        return samples

    reinforce.samples_from_trees = blind
    try:
        yield
    finally:
        reinforce.samples_from_trees = original

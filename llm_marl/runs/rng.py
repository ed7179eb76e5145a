"""The random number generators a run draws from: seeded when training starts, saved in every
checkpoint, and set aside around an evaluation.

A run draws from Python's, NumPy's and torch's global generators (CPU and every CUDA device;
language-model sampling draws there) and from the ``generator`` of any policy that has one
(:class:`~llm_marl.policies.TabularPolicy`), and the envs pick an item from their own
``np_random`` when reset without an index. :func:`rng_state` and :func:`restore_rng` capture
and put back all of them; :func:`seeded_aside` runs a block on freshly seeded generators and then
puts the run's back, so that the block neither depends on nor changes what the run draws next.
"""

from __future__ import annotations

import random
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global RNGs (torch's CUDA generators too)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state(policies: Mapping[str, Any], envs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every generator's state: the global ones, each policy's own ``generator`` and each env's
    item generator (``np_random``, which picks the item of a reset without an index)."""
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "policies": {},
    }
    for agent, policy in policies.items():
        generator = getattr(policy, "generator", None)
        if isinstance(generator, torch.Generator):
            state["policies"][agent] = generator.get_state()
    state["envs"] = {name: env._np_random.bit_generator.state for name, env in (envs or {}).items() if _has_generator(env)}
    return state


def _has_generator(env: Any) -> bool:
    return isinstance(getattr(env, "_np_random", None), np.random.Generator)


def restore_rng(policies: Mapping[str, Any], state: Mapping[str, Any], envs: Mapping[str, Any] | None = None) -> None:
    """Put back what :func:`rng_state` captured."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    for agent, generator_state in state["policies"].items():
        policies[agent].generator.set_state(generator_state)
    for name, generator_state in state.get("envs", {}).items():
        if envs and name in envs and _has_generator(envs[name]):
            generator = np.random.Generator(getattr(np.random, generator_state["bit_generator"])())
            generator.bit_generator.state = generator_state
            envs[name]._np_random = generator  # a new object: forks sharing the old one keep theirs


@contextmanager
def seeded_aside(seed: int, policies: Mapping[str, Any]) -> Iterator[None]:
    """Run the block on generators seeded with ``seed`` (the policies' own generators included),
    then restore every generator to its state before the block, also when the block raises."""
    saved = rng_state(policies)
    try:
        seed_everything(seed)
        for offset, agent in enumerate(saved["policies"]):
            policies[agent].generator.manual_seed(seed + offset + 1)
        yield
    finally:
        restore_rng(policies, saved)

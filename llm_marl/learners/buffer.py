"""Training samples and per-agent rollout buffers (docs/algorithms.md §3.8, §4).

Every (node, acting agent) pair of a rollout tree becomes one :class:`Sample` (an agent that does
not act at a node — turn-based envs — has no sample there): the agent's observation,
its K answers, their K per-agent returns (less the reference-KL penalty, if any) and the K
advantages of its group. An agent's buffer is consumed in mini-batches once it holds
``rollout_buffer_size`` samples, and whatever is left at the end of an epoch is consumed too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from llm_marl.advantages import group_advantages
from llm_marl.policies.base import Completion
from llm_marl.rollouts import RolloutBuffer, RolloutNode, iter_nodes  # noqa: F401 (RolloutBuffer re-exported)

KLPenalty = Callable[[str, Sequence[Any], Sequence[Completion]], list[float]]


@dataclass
class Sample:
    """One group: an agent's K answers to one observation, with returns and advantages."""

    agent: str
    observation: Any
    completions: list[Completion]
    returns: list[float]
    advantages: list[float]
    index: int
    turn: int
    kl: list[float] = field(default_factory=list)


def samples_from_trees(
    roots: Sequence[RolloutNode],
    agents: Sequence[str],
    *,
    advantage_mode: str,
    normalize: bool | Mapping[str, bool],
    kl_penalty: KLPenalty | None = None,
    kl_coef: float = 0.0,
) -> list[Sample]:
    """Samples of every node of ``roots`` in creation order, acting agents in order within a node.

    ``kl_penalty(agent, observations, completions)`` gives each answer's KL to the frozen
    reference; it is called once per agent for all of that agent's answers in the trees, and
    ``kl_coef`` times it is subtracted from the returns before the baseline. ``normalize``: one
    setting for every agent, or agent -> whether its groups are divided by their std.
    """
    nodes = list(iter_nodes(roots))
    kl: dict[str, list[list[float]]] = {agent: [[] for _ in nodes] for agent in agents}
    if kl_penalty is not None:
        for agent in agents:
            observations = [node.observations[agent] for node in nodes for _ in node.completions.get(agent, ())]
            completions = [c for node in nodes for c in node.completions.get(agent, ())]
            if not completions:
                continue
            values = kl_penalty(agent, observations, completions)
            offset = 0
            for n, node in enumerate(nodes):
                k = len(node.completions.get(agent, ()))
                kl[agent][n] = list(values[offset : offset + k])
                offset += k
    samples = []
    for n, node in enumerate(nodes):
        for agent in agents:
            if not node.acts(agent):
                continue
            returns = node.agent_returns(agent)
            penalty = kl[agent][n]
            if penalty:
                returns = [g - kl_coef * d for g, d in zip(returns, penalty)]
            for k, value in enumerate(returns):
                if not math.isfinite(value):
                    raise FloatingPointError(
                        f"agent {agent!r}, item {node.index}, turn {node.turn}: return of answer {k} is {value}"
                    )
            scaled = normalize if isinstance(normalize, bool) else normalize[agent]
            advantages = group_advantages(returns, advantage_mode, scaled)
            samples.append(
                Sample(agent, node.observations[agent], list(node.completions[agent]), returns, advantages, node.index, node.turn, penalty)
            )
    return samples


def node_groups(samples: Sequence[Any], agents: Sequence[str]) -> list[list[Any]]:
    """``samples`` (node by node, agents in the order of ``agents`` within a node) split into
    one group per node: a node's group ends where the next sample's agent does not come later or
    belongs to another item or turn (sibling nodes may share a group; only when the buffers are
    checked for being full depends on it)."""
    groups: list[list[Any]] = []
    position = {agent: p for p, agent in enumerate(agents)}
    for sample in samples:
        if groups and position[sample.agent] > position[groups[-1][-1].agent] and (sample.index, sample.turn) == (groups[-1][-1].index, groups[-1][-1].turn):
            groups[-1].append(sample)
        else:
            groups.append([sample])
    return groups

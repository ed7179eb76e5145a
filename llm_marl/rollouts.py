"""A rollout as data: the nodes of a K-branch rollout tree and an agent's buffer of samples.

Below both the learners (:mod:`llm_marl.learners.tree` grows the trees, :mod:`llm_marl.learners.buffer`
turns them into samples) and what a run leaves behind (:mod:`llm_marl.runs.recording` records
trees, :mod:`llm_marl.runs.checkpoint` restores buffers), so neither reaches into the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from llm_marl.advantages import agent_returns
from llm_marl.policies.base import Completion


@dataclass
class RolloutNode:
    """One turn of one branch of a rollout tree.

    ``joint[j]`` is joint action j as a tuple of answer indices, one per agent in agent order;
    ``rewards[j]``, ``returns[j]``, ``details[j]`` and ``children[j]`` belong to it (a child is
    None where the branch was not expanded). ``index`` is the dataset item of the tree.
    ``error`` is set on a root whose item failed and was skipped. ``agent_rewards`` is None
    when every agent got the same reward; where the env gave agents different rewards (only
    grown for learners that accept them) it maps agent → one reward per joint action, and
    ``rewards[j]`` (hence ``returns``) is the agents' mean. ``completions`` (hence
    :attr:`agents` and the positions in ``joint``) holds only the agents that acted at this turn
    (every agent unless the env is turn-based); ``observations`` holds every agent's.
    """

    turn: int
    index: int
    observations: dict[str, Any]
    completions: dict[str, list[Completion]] = field(default_factory=dict)
    joint: list[tuple[int, ...]] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    returns: list[float] = field(default_factory=list)
    children: list["RolloutNode | None"] = field(default_factory=list)
    details: list[dict[str, Any]] = field(default_factory=list)
    cross_aggregation: str = "sum"
    error: str | None = None
    seed: int | None = None
    agent_rewards: dict[str, list[float]] | None = None

    @property
    def agents(self) -> list[str]:
        """The agents that acted at this node, in agent order."""
        return list(self.completions)

    def acts(self, agent: str) -> bool:
        """Whether ``agent`` acted (answered) at this node."""
        return agent in self.completions

    def rewards_of(self, agent: str) -> list[float]:
        """``agent``'s reward per joint action: ``agent_rewards[agent]`` where agents' rewards
        differ at this node, else ``rewards``."""
        return list(self.agent_rewards[agent]) if self.agent_rewards is not None else list(self.rewards)

    def agent_returns(self, agent: str) -> list[float]:
        """K per-answer returns of ``agent`` (docs/algorithms.md §3.7)."""
        position = self.agents.index(agent)
        return agent_returns(self.joint, self.returns, position, len(self.completions[agent]), self.cross_aggregation)

    def nodes(self) -> Iterator["RolloutNode"]:
        """This node and its descendants, level by level (the order they were created)."""
        return _level_order([self])


def iter_nodes(roots: Sequence[RolloutNode]) -> Iterator[RolloutNode]:
    """Every node of several trees in creation order: depth by depth, trees in order."""
    return _level_order([root for root in roots if root.error is None])


def _level_order(level: list[RolloutNode]) -> Iterator[RolloutNode]:
    while level:
        yield from level
        level = [child for node in level for child in node.children if child is not None]


class RolloutBuffer:
    """A FIFO of samples (:class:`~llm_marl.learners.buffer.Sample`) for one agent."""

    def __init__(self, samples: Sequence[Any] = ()):
        self.samples: list[Any] = list(samples)

    def __len__(self) -> int:
        return len(self.samples)

    def append(self, sample: Any) -> None:
        self.samples.append(sample)

    def batches(self, batch_size: int) -> list[list[Any]]:
        """The buffer as consecutive mini-batches of at most ``batch_size`` samples; it keeps them
        until :meth:`discard` (so a failed update loses nothing)."""
        return [self.samples[start : start + batch_size] for start in range(0, len(self.samples), batch_size)]

    def discard(self, count: int) -> None:
        """Drop the ``count`` oldest samples (a mini-batch that was trained on)."""
        del self.samples[:count]

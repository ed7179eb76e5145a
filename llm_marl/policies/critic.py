"""What judges: the critic protocol the actor-critic learners use, beside :class:`Policy`.

A critic maps what an agent (or the team) saw — and, for an action-value critic, what it
answered — to values, one per output. IAC gives every agent its own critic with one output;
MAAC gives the team one central critic over the *joint* observation with one output per agent
(agent i's value is output i), so agents with different rewards never share a regression target.

``values(observations)`` is V(h): one row per observation. ``values(observations, completions)``
is Q(h, a): one row per (observation, answer) pair. Both return a differentiable tensor of shape
``[batch, num_outputs]``. ``parameters()`` yields what the critic's optimizer updates (a critic
that shares its backbone with an actor yields only its own head).
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Protocol, Sequence, runtime_checkable

import torch

from llm_marl.policies.base import Completion


@runtime_checkable
class Critic(Protocol):
    """The protocol of the actor-critic learners (see the module docstring)."""

    num_outputs: int

    def values(self, observations: Sequence[Any], completions: Sequence[Completion] | None = None) -> torch.Tensor: ...

    def parameters(self) -> Iterator[torch.nn.Parameter]: ...


def joint_observation(observations: Mapping[str, Any], agents: Sequence[str], answers: Sequence[str] | None = None) -> str:
    """The central critic's input text: one ``[Agent k] prompt`` block per agent, joined by blank
    lines; with ``answers`` (an action-value critic) followed by ``[Joint Action]`` and one
    ``[Agent k action]`` block per agent (docs/actor_critic.md §2)."""
    text = "\n\n".join(f"[Agent {k}] {observations[agent]}" for k, agent in enumerate(agents))
    if answers is not None:
        if len(answers) != len(agents):
            raise ValueError(f"{len(answers)} answers for {len(agents)} agents")
        actions = "\n\n".join(f"[Agent {k} action]\n{answer}" for k, answer in enumerate(answers))
        text += "\n\n[Joint Action]\n\n" + actions
    return text

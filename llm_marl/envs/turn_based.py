"""AECWrapper: a PettingZoo AEC (turn-based) environment as a parallel one, for the learners.

``AECWrapper(aec_env)``

=====================  ====================================================================
Agents                 the AEC env's (``possible_agents``; live ``agents`` as it removes them)
Acting agents          one per step: the AEC env's ``agent_selection``; :attr:`acting_agents`
                       and every info's ``"acting_agents"`` name it (``[]`` once it has ended)
Spaces                 the AEC env's (one object per agent)
Observations           every live agent's ``observe(agent)`` after each step
Step                   ``step(actions)`` plays the acting agent's action (other agents' entries
                       may be given and are ignored), then steps agents that are done with
                       ``None`` (as the AEC API requires) until a live agent is selected
Rewards                per agent, the rewards the AEC env gave during this step (summed over
                       the ``None`` steps too)
Terminations           the AEC env's; an agent leaves ``agents`` when the AEC env removes it
=====================  ====================================================================

Forking (for rollout trees) deep-copies the AEC env. The rollout trees ask only the acting agent
for answers at each node, so its tree branches on that agent alone (learners/tree.py).
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

from pettingzoo import AECEnv, ParallelEnv


class AECWrapper(ParallelEnv):
    """A PettingZoo AEC environment played through the parallel API, one acting agent per step."""

    def __init__(self, env: AECEnv):
        if not isinstance(env, AECEnv) and not hasattr(env, "agent_selection"):
            raise TypeError(f"AECWrapper needs a PettingZoo AEC env (with agent_selection), got {type(env).__name__}")
        self.env = env
        self.possible_agents = list(env.possible_agents)
        self.agents: list[str] = []
        self.metadata = dict(getattr(env, "metadata", {}))
        self.render_mode = getattr(env, "render_mode", None)
        self._observation_spaces: dict[Any, Any] = {}
        self._action_spaces: dict[Any, Any] = {}

    def observation_space(self, agent: Any) -> Any:
        if agent not in self._observation_spaces:  # one object per agent, as PettingZoo asks
            self._observation_spaces[agent] = self.env.observation_space(agent)
        return self._observation_spaces[agent]

    def action_space(self, agent: Any) -> Any:
        if agent not in self._action_spaces:
            self._action_spaces[agent] = self.env.action_space(agent)
        return self._action_spaces[agent]

    @property
    def acting_agents(self) -> list[Any]:
        """The agent that acts next (a list of one), or [] once the episode has ended."""
        return [self.env.agent_selection] if self.env.agents else []

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None):
        self.env.reset(seed=seed, options=options)
        rewards = self._skip_done({a: 0.0 for a in self.possible_agents})
        del rewards
        self.agents = list(self.env.agents)
        return {a: self.env.observe(a) for a in self.agents}, self._infos(self.agents)

    def step(self, actions: Mapping[Any, Any]):
        if not self.env.agents:
            raise ValueError("the episode has ended (or reset() was never called); call reset() first")
        acting = self.env.agent_selection
        if acting not in actions:
            raise ValueError(f"no action for the acting agent {acting!r}")
        before = list(self.env.agents)
        rewards = {a: 0.0 for a in before}
        self.env.step(actions[acting])
        self._add(rewards)
        rewards = self._skip_done(rewards)
        observations = {a: self.env.observe(a) for a in before}
        terminations = {a: bool(self.env.terminations.get(a, a not in self.env.agents)) for a in before}
        truncations = {a: bool(self.env.truncations.get(a, False)) for a in before}
        self.agents = list(self.env.agents)
        return observations, {a: rewards[a] for a in before}, terminations, truncations, self._infos(before)

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()

    def fork(self) -> "AECWrapper":
        """An independent copy in the same state (a deep copy of the AEC env)."""
        return copy.deepcopy(self)

    def _add(self, rewards: dict[Any, float]) -> None:
        for agent, value in self.env.rewards.items():
            if agent in rewards:
                rewards[agent] += float(value)

    def _skip_done(self, rewards: dict[Any, float]) -> dict[Any, float]:
        """Step agents that are done with None until a live one is selected (the AEC API)."""
        while self.env.agents and (
            self.env.terminations.get(self.env.agent_selection, False) or self.env.truncations.get(self.env.agent_selection, False)
        ):
            self.env.step(None)
            self._add(rewards)
        return rewards

    def _infos(self, agents: list[Any]) -> dict[Any, dict[str, Any]]:
        acting = self.acting_agents
        return {a: {**dict(self.env.infos.get(a, {})), "acting_agents": list(acting)} for a in agents}

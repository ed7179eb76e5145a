"""DialogueEnv: a cooperative task as a PettingZoo parallel environment.

=====================  ====================================================================
Agents                 ``task.agents``; those that answer at a turn are
                       ``task.acting_agents(item, history)`` (default: all)
Observation space      :class:`~llm_marl.envs.spaces.Utterance` (any Unicode string)
Action space           :class:`~llm_marl.envs.spaces.Utterance` (any Unicode string)
Rewards                one shared float per turn, equal for every agent; per agent where the
                       task's reward gives a dict agent → float whose values differ
Episode                ``task.num_turns`` turns, or fewer when ``task.is_done`` says so
                       (a task with ``num_turns = None`` has no horizon of its own: only
                       ``is_done`` ends it; learners play their config's ``num_turns``)
Render modes           ``"ansi"`` (the dialogue so far, as text)
=====================  ====================================================================

``reset(seed=None, options=None)`` picks a dataset row — ``options={"index": i}`` picks row
``i``, otherwise a row is drawn with the env's seeded RNG — and returns every agent's first
prompt. ``step(actions)`` takes every acting agent's answer (a string; answers of live agents that
do not act at this turn may be given and are ignored), scores the joint answer with
the task's reward and, unless the episode ends, applies the task's external transition to produce
the next prompts. When the episode ends, every agent is terminated and removed from ``agents`` in
the same step, and its final observation is the empty string (the transition is not called after
the last turn). ``truncations`` are always False: the horizon is part of the task.

Infos: after ``reset`` ``{"turn": 0, "index": i, "acting_agents": [...]}``; after ``step``
``{"turn": t, "index": i, "reward_details": {...}, "acting_agents": [...]}`` where ``t`` is the turn
that was just played (0-based), the details are what the task's reward returned besides the
number, and ``acting_agents`` names the agents that answer at the next turn (every agent unless
the task is turn-based; empty once the episode has ended). :attr:`DialogueEnv.acting_agents` says
the same.

Branching, for rollout trees: ``fork()`` returns an independent environment in the same state
(cheap: the task, dataset and immutable history are shared), and ``step_branches(joint_actions)``
steps one fork per joint answer, scoring them together through the task's batched ``rewards``.
A step can also be taken in two halves, so that the external transition (which may be expensive,
e.g. running tests) only runs for the branches that are continued: ``step_rewards(joint_actions)``
scores every joint answer and returns one :class:`ScoredStep` each (everything ``step`` would
return except the next observations; this env is unchanged), and ``advance(scored)`` returns a
:class:`Branch`: a fork of this env stepped with that joint answer, the transition run now. The
rollout trees use the two halves and advance only the branches that get a child;
``step``/``step_branches`` are exactly ``step_rewards`` followed by ``advance``.

Errors: bad actions (unknown, missing or non-string agents' answers, stepping a finished
episode, an out-of-range ``options["index"]``) raise ``ValueError``. A task whose reward,
transition or initial observations raise or return something invalid raises
:class:`~llm_marl.tasks.base.TaskError` naming the task, item index and turn. Either way the
environment is left exactly as it was before the failing ``step`` or ``reset``.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np
from gymnasium.utils import seeding
from pettingzoo import ParallelEnv

from llm_marl.envs.spaces import Utterance
from llm_marl.tasks.base import CooperativeTask, TaskError, Turn, check_agent_rewards


def check_joint_action(actions: Mapping[str, str], live: Sequence[str], acting: Sequence[str], where: str) -> None:
    """``ValueError`` unless ``actions`` is a dict with a str for every agent in ``acting`` and
    no key outside ``live`` (empty: the episode has ended); ``where`` names the env's place."""
    if not live:
        raise ValueError("the episode has ended (or reset() was never called); call reset() first")
    if not isinstance(actions, Mapping):
        raise ValueError(f"actions must be a dict agent -> str, got {type(actions).__name__}")
    unknown = [a for a in actions if a not in live]
    if unknown:
        raise ValueError(f"actions for unknown or inactive agent(s) {unknown}; live agents are {list(live)}")
    missing = [a for a in acting if a not in actions]
    if missing:
        raise ValueError(f"no action for acting agent(s) {missing} ({where})")
    for agent in acting:
        if not isinstance(actions[agent], str):
            raise ValueError(f"action of agent {agent!r} must be a str, got {type(actions[agent]).__name__}")


class Branch(NamedTuple):
    """One stepped fork: the forked env and what its ``step`` returned."""

    env: "DialogueEnv"
    observations: dict[str, str]
    rewards: dict[str, float]
    terminations: dict[str, bool]
    truncations: dict[str, bool]
    infos: dict[str, dict[str, Any]]


class ScoredStep(NamedTuple):
    """A joint answer scored by :meth:`DialogueEnv.step_rewards` but not yet played: what ``step``
    would return except the next observations (the transition has not run)."""

    actions: dict[str, str]
    rewards: dict[str, float]
    terminations: dict[str, bool]
    truncations: dict[str, bool]
    infos: dict[str, dict[str, Any]]
    history: tuple[Turn, ...]
    """The env's history with this turn appended (checked by ``advance``)."""


class DialogueEnv(ParallelEnv):
    """A :class:`~llm_marl.tasks.base.CooperativeTask` played through PettingZoo's parallel API."""

    metadata = {"name": "dialogue_v0", "render_modes": ["ansi"], "render_fps": 1, "is_parallelizable": True}

    def __init__(self, task: CooperativeTask, split: str = "train", render_mode: str | None = None):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}")
        if not task.agents or len(set(task.agents)) != len(task.agents):
            raise ValueError(f"task {task.task_name}: agents must be non-empty and distinct, got {task.agents!r}")
        if task.num_turns is not None and (
            isinstance(task.num_turns, bool) or not isinstance(task.num_turns, int) or task.num_turns < 1
        ):
            raise ValueError(f"task {task.task_name}: num_turns must be an int >= 1 or None, got {task.num_turns!r}")
        self.task = task
        self.split = split
        self.render_mode = render_mode
        self.metadata = {**self.metadata, "name": f"{task.task_name}_v0"}
        self.possible_agents = list(task.agents)
        self.agents: list[str] = []
        self.data = task.dataset(split)
        if len(self.data) == 0:
            raise ValueError(f"task {task.task_name}: split {split!r} has no rows")
        max_obs = getattr(task, "max_observation_length", 1_000_000)
        max_act = getattr(task, "max_action_length", 1_000_000)
        self._observation_spaces = {a: Utterance(max_obs) for a in self.possible_agents}
        self._action_spaces = {a: Utterance(max_act) for a in self.possible_agents}
        self._np_random, self._np_random_seed = seeding.np_random(None)
        self.item_index: int | None = None
        self.item: Mapping[str, Any] | None = None
        self.history: tuple[Turn, ...] = ()
        self._observations: dict[str, str] = {}
        self._acting: tuple[str, ...] = ()

    # --- PettingZoo API -------------------------------------------------------------------

    def observation_space(self, agent: str) -> Utterance:
        return self._observation_spaces[agent]

    def action_space(self, agent: str) -> Utterance:
        return self._action_spaces[agent]

    @property
    def acting_agents(self) -> list[str]:
        """The agents that answer at the turn about to be played (in agent order); [] when the
        episode has ended or before ``reset``."""
        return list(self._acting) if self.agents else []

    @property
    def turn(self) -> int:
        """The 0-based index of the turn the agents are about to play."""
        return len(self.history)

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None):
        # Validate and compute everything first: a failing reset leaves the env as it was.
        index = (options or {}).get("index")
        if index is not None and (
            isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < len(self.data)
        ):
            raise ValueError(f"options['index'] must be an int in [0, {len(self.data)}), got {index!r}")
        rng, rng_seed = (self._np_random, self._np_random_seed) if seed is None else seeding.np_random(seed)
        if index is None:
            if seed is None:
                # Committed below, only if the reset succeeds. Never draw from self._np_random in
                # place: forks share that object (see fork()).
                rng = copy.deepcopy(rng)
            index = int(rng.integers(len(self.data)))
        index = int(index)
        item = self.data[index]
        observations = self._checked_observations(
            lambda: self.task.initial_observations(item),
            "initial_observations",
            f"task {self.task.task_name}, item {index}, turn 0",
        )
        acting = self._acting_after(item, (), f"task {self.task.task_name}, item {index}, turn 0")
        self._np_random, self._np_random_seed = rng, rng_seed
        self.item_index, self.item, self.history = index, item, ()
        self._observations = observations
        self._acting = acting
        self.agents = list(self.possible_agents)
        return dict(observations), {a: {"turn": 0, "index": index, "acting_agents": list(acting)} for a in self.agents}

    def step(self, actions: Mapping[str, str]):
        self._check_actions(actions)
        [scored] = self._scored([actions])
        return self._commit(scored, self._next_observations(scored))

    def render(self) -> str | None:
        if self.render_mode is None:
            return None
        lines = [f"{self.task.task_name} | split {self.split} | item {self.item_index}"]
        for t, turn in enumerate(self.history):
            lines.append(f"--- turn {t} ---")
            for agent in self.possible_agents:
                lines.append(f"[{agent}] sees: {turn.observations[agent]}")
                if agent in turn.actions:
                    lines.append(f"[{agent}] says: {turn.actions[agent]}")
            if turn.rewards:
                lines.append("rewards: " + ", ".join(f"{a} {v:g}" for a, v in turn.rewards.items()))
            else:
                lines.append(f"reward: {turn.reward:g}")
        if self.agents:
            lines.append(f"--- turn {self.turn} (to play) ---")
            lines.extend(f"[{a}] sees: {self._observations[a]}" for a in self.agents)
        return "\n".join(lines)

    def close(self) -> None:
        pass

    # --- branching --------------------------------------------------------------------------

    def fork(self) -> "DialogueEnv":
        """An independent environment in the same state; stepping it never changes this one."""
        twin = copy.copy(self)
        twin.agents = list(self.agents)
        twin._observations = dict(self._observations)
        # The twin shares the row-drawing generator object: it is never drawn from in place
        # (reset draws from a deep copy and then replaces the attribute), so sharing it is as
        # independent as copying it, and a fork costs no generator copy (~0.6 ms each).
        return twin

    def step_branches(self, joint_actions: Sequence[Mapping[str, str]]) -> list[Branch]:
        """Step one fork of this state per joint answer; this env is left unchanged.

        The joint answers are scored together by the task's batched ``rewards``.
        """
        return [self.advance(scored) for scored in self.step_rewards(joint_actions)]

    def step_rewards(self, joint_actions: Sequence[Mapping[str, str]]) -> list[ScoredStep]:
        """Score every joint answer to this state (together, through the task's batched
        ``rewards``) without playing any of them: no transition runs and this env is unchanged.
        Pass a result to :meth:`advance` to continue that branch."""
        if not self.agents:
            raise ValueError("the episode has ended (or reset() was never called); call reset() first")
        for actions in joint_actions:
            self._check_actions(actions)
        if not joint_actions:
            return []
        return self._scored(joint_actions)

    def advance(self, scored: ScoredStep) -> Branch:
        """A fork of this env stepped with ``scored``'s joint answer (from :meth:`step_rewards`
        on this state); the external transition runs now, unless the episode ends. This env is
        left unchanged."""
        before = scored.history[:-1]
        if len(before) != len(self.history) or any(a is not b for a, b in zip(before, self.history)) or not self.agents:
            raise ValueError("advance() needs a ScoredStep that step_rewards() returned for this env's current state")
        observations = self._next_observations(scored)
        twin = self.fork()
        return Branch(twin, *twin._commit(scored, observations))

    # --- internals --------------------------------------------------------------------------

    def _where(self) -> str:
        return f"task {self.task.task_name}, item {self.item_index}, turn {self.turn}"

    def _check_actions(self, actions: Mapping[str, str]) -> None:
        check_joint_action(actions, self.agents, self._acting, self._where())
        for agent in self._acting:
            action = actions[agent]
            if not self._action_spaces[agent].contains(action):
                raise ValueError(
                    f"action of agent {agent!r} is {len(action)} characters, over the limit of "
                    f"{self._action_spaces[agent].max_length}"
                )

    def _score(self, joint_actions: Sequence[Mapping[str, str]]) -> list[tuple[float | dict[str, float], dict[str, Any]]]:
        where = self._where()
        frozen = [{a: actions[a] for a in self._acting} for actions in joint_actions]
        try:
            values = self.task.rewards(self.item, frozen, self.history)
        except Exception as exc:
            raise TaskError(f"{where}: reward raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(values, Sequence) or len(values) != len(frozen):
            raise TaskError(f"{where}: rewards must return one value per joint answer ({len(frozen)}), got {values!r}")
        checked = []
        for j, value in enumerate(values):
            try:
                checked.append(check_agent_rewards(value, where if len(frozen) == 1 else f"{where}, joint answer {j}", self.possible_agents))
            except (TypeError, ValueError) as exc:
                raise TaskError(str(exc)) from None
        return checked

    def _checked_observations(self, produce, what: str, where: str | None = None) -> dict[str, str]:
        where = where or self._where()
        try:
            observations = produce()
        except Exception as exc:
            raise TaskError(f"{where}: {what} raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(observations, Mapping) or set(observations) != set(self.possible_agents):
            got = sorted(observations) if isinstance(observations, Mapping) else type(observations).__name__
            raise TaskError(f"{where}: {what} must return one prompt per agent {self.possible_agents}, got {got}")
        for agent, text in observations.items():
            if not isinstance(text, str):
                raise TaskError(f"{where}: {what} gave agent {agent!r} a {type(text).__name__}, not a str")
            if not self._observation_spaces[agent].contains(text):
                raise TaskError(
                    f"{where}: {what} gave agent {agent!r} a {len(text)}-character prompt, over the "
                    f"observation limit of {self._observation_spaces[agent].max_length}"
                )
        return {a: observations[a] for a in self.possible_agents}

    def _acting_after(self, item: Mapping[str, Any], history: tuple[Turn, ...], where: str) -> tuple[str, ...]:
        """The task's acting agents after ``history``, checked and in agent order."""
        try:
            acting = self.task.acting_agents(item, history)
        except Exception as exc:
            raise TaskError(f"{where}: acting_agents raised {type(exc).__name__}: {exc}") from exc
        if isinstance(acting, str) or not isinstance(acting, Sequence) or not acting or any(a not in self.possible_agents for a in acting):
            raise TaskError(f"{where}: acting_agents must return a non-empty sequence of agents from {self.possible_agents}, got {acting!r}")
        return tuple(a for a in self.possible_agents if a in acting)

    def _scored(self, joint_actions: Sequence[Mapping[str, str]]) -> list[ScoredStep]:
        """Score checked joint answers and decide, for each, whether the episode ends."""
        played, agents = self.turn, list(self.agents)
        results = []
        for actions, (value, details) in zip(joint_actions, self._score(joint_actions)):
            per_agent = dict(value) if isinstance(value, dict) else {}
            shared = sum(per_agent.values()) / len(per_agent) if per_agent else value
            turn = Turn(self._observations, {a: actions[a] for a in self._acting}, shared, details, per_agent)
            history = self.history + (turn,)
            done = self.task.num_turns is not None and len(history) >= self.task.num_turns
            if not done:
                try:
                    done = bool(self.task.is_done(self.item, history))
                except Exception as exc:
                    raise TaskError(f"{self._where()}: is_done raised {type(exc).__name__}: {exc}") from exc
            acting = [] if done else list(self._acting_after(self.item, history, f"task {self.task.task_name}, item {self.item_index}, turn {played + 1}"))
            infos = {a: {"turn": played, "index": self.item_index, "reward_details": dict(details), "acting_agents": acting} for a in agents}
            results.append(
                ScoredStep(
                    dict(turn.actions),
                    {a: per_agent[a] if per_agent else value for a in agents},
                    {a: done for a in agents},
                    {a: False for a in agents},
                    infos,
                    history,
                )
            )
        return results

    def _next_observations(self, scored: ScoredStep) -> dict[str, str]:
        """The prompts after ``scored``: the task's transition, or empty strings when it ends."""
        if any(scored.terminations.values()):
            return {a: "" for a in scored.infos}
        history = scored.history
        return self._checked_observations(
            lambda: self.task.transition(self.item, dict(history[-1].actions), history), "transition"
        )

    def _commit(self, scored: ScoredStep, observations: dict[str, str]):
        """Make ``scored`` this env's last turn; returns the five dicts of ``step``."""
        agents = list(scored.infos)
        done = any(scored.terminations.values())
        self.history = scored.history
        self._observations = observations
        self._acting = tuple(next(iter(scored.infos.values()))["acting_agents"]) if scored.infos else ()
        self.agents = [] if done else agents
        return (
            dict(observations),
            dict(scored.rewards),
            dict(scored.terminations),
            dict(scored.truncations),
            {a: {**info, "reward_details": dict(info["reward_details"]), "acting_agents": list(info["acting_agents"])} for a, info in scored.infos.items()},
        )

"""What a task author touches: the cooperative dialogue task.

A task is written once, as a subclass of :class:`CooperativeTask`, and is played through
:class:`llm_marl.envs.DialogueEnv` (a PettingZoo parallel environment). At every turn each agent
sees its own observation (a prompt string) and answers with a string (turn-based tasks name the
agents that answer at a turn with :meth:`CooperativeTask.acting_agents`); the joint answer earns
ONE shared reward; the task's external transition turns the joint answer into every agent's next
observation. A task knows nothing about the learners.

A minimal task::

    class Echo(CooperativeTask):
        agents = ("a", "b")
        num_turns = 2

        def dataset(self, split):
            return datasets.Dataset.from_list([{"word": "hi"}, {"word": "yo"}])

        def initial_observations(self, item):
            return {agent: f"say {item['word']}" for agent in self.agents}

        def reward(self, item, actions, history):
            return float(sum(a == item["word"] for a in actions.values()))

        def transition(self, item, actions, history):
            return {agent: f"you said {actions[agent]!r}, say {item['word']}" for agent in self.agents}
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:  # datasets loads when a task builds its data, not when the registry is read
    import datasets

Actions = Mapping[str, str]


def _frozen(mapping: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class Turn:
    """One finished turn: what every agent saw and said, and the shared reward it earned.

    ``observations`` and ``actions`` map agent → text (``actions``: the agents that acted at this
    turn, every agent unless the task is turn-based); ``details`` holds whatever the task's
    reward returned besides the number (e.g. per-level scores, test results). All are
    read-only mappings, so a history (a tuple of turns) can be shared by forked environments.
    ``rewards`` is empty for a shared reward; where the task gave agents different rewards it
    maps agent → reward, and ``reward`` is their mean.
    """

    observations: Mapping[str, str]
    actions: Mapping[str, str]
    reward: float
    details: Mapping[str, Any] = field(default_factory=dict)
    rewards: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "observations", _frozen(self.observations))
        object.__setattr__(self, "actions", _frozen(self.actions))
        object.__setattr__(self, "details", _frozen(self.details))
        object.__setattr__(self, "rewards", _frozen(self.rewards))


History = Sequence[Turn]


class CooperativeTask:
    """Base class of every task.

    Subclasses set ``agents`` (names, in order) and ``num_turns`` (horizon H, >= 1; default 1)
    and implement :meth:`dataset`, :meth:`initial_observations`, :meth:`reward` and
    :meth:`transition`. A trainer's ``num_turns`` must equal the task's; ``num_turns = None``
    declares no horizon (only :meth:`is_done` ends an episode, and a trainer plays its own
    ``num_turns``).
    ``name`` (default: the class name) is used in error messages and rendering.
    """

    agents: tuple[str, ...] = ()
    num_turns: int | None = 1
    name: str | None = None

    def dataset(self, split: str) -> datasets.Dataset:
        """The rows of ``split`` ("train" or "eval"); one row per episode."""
        raise NotImplementedError

    def initial_observations(self, item: Mapping[str, Any]) -> dict[str, str]:
        """Every agent's first prompt for dataset row ``item``."""
        raise NotImplementedError

    def reward(
        self, item: Mapping[str, Any], actions: Actions, history: History
    ) -> float | tuple[float, dict[str, Any]]:
        """The shared reward of the joint answer ``actions``.

        ``history`` holds the turns before this one. Return a float, or ``(float, details)``
        where ``details`` is kept in the history and in the environment's infos. A dict
        agent → float (every agent) in place of the float gives each agent its own reward; only
        learners with per-agent critics (IAC, MAAC) accept rewards that differ.
        """
        raise NotImplementedError

    def rewards(
        self, item: Mapping[str, Any], joint_actions: Sequence[Actions], history: History
    ) -> list[float | tuple[float, dict[str, Any]]]:
        """Rewards of several joint answers to the same state, in order.

        The default calls :meth:`reward` once per joint answer; tasks with expensive rewards
        (running code, calling a judge) override it to work in parallel.
        """
        return [self.reward(item, actions, history) for actions in joint_actions]

    def transition(self, item: Mapping[str, Any], actions: Actions, history: History) -> dict[str, str]:
        """The external transition: every agent's next prompt after the joint answer ``actions``.

        ``history`` holds every turn so far, the one just played last (its reward and details
        included). Not called after the final turn.
        """
        raise NotImplementedError

    def acting_agents(self, item: Mapping[str, Any], history: History) -> tuple[str, ...]:
        """The agents that answer at the turn after ``history`` (default: every agent).

        Turn-based tasks return a non-empty subset of ``agents``, e.g. ``(self.agents[len(history)
        % 2],)`` for two agents taking turns. Only they answer at that turn: the others are not
        asked, and get no sample, log-probability or gradient there; the turn's ``actions`` (in
        :meth:`reward`, :meth:`transition` and the history) hold the acting agents' answers only.
        Every agent still gets an observation and the turn's reward.
        """
        return tuple(self.agents)

    def is_done(self, item: Mapping[str, Any], history: History) -> bool:
        """Whether the episode ends early after the turns in ``history`` (default: never)."""
        return False

    @property
    def task_name(self) -> str:
        return self.name or type(self).__name__


class TaskError(RuntimeError):
    """A task's own code (reward, transition, observations) failed or returned something invalid.

    The message names the task, the dataset item index and the turn; the original exception, if
    any, is chained as ``__cause__``.
    """


def check_reward(value: Any, where: str) -> tuple[float, dict[str, Any]]:
    """Normalize a task's reward to ``(float, details)``; raise naming ``where`` if it is not one."""
    details: dict[str, Any] = {}
    if isinstance(value, tuple):
        if len(value) != 2 or not isinstance(value[1], Mapping):
            raise TypeError(f"{where}: reward must be a number or (number, dict), got {value!r}")
        value, details = value[0], dict(value[1])
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{where}: reward must be a real number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{where}: reward is {value}, not a finite number")
    return value, details


def check_agent_rewards(value: Any, where: str, agents: Sequence[str]) -> tuple[float | dict[str, float], dict[str, Any]]:
    """Like :func:`check_reward`, also accepting a dict agent → number (every agent in ``agents``,
    no other) in place of the number: ``(dict, details)`` when the agents' values differ, else
    ``(shared float, details)``."""
    rewards = value[0] if isinstance(value, tuple) and len(value) == 2 else value
    if not isinstance(rewards, Mapping):
        return check_reward(value, where)
    if rewards is not value and not isinstance(value[1], Mapping):
        raise TypeError(f"{where}: reward must be a number or (number, dict), got {value!r}")
    details = dict(value[1]) if rewards is not value else {}
    if set(rewards) != set(agents):
        raise TypeError(f"{where}: per-agent rewards must name every agent {list(agents)} and no other, got {sorted(map(str, rewards))}")
    checked = {agent: check_reward(rewards[agent], f"{where}, agent {agent!r}")[0] for agent in agents}
    values = list(checked.values())
    if all(v == values[0] for v in values):
        return values[0], details
    return checked, details

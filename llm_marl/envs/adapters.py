"""Numeric adapters: a text environment as arrays, for array-based MARL tooling.

Text spaces stop most MARL tooling: SuperSuit's vector envs cannot batch them, TorchRL turns them
into placeholder strings, and neural-network libraries want shaped spaces. Two wrappers give a
:class:`~llm_marl.envs.DialogueEnv` (or any text ``pettingzoo.ParallelEnv``) numeric spaces while
it stays a ``pettingzoo.ParallelEnv`` that our learners can still fork and branch.

``DiscreteMenuWrapper(env, menus=None, observation="ids", num_ids=2**31)``

=====================  ====================================================================
Agents                 the wrapped env's (``possible_agents`` and live ``agents`` unchanged)
Action space           ``Discrete(len(menus[agent]))``; action ``i`` sends the text
                       ``menus[agent][i]`` to the wrapped env. Default menus: the task's
                       ``menu`` (matrix games), the same for every agent
Observation space      ``observation="ids"``: ``Box(0, num_ids - 1, shape=(1,), int64)``, the
                       stable id of the observation text (see below).
                       ``observation="mask"``: ``Dict({"observation": <that Box>,
                       "action_mask": Box(0, 1, shape=(len(menu),), int8)})`` — PettingZoo's
                       convention; the mask is all ones while the agent is live (every menu
                       answer is always legal) and all zeros in its final observation
Rewards, terminations  the wrapped env's, unchanged (one shared reward for matrix games)
Infos                  the wrapped env's numeric scalar entries only (``turn``, ``index``)
=====================  ====================================================================

``TokenIdsWrapper(env, tokenizer=None, max_length=64, menus=None, truncation_side="left")``

=====================  ====================================================================
Agents                 the wrapped env's
Observation space      ``Box(0, vocab - 1, shape=(max_length,), int64)``: the observation
                       text's token ids, right-padded with ``pad_id``. Without a tokenizer
                       the ids are the text's UTF-8 bytes (vocab 256, ``pad_id`` 0); with a
                       Hugging Face tokenizer, ``tokenizer.encode(text,
                       add_special_tokens=False)`` (vocab ``len(tokenizer)``, ``pad_id`` its
                       pad token, else its EOS token, else 0). Texts longer than
                       ``max_length`` keep their last tokens (``truncation_side="left"``, the
                       newest part of a dialogue prompt) or their first (``"right"``)
Action space           ``menus=None``: the wrapped env's text space, answers passed through
                       unchanged; with ``menus`` (as for DiscreteMenuWrapper, or ``"task"``
                       for the task's menu): ``Discrete(len(menu))`` as above
Rewards, terminations  the wrapped env's, unchanged
Infos                  the wrapped env's numeric scalar entries only
=====================  ====================================================================

Design choices (all deterministic and stateless, so forks, deep copies, pickled copies in
other processes and separate instances agree on every encoding):

- Observation ids are a hash, not a vocabulary grown as texts are seen: ``id(text)`` is the first
  8 bytes of ``blake2b(text.encode("utf-8"))`` (little-endian) modulo ``num_ids``. A grown
  vocabulary would give the same text different ids in different forks or vector-env copies.
  Distinct texts collide with probability about ``1 / num_ids``; pass a small ``num_ids`` to use
  the ids directly as rows of an embedding table (the hashing trick).
- Infos keep only numeric scalars because array tooling (TorchRL) turns every info entry into a
  tensor and needs the same keys after ``reset`` and ``step``; the dropped text reward details
  stay in the wrapped env (``wrapper.unwrapped.history[-1].details`` for a DialogueEnv).
- Actions must be integers (Python or NumPy, or one-element arrays) in ``[0, len(menu))``;
  anything else raises ``ValueError``.
- The wrappers do not forward ``task``: code that rebuilds an environment from ``env.task`` (e.g.
  a trainer's default eval split) would silently get the unwrapped text env. Reach the task with
  ``wrapper.unwrapped.task``. Other public attributes (``data``, ``history``, ``render_mode``,
  ``agents``...) are forwarded to the wrapped env.

Branching: ``fork()`` forks the wrapped env (its ``fork()``, else ``copy.deepcopy``) and wraps
the fork the same way; ``step_branches(joint_actions)`` converts every joint action and steps them
through the wrapped env's ``step_branches`` where it has one (so a task's batched rewards still
score them together), returning wrapped branches.

Typical use::

    env = DiscreteMenuWrapper(make("ClimbingGame-v0"))          # Discrete(3) actions
    vec = supersuit.pettingzoo_env_to_vec_env_v1(env)            # gymnasium vector env
    td = torchrl.envs.PettingZooWrapper(env).rollout(3)        # parallel: read from the env's type
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any, Mapping, Sequence

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv
from pettingzoo.utils.wrappers import BaseParallelWrapper

from llm_marl.envs.dialogue import Branch

__all__ = ["DiscreteMenuWrapper", "TokenIdsWrapper", "text_id"]

OBSERVATION_MODES = ("ids", "mask")
# step_rewards/advance would reach the wrapped env with undecoded actions and return unwrapped
# branches: the adapters branch eagerly through step_branches instead.
_NOT_FORWARDED = frozenset({"env", "task", "step_rewards", "advance"})


def text_id(text: str, num_ids: int = 2**31) -> int:
    """The stable id of ``text`` in ``[0, num_ids)``: a BLAKE2b digest, the same in every process."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % num_ids


def _resolve_menus(env: ParallelEnv, menus: Any) -> dict[Any, tuple[str, ...]]:
    """``menus`` as a dict agent -> tuple of distinct strings the wrapped env accepts."""
    agents = list(env.possible_agents)
    if menus is None or (isinstance(menus, str) and menus == "task"):
        menu = getattr(getattr(env.unwrapped, "task", None), "menu", None)
        if menu is None:
            raise ValueError(
                "no menus given and the wrapped env's task has no `menu`: pass menus={agent: [answers...]} "
                "or one sequence of answers for every agent"
            )
        menus = {agent: menu for agent in agents}
    elif isinstance(menus, str):
        raise ValueError(
            f'menus must be a dict agent -> answers, one sequence of answers, None or "task"; got {menus!r}'
        )
    elif not isinstance(menus, Mapping):
        menus = {agent: menus for agent in agents}
    if set(menus) != set(agents):
        raise ValueError(f"menus are for agents {sorted(menus, key=str)}, but the env's agents are {agents}")
    resolved = {}
    for agent in agents:
        menu = menus[agent]
        if isinstance(menu, str) or not isinstance(menu, Sequence) or len(menu) == 0:
            raise ValueError(f"menu of agent {agent!r} must be a non-empty sequence of strings, got {menu!r}")
        menu = tuple(menu)
        if not all(isinstance(answer, str) for answer in menu):
            raise ValueError(f"menu of agent {agent!r} must hold strings, got {menu!r}")
        if len(set(menu)) != len(menu):
            raise ValueError(f"menu of agent {agent!r} has repeated answers: {menu!r}")
        inner = env.action_space(agent)
        rejected = [answer for answer in menu if not inner.contains(answer)]
        if rejected:
            raise ValueError(f"the wrapped env's action space {inner} rejects agent {agent!r}'s answers {rejected!r}")
        resolved[agent] = menu
    return resolved


def _numeric_infos(infos: Mapping[Any, Mapping[str, Any]]) -> dict[Any, dict[str, Any]]:
    """Each agent's info entries whose values are numeric scalars (bools, ints, floats)."""
    return {
        agent: {key: value for key, value in info.items() if isinstance(value, (bool, int, float, np.number, np.bool_))}
        for agent, info in infos.items()
    }


class _NumericAdapter(BaseParallelWrapper):
    """Shared machinery: encode observations, decode actions, filter infos, fork and branch."""

    _suffix = "numeric"

    def __init__(self, env: ParallelEnv, menus: Mapping[Any, tuple[str, ...]] | None):
        if not isinstance(env, ParallelEnv):
            raise TypeError(f"env must be a pettingzoo.ParallelEnv, got {type(env).__name__}")
        super().__init__(env)
        self.menus = None if menus is None else dict(menus)
        metadata = dict(getattr(env, "metadata", None) or {})
        self.metadata = {**metadata, "name": f"{metadata.get('name', type(env).__name__)}_{self._suffix}"}
        agents = list(env.possible_agents)
        if self.menus is None:
            self.action_spaces = {agent: env.action_space(agent) for agent in agents}
        else:
            self.action_spaces = {agent: spaces.Discrete(len(self.menus[agent])) for agent in agents}
        self.observation_spaces = {agent: self._observation_space(agent) for agent in agents}

    # --- to specialize --------------------------------------------------------------------------

    def _observation_space(self, agent: Any) -> spaces.Space:
        raise NotImplementedError

    def _encode(self, agent: Any, observation: Any, live: bool) -> Any:
        raise NotImplementedError

    # --- PettingZoo API --------------------------------------------------------------------------

    def __getattr__(self, name: str):
        if name in _NOT_FORWARDED:
            hint = " (use .unwrapped.task: an env rebuilt from it would lack this wrapper)" if name == "task" else ""
            raise AttributeError(f"{type(self).__name__} does not forward {name!r}{hint}")
        return super().__getattr__(name)

    def observation_space(self, agent: Any) -> spaces.Space:
        return self.observation_spaces[agent]

    def action_space(self, agent: Any) -> spaces.Space:
        return self.action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None):
        observations, infos = self.env.reset(seed=seed, options=options)
        live = set(self.env.agents)
        return self._encode_all(observations, live), _numeric_infos(infos)

    def step(self, actions: Mapping[Any, Any]):
        return self._wrap_step(self.env.step(self.decode_actions(actions)))

    # --- branching -------------------------------------------------------------------------------

    def fork(self) -> "_NumericAdapter":
        """An independent wrapped environment in the same state (the wrapped env forked)."""
        fork = getattr(self.env, "fork", None)
        return self._rewrap(fork() if fork is not None else copy.deepcopy(self.env))

    def step_branches(self, joint_actions: Sequence[Mapping[Any, Any]]) -> list[Branch]:
        """Step one fork of this state per joint action; this env is left unchanged."""
        decoded = [self.decode_actions(actions) for actions in joint_actions]
        step_branches = getattr(self.env, "step_branches", None)
        if step_branches is not None:
            stepped = [tuple(branch) for branch in step_branches(decoded)]
        else:
            stepped = []
            for actions in decoded:
                fork = getattr(self.env, "fork", None)
                twin = fork() if fork is not None else copy.deepcopy(self.env)
                stepped.append((twin, *twin.step(actions)))
        branches = []
        for inner, *result in stepped:
            twin = self._rewrap(inner)
            branches.append(Branch(twin, *twin._wrap_step(tuple(result))))
        return branches

    # --- conversions -----------------------------------------------------------------------------

    def decode_actions(self, actions: Mapping[Any, Any]) -> dict[Any, Any]:
        """The wrapped env's actions for ``actions`` (menu indices become menu answers)."""
        if not isinstance(actions, Mapping):
            raise ValueError(f"actions must be a dict agent -> action, got {type(actions).__name__}")
        unknown = [agent for agent in actions if agent not in self.action_spaces]
        if unknown:
            agents = list(self.possible_agents)
            raise ValueError(f"actions for unknown agent(s) {unknown}; the env's agents are {agents}")
        if self.menus is None:
            return dict(actions)
        return {agent: self.menus[agent][self._menu_index(agent, action)] for agent, action in actions.items()}

    def _menu_index(self, agent: Any, action: Any) -> int:
        value = action
        if isinstance(value, np.ndarray) and value.size == 1:
            value = value.reshape(()).item()
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise ValueError(
                f"action of agent {agent!r} must be an int menu index in [0, {len(self.menus[agent])}), got {action!r}"
            )
        if not 0 <= int(value) < len(self.menus[agent]):
            raise ValueError(f"action of agent {agent!r} is {int(value)}, outside [0, {len(self.menus[agent])})")
        return int(value)

    def _rewrap(self, inner: ParallelEnv) -> "_NumericAdapter":
        twin = copy.copy(self)
        twin.env = inner
        return twin

    def _encode_all(self, observations: Mapping[Any, Any], live: set) -> dict[Any, Any]:
        return {agent: self._encode(agent, obs, agent in live) for agent, obs in observations.items()}

    def _wrap_step(self, result: tuple) -> tuple:
        observations, rewards, terminations, truncations, infos = result
        live = set(self.env.agents)
        return (
            self._encode_all(observations, live),
            dict(rewards),
            dict(terminations),
            dict(truncations),
            _numeric_infos(infos),
        )


def _text(agent: Any, observation: Any) -> str:
    if not isinstance(observation, str):
        raise TypeError(f"observation of agent {agent!r} is a {type(observation).__name__}; the adapters encode text")
    return observation


class DiscreteMenuWrapper(_NumericAdapter):
    """Discrete menu actions and hashed-id observations (see the module docstring)."""

    _suffix = "menu"

    def __init__(
        self,
        env: ParallelEnv,
        menus: Mapping[Any, Sequence[str]] | Sequence[str] | None = None,
        observation: str = "ids",
        num_ids: int = 2**31,
    ):
        if observation not in OBSERVATION_MODES:
            raise ValueError(f"observation must be one of {OBSERVATION_MODES}, got {observation!r}")
        if isinstance(num_ids, bool) or not isinstance(num_ids, int) or not 1 <= num_ids <= 2**62:
            raise ValueError(f"num_ids must be an int in [1, 2**62], got {num_ids!r}")
        self.observation_mode = observation
        self.num_ids = num_ids
        super().__init__(env, _resolve_menus(env, menus))

    def _observation_space(self, agent: Any) -> spaces.Space:
        ids = spaces.Box(low=0, high=self.num_ids - 1, shape=(1,), dtype=np.int64)
        if self.observation_mode == "ids":
            return ids
        mask = spaces.Box(low=0, high=1, shape=(len(self.menus[agent]),), dtype=np.int8)
        return spaces.Dict({"observation": ids, "action_mask": mask})

    def _encode(self, agent: Any, observation: Any, live: bool) -> Any:
        ids = np.array([text_id(_text(agent, observation), self.num_ids)], dtype=np.int64)
        if self.observation_mode == "ids":
            return ids
        mask = np.full(len(self.menus[agent]), 1 if live else 0, dtype=np.int8)
        return {"observation": ids, "action_mask": mask}


class TokenIdsWrapper(_NumericAdapter):
    """Fixed-length token-id observations; text or menu actions (see the module docstring)."""

    _suffix = "tokens"

    def __init__(
        self,
        env: ParallelEnv,
        tokenizer: Any = None,
        max_length: int = 64,
        menus: Mapping[Any, Sequence[str]] | Sequence[str] | str | None = None,
        truncation_side: str = "left",
    ):
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
            raise ValueError(f"max_length must be an int >= 1, got {max_length!r}")
        if truncation_side not in ("left", "right"):
            raise ValueError(f'truncation_side must be "left" or "right", got {truncation_side!r}')
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.truncation_side = truncation_side
        if tokenizer is None:
            self.vocab_size, self.pad_id = 256, 0
        else:
            self.vocab_size = len(tokenizer) if hasattr(tokenizer, "__len__") else int(tokenizer.vocab_size)
            pad = getattr(tokenizer, "pad_token_id", None)
            pad = getattr(tokenizer, "eos_token_id", None) if pad is None else pad
            self.pad_id = 0 if pad is None else int(pad)
        super().__init__(env, None if menus is None else _resolve_menus(env, menus))

    def encode(self, text: str) -> np.ndarray:
        """``text`` as a ``(max_length,)`` int64 array of token ids, truncated and right-padded."""
        if self.tokenizer is None:
            ids = list(text.encode("utf-8"))
        else:
            ids = [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]
        if len(ids) > self.max_length:
            ids = ids[-self.max_length :] if self.truncation_side == "left" else ids[: self.max_length]
        out = np.full(self.max_length, self.pad_id, dtype=np.int64)
        out[: len(ids)] = ids
        return out

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """The text of an encoded observation, trailing padding removed (a text that itself ends
        in the pad id loses it; a truncation inside a multi-byte character decodes as U+FFFD)."""
        ids = [int(i) for i in np.asarray(ids).reshape(-1)]
        while ids and ids[-1] == self.pad_id:
            ids.pop()
        if self.tokenizer is None:
            return bytes(ids).decode("utf-8", errors="replace")
        return self.tokenizer.decode(ids)

    def _observation_space(self, agent: Any) -> spaces.Space:
        return spaces.Box(low=0, high=self.vocab_size - 1, shape=(self.max_length,), dtype=np.int64)

    def _encode(self, agent: Any, observation: Any, live: bool) -> Any:
        return self.encode(_text(agent, observation))

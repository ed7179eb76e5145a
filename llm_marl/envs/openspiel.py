"""OpenSpielEnv: a cooperative OpenSpiel game as a PettingZoo parallel environment.

``OpenSpielEnv(game, params=None, *, observation_type=None, text=False, on_illegal="end",
illegal_reward=None, illegal_penalty=None, num_items=1000, split="train", render_mode=None,
common_payoff=None)`` needs the optional
``open-spiel`` package (``pip install llm_marl[games]``).

=====================  ====================================================================
Game                   any pyspiel game (a name, with ``params``, or a loaded ``pyspiel.Game``)
                       whose players share one payoff: utility ``IDENTICAL`` (OpenSpiel's
                       common-payoff kind); a ``GENERAL_SUM`` game whose players always get the
                       same rewards (e.g. ``trade_comm``) with ``common_payoff=True`` (then any
                       step where they differ raises ``ValueError``)
Agents                 ``player_0`` … ``player_{N-1}``
Acting agents          the current player (sequential games) or every player (simultaneous
                       moves); :attr:`acting_agents` and every info's ``"acting_agents"``
Observations           each player's information-state string (``observation_type=
                       "information_state"``, the default where the game provides it) or
                       observation string (``"observation"``): a hashable key for tabular
                       policies. With ``text=True`` a prompt for a language model: the game's
                       name, the player, that string, and for the acting player "Which move do
                       you make? Choose one of: " its legal moves (SmolLM2-135M-Instruct's
                       first answers name a legal move about half the time with this wording,
                       under 5% with "Legal moves: ... Answer with one legal move.")
Actions                ``Discrete(num_distinct_actions)`` (``text=True``: any string). ``step``
                       takes an action id, or a string parsed to a legal move: the move's name
                       (``action_to_string``; case, spacing and enclosing brackets ignored), else a
                       legal action id written as a number, else the one legal move's name that
                       the text contains as a word
Legal moves            infos: ``"legal_moves"`` (names), ``"legal_actions"`` (ids) and
                       ``"action_mask"`` (a tuple of 0/1 per action id; all 0 for an agent that
                       does not act); :meth:`action_mask` gives it as a numpy array
Illegal answers        ``on_illegal="end"`` (the default): an illegal or unparsable answer ends
                       the episode at once with reward ``illegal_reward`` (default: the game's
                       minimum utility) for every agent. ``on_illegal="random"``: the game goes
                       on; a legal move drawn at random (uniformly, from a stream keyed by the
                       item, the moves so far and the player, so branches and resumes draw the
                       same one) is played in its place, and the step's shared reward is the
                       game's reward plus ``illegal_penalty`` (default -1) per illegal answer.
                       Either way ``reward_details["illegal"]`` names the agents that answered
                       illegally (the learners log ``train/<agent>/illegal_rate`` from it), and
                       ``reward_details["moves"]`` gives each acting agent's move played (the
                       substitute, for an illegal answer in "random" mode; None where the
                       episode ended). Never an exception
Rewards                per step, the change in the (shared) returns; one float, equal for all
Chance                 chance outcomes are drawn by the env, never by the game: from a random
                       stream keyed by the episode's item and the history of actions so far,
                       so a branch, a fork or a resumed run meets the same chance outcomes
Items                  ``reset(options={"index": i})`` plays item ``i`` of ``num_items`` (its
                       chance stream; ``split`` keys a separate set); otherwise a seeded draw
Episode                until the game state is terminal; ``num_turns`` is the game's
                       ``max_game_length()``
Forking                ``fork()`` clones the game state (``State.clone()``)
Render modes           ``"ansi"``: the game state as text
=====================  ====================================================================

Registered ids (``llm_marl.envs.make``): ``TinyHanabi-A-v0`` … ``TinyHanabi-F-v0`` (the Tiny
Hanabi suite's payoffs, :data:`TINY_HANABI`), ``Hanabi-Small-v0`` (2 players, 2 colours, 5 ranks,
hand size 2, 3 information tokens, 1 life), ``Hanabi-Small-RandomOnIllegal-v0`` (the same
with ``on_illegal="random"``), ``CoopBoxPushing-v0``, ``TradeComm-v0`` and
``make("OpenSpiel-v0", game=NAME, params={...})`` for any other game.
"""

from __future__ import annotations

import copy
import hashlib
import re
from typing import Any, Mapping

import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding
from pettingzoo import ParallelEnv

from llm_marl.envs.spaces import Utterance

MISSING = "OpenSpiel games need the open-spiel package: pip install 'llm_marl[games]'"

# The Tiny Hanabi suite: payoff[card of player 0][card of player 1][action 0][action 1], and the
# published optimal expected returns. Game E is OpenSpiel's default tiny_hanabi payoff.
TINY_HANABI: dict[str, tuple[list, float]] = {
    "A": ([[[[0, 1], [0, 0]], [[0, 1], [3, 2]]], [[[3, 3], [3, 2]], [[2, 0], [3, 3]]]], 2.25),
    "B": ([[[[1, 0], [1, 0]], [[0, 1], [0, 1]]], [[[0, 1], [0, 0]], [[1, 0], [1, 0]]]], 1.0),
    "C": ([[[[3, 0], [0, 3]], [[2, 0], [3, 3]]], [[[2, 2], [3, 0]], [[0, 1], [0, 2]]]], 2.5),
    "D": ([[[[3, 0], [1, 3]], [[3, 0], [3, 0]]], [[[3, 2], [0, 2]], [[0, 1], [0, 0]]]], 2.5),
    "E": (
        [
            [[[10, 0, 0], [4, 8, 4], [10, 0, 0]], [[0, 0, 10], [4, 8, 4], [0, 0, 10]]],
            [[[0, 0, 10], [4, 8, 4], [0, 0, 0]], [[10, 0, 0], [4, 8, 4], [10, 0, 0]]],
        ],
        10.0,
    ),
    "F": (
        [
            [[[0, 3], [3, 2]], [[0, 0], [0, 1]], [[3, 1], [2, 1]]],
            [[[0, 2], [0, 1]], [[1, 2], [1, 2]], [[0, 1], [0, 3]]],
            [[[1, 3], [1, 2]], [[0, 3], [2, 2]], [[3, 1], [3, 0]]],
        ],
        7 / 3,
    ),
}

ON_ILLEGAL = ("end", "random")  # what an illegal or unparsable answer does (module docstring)

HANABI_SMALL = {"players": 2, "colors": 2, "ranks": 5, "hand_size": 2, "max_information_tokens": 3, "max_life_tokens": 1}


def pyspiel_module() -> Any:
    """``pyspiel``, or ImportError naming the ``games`` extra."""
    try:
        import pyspiel
    except ImportError:
        raise ImportError(MISSING) from None
    return pyspiel


def tiny_hanabi_params(game: str) -> dict[str, Any]:
    """OpenSpiel ``tiny_hanabi`` parameters of suite game ``game`` ("A" … "F")."""
    if game not in TINY_HANABI:
        raise ValueError(f"Tiny Hanabi game must be one of {sorted(TINY_HANABI)}, got {game!r}")
    payoff = np.asarray(TINY_HANABI[game][0], dtype=float)
    cards, _, actions, _ = payoff.shape
    return {"num_players": 2, "num_chance": cards, "num_actions": actions, "payoff": ";".join(f"{v:g}" for v in payoff.flatten())}


def _norm(text: str) -> str:
    """A move name or answer compared loosely: lower case, single spaces, no enclosing brackets."""
    return re.sub(r"\s+", " ", text.strip().strip("()[]{}.").strip().lower())


def _stream_seed(*parts: Any) -> int:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class OpenSpielEnv(ParallelEnv):
    """A common-payoff OpenSpiel game played through PettingZoo's parallel API (module docstring)."""

    metadata = {"name": "openspiel_v0", "render_modes": ["ansi"], "render_fps": 1, "is_parallelizable": True}

    def __init__(
        self,
        game: Any = "tiny_hanabi",
        params: Mapping[str, Any] | None = None,
        *,
        observation_type: str | None = None,
        text: bool = False,
        on_illegal: str = "end",
        illegal_reward: float | None = None,
        illegal_penalty: float | None = None,
        num_items: int = 1000,
        split: str = "train",
        render_mode: str | None = None,
        common_payoff: bool | None = None,
        name: str | None = None,
    ):
        pyspiel = pyspiel_module()
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}")
        if isinstance(game, str):
            try:
                game = pyspiel.load_game(game, dict(params or {}))
            except Exception as exc:  # pyspiel raises its own error types
                raise ValueError(f"OpenSpiel could not load game {game!r} with params {dict(params or {})}: {exc}") from None
        elif params:
            raise ValueError("params go with a game name, not with a loaded pyspiel.Game")
        self.game = game
        kind = game.get_type()
        self.game_name = name or kind.short_name
        utility = kind.utility
        shared = utility == pyspiel.GameType.Utility.IDENTICAL
        if not shared and not (common_payoff and utility == pyspiel.GameType.Utility.GENERAL_SUM):
            raise ValueError(
                f"OpenSpiel game {self.game_name!r} has {utility}; OpenSpielEnv plays games whose players share one payoff "
                "(IDENTICAL, or GENERAL_SUM with common_payoff=True)"
            )
        self.common_payoff_checked = not shared
        if observation_type is None:
            observation_type = "information_state" if kind.provides_information_state_string else "observation"
        if observation_type not in ("information_state", "observation"):
            raise ValueError(f"observation_type must be 'information_state' or 'observation', got {observation_type!r}")
        provided = kind.provides_information_state_string if observation_type == "information_state" else kind.provides_observation_string
        if not provided:
            raise ValueError(f"OpenSpiel game {self.game_name!r} provides no {observation_type} string")
        if num_items < 1:
            raise ValueError(f"num_items must be >= 1, got {num_items}")
        self.observation_type = observation_type
        self.text = bool(text)
        if on_illegal not in ON_ILLEGAL:
            raise ValueError(f"on_illegal must be one of {list(ON_ILLEGAL)}, got {on_illegal!r}")
        if on_illegal == "end" and illegal_penalty is not None:
            raise ValueError("illegal_penalty goes with on_illegal='random'; with 'end' an illegal answer's reward is illegal_reward")
        if on_illegal == "random" and illegal_reward is not None:
            raise ValueError("illegal_reward goes with on_illegal='end'; with 'random' the step's reward gets illegal_penalty added")
        self.on_illegal = on_illegal
        self.illegal_reward = float(game.min_utility() if illegal_reward is None else illegal_reward)
        self.illegal_penalty = float(-1.0 if illegal_penalty is None else illegal_penalty)
        self.num_items = int(num_items)
        self.split = split
        self.render_mode = render_mode
        self.simultaneous = kind.dynamics == pyspiel.GameType.Dynamics.SIMULTANEOUS
        self.num_turns = int(game.max_game_length())
        self.metadata = {**self.metadata, "name": f"{self.game_name}_v0"}
        self.possible_agents = [f"player_{p}" for p in range(game.num_players())]
        self.agents: list[str] = []
        self._observation_spaces = {a: Utterance(1_000_000) for a in self.possible_agents}
        num_actions = game.num_distinct_actions()
        self._action_spaces = {
            a: Utterance(10_000) if self.text else spaces.Discrete(num_actions) for a in self.possible_agents
        }
        self._np_random, self._np_random_seed = seeding.np_random(None)
        self.item_index: int | None = None
        self.state: Any = None
        self._returns = np.zeros(len(self.possible_agents))
        self._ended = False

    # --- PettingZoo API -------------------------------------------------------------------

    def observation_space(self, agent: str) -> Utterance:
        return self._observation_spaces[agent]

    def action_space(self, agent: str) -> Any:
        return self._action_spaces[agent]

    @property
    def acting_agents(self) -> list[str]:
        """The agents that act next: the current player, or every player at a simultaneous
        node; [] when the episode has ended or before ``reset``."""
        if not self.agents or self.state is None or self.state.is_terminal():
            return []
        if self.state.is_simultaneous_node():
            return [a for p, a in enumerate(self.possible_agents) if self.state.legal_actions(p)]
        return [self.possible_agents[self.state.current_player()]]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None):
        index = (options or {}).get("index")
        if index is not None and (isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < self.num_items):
            raise ValueError(f"options['index'] must be an int in [0, {self.num_items}), got {index!r}")
        if seed is not None:
            self._np_random, self._np_random_seed = seeding.np_random(seed)
        if index is None:
            # Never draw from self._np_random in place: forks share that object (see fork()).
            rng = copy.deepcopy(self._np_random)
            index = int(rng.integers(self.num_items))
            self._np_random = rng
        self.item_index = int(index)
        self.state = self.game.new_initial_state()
        self._resolve_chance()
        self._returns = np.asarray(self.state.returns(), dtype=float)
        self._ended = False
        self.agents = list(self.possible_agents)
        return self._observations(), self._infos(None)

    def step(self, actions: Mapping[str, Any]):
        if not self.agents:
            raise ValueError("the episode has ended (or reset() was never called); call reset() first")
        if not isinstance(actions, Mapping):
            raise ValueError(f"actions must be a dict agent -> action, got {type(actions).__name__}")
        unknown = [a for a in actions if a not in self.agents]
        if unknown:
            raise ValueError(f"actions for unknown or inactive agent(s) {unknown}; live agents are {self.agents}")
        acting = self.acting_agents
        missing = [a for a in acting if a not in actions]
        if missing:
            raise ValueError(f"no action for acting agent(s) {missing} ({self.game_name}, item {self.item_index})")
        chosen, illegal, moves = {}, [], {}
        for agent in acting:
            player = self.possible_agents.index(agent)
            action = self.parse(actions[agent], player)
            if action is None:
                illegal.append(agent)
                if self.on_illegal == "random":
                    action = self._substitute(player)
            if action is None:
                moves[agent] = None
            else:
                chosen[agent] = action
                moves[agent] = self.state.action_to_string(player, action)
        agents = list(self.agents)
        if illegal and self.on_illegal == "end":
            rewards = {a: self.illegal_reward for a in agents}
            self._ended = True
        else:
            if self.simultaneous and self.state.is_simultaneous_node():
                self.state.apply_actions([chosen.get(a, 0) for a in self.possible_agents])
            else:
                self.state.apply_action(chosen[acting[0]])
            self._resolve_chance()
            returns = np.asarray(self.state.returns(), dtype=float)
            delta, self._returns = returns - self._returns, returns
            if np.any(delta != delta[0]):
                raise ValueError(
                    f"OpenSpiel game {self.game_name!r}, item {self.item_index}: players got different rewards {delta.tolist()}; "
                    "OpenSpielEnv plays common-payoff games only"
                )
            rewards = {a: float(delta[0]) + self.illegal_penalty * len(illegal) for a in agents}
            self._ended = self.state.is_terminal()
        details = {"illegal": illegal, "moves": moves}
        observations = self._observations() if not self._ended else {a: "" for a in agents}
        terminations = {a: self._ended for a in agents}
        truncations = {a: False for a in agents}
        if self._ended:
            self.agents = []
        infos = self._infos(details, agents)
        return observations, rewards, terminations, truncations, infos

    def render(self) -> str | None:
        if self.render_mode is None:
            return None
        return f"{self.game_name} | item {self.item_index}\n{self.state}"

    def close(self) -> None:
        pass

    def fork(self) -> "OpenSpielEnv":
        """An independent env in the same state (the game state cloned)."""
        twin = copy.copy(self)
        twin.agents = list(self.agents)
        twin.state = None if self.state is None else self.state.clone()
        twin._returns = self._returns.copy()
        # The twin shares the item generator object: reset never draws from it in place (it draws
        # from a copy and keeps that), so each fork continues a copy of the original's state.
        return twin

    # --- moves ----------------------------------------------------------------------------------

    def legal_actions(self, agent: str) -> list[int]:
        """``agent``'s legal action ids now ([] where it does not act)."""
        if agent not in self.acting_agents:
            return []
        return list(self.state.legal_actions(self.possible_agents.index(agent)))

    def legal_moves(self, agent: str) -> list[str]:
        """The names of ``agent``'s legal moves now (the menu), in action-id order."""
        player = self.possible_agents.index(agent)
        return [self.state.action_to_string(player, a) for a in self.legal_actions(agent)]

    def action_mask(self, agent: str) -> np.ndarray:
        """1 for each of ``agent``'s legal action ids now, else 0 (int8, one per action id)."""
        mask = np.zeros(self.game.num_distinct_actions(), dtype=np.int8)
        mask[self.legal_actions(agent)] = 1
        return mask

    def parse(self, answer: Any, player: int) -> int | None:
        """The legal action id ``answer`` names for ``player``, or None (illegal or unparsable)."""
        legal = list(self.state.legal_actions(player))
        if isinstance(answer, (int, np.integer)) and not isinstance(answer, bool):
            return int(answer) if int(answer) in legal else None
        if not isinstance(answer, str):
            return None
        names = {_norm(self.state.action_to_string(player, a)): a for a in legal}
        text = _norm(answer)
        if text in names:
            return names[text]
        if re.fullmatch(r"[0-9]+", text) and int(text) in legal:
            return int(text)
        found = [a for name, a in names.items() if name and re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", text)]
        return found[0] if len(found) == 1 else None

    def expected_return(self, probabilities: Any) -> float:
        """The exact expected return (player 0's; every player's in a common-payoff game) of a
        joint policy from the initial state, every chance outcome and every action enumerated.

        ``probabilities(agent, observation, legal_actions)`` gives the acting agent's
        probability of each legal action id at its observation (this env's observation for that
        state, e.g. the information-state string); zero-probability actions are not followed.
        Only for games small enough to enumerate (the Tiny Hanabi suite: a few dozen states).
        """
        saved = self.state, self.agents
        self.agents = list(self.possible_agents)
        try:
            return self._value(self.game.new_initial_state(), probabilities)
        finally:
            self.state, self.agents = saved

    def _value(self, state: Any, probabilities: Any) -> float:
        if state.is_terminal():
            return float(state.returns()[0])
        if state.is_chance_node():
            total = 0.0
            for action, p in state.chance_outcomes():
                child = state.clone()
                child.apply_action(action)
                total += p * self._value(child, probabilities)
            return total
        if state.is_simultaneous_node():
            raise ValueError("expected_return enumerates sequential games only")
        self.state = state
        agent = self.possible_agents[state.current_player()]
        legal = list(state.legal_actions())
        weights = [float(w) for w in probabilities(agent, self._observation(agent), legal)]
        if len(weights) != len(legal):
            raise ValueError(f"probabilities gave {len(weights)} values for {len(legal)} legal actions of {agent}")
        total = 0.0
        for action, w in zip(legal, weights):
            if w > 0:
                child = state.clone()
                child.apply_action(action)
                total += w * self._value(child, probabilities)
        return total

    # --- internals --------------------------------------------------------------------------

    def _resolve_chance(self) -> None:
        """Draw chance outcomes from the stream keyed by (split, item, history)."""
        while self.state.is_chance_node():
            outcomes = self.state.chance_outcomes()
            rng = np.random.default_rng(_stream_seed("openspiel", self.split, self.item_index, tuple(self.state.history())))
            probabilities = np.asarray([p for _, p in outcomes], dtype=float)
            pick = rng.choice(len(outcomes), p=probabilities / probabilities.sum())
            self.state.apply_action(outcomes[int(pick)][0])

    def _substitute(self, player: int) -> int:
        """A legal move of ``player`` drawn uniformly from the stream keyed by (split, item,
        history, player): the move played for an illegal answer with ``on_illegal="random"``."""
        legal = list(self.state.legal_actions(player))
        rng = np.random.default_rng(_stream_seed("illegal", self.split, self.item_index, tuple(self.state.history()), player))
        return legal[int(rng.integers(len(legal)))]

    def _observation(self, agent: str) -> str:
        player = self.possible_agents.index(agent)
        if self.observation_type == "information_state":
            seen = self.state.information_state_string(player)
        else:
            seen = self.state.observation_string(player)
        if not self.text:
            return seen
        head = f"{self.game_name}: you are player {player}.\n{seen}\n"
        if agent in self.acting_agents:
            return head + f"Which move do you make? Choose one of: {', '.join(self.legal_moves(agent))}."
        return head + "Wait for the other player."

    def _observations(self) -> dict[str, str]:
        return {a: self._observation(a) for a in self.agents}

    def _infos(self, details: dict[str, Any] | None, agents: list[str] | None = None) -> dict[str, dict[str, Any]]:
        agents = self.agents if agents is None else agents
        acting = self.acting_agents
        infos = {}
        for agent in agents:
            info: dict[str, Any] = {"index": self.item_index, "acting_agents": list(acting)}
            if details is not None:
                info["reward_details"] = {"illegal": list(details["illegal"]), "moves": dict(details["moves"])}
            live = agent in acting
            info["legal_actions"] = self.legal_actions(agent) if live else []
            info["legal_moves"] = self.legal_moves(agent) if live else []
            info["action_mask"] = tuple(int(v) for v in self.action_mask(agent)) if live else (0,) * self.game.num_distinct_actions()
            infos[agent] = info
        return infos


def tiny_hanabi(game: str = "E", **kwargs: Any) -> OpenSpielEnv:
    """Tiny Hanabi suite game ``game`` ("A" … "F") as an :class:`OpenSpielEnv`."""
    return OpenSpielEnv("tiny_hanabi", tiny_hanabi_params(game), name=f"tiny_hanabi_{game}", **kwargs)


def hanabi_small(**kwargs: Any) -> OpenSpielEnv:
    """2-player Hanabi, small configuration (:data:`HANABI_SMALL`)."""
    params = {**HANABI_SMALL, **dict(kwargs.pop("params", None) or {})}
    return OpenSpielEnv("hanabi", params, name="hanabi_small", **kwargs)


def coop_box_pushing(**kwargs: Any) -> OpenSpielEnv:
    """OpenSpiel's cooperative box pushing (simultaneous moves)."""
    return OpenSpielEnv("coop_box_pushing", kwargs.pop("params", None), **kwargs)


def trade_comm(**kwargs: Any) -> OpenSpielEnv:
    """OpenSpiel's trade_comm (both players always get the same reward; GENERAL_SUM by type)."""
    return OpenSpielEnv("trade_comm", kwargs.pop("params", None), common_payoff=True, **kwargs)

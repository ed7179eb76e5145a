"""Matrix games: the fast playground for toy policies.

Two agents, ``"row"`` and ``"column"``, each answer with one word of a menu; the shared reward is
the payoff-matrix entry of the joint answer (row agent's word picks the row).

=======================  =================================================================
Agents                   ``("row", "column")``
Actions                  one word of ``menu`` (default ``("alpha", "beta", "gamma")``);
                         case and surrounding whitespace are ignored, anything else is an
                         invalid answer and earns ``invalid_reward`` (default: the matrix
                         minimum)
Reward                   ``payoff[row_word][column_word]``, shared
Turns                    1 (one-shot) or ``num_turns`` (repeated: the transition tells each
                         agent what its partner said last turn)
Dataset                  one row (the game has a single initial state)
=======================  =================================================================

Games (Claus & Boutilier, 1998, "The dynamics of reinforcement learning in cooperative
multiagent systems")::

    climbing            a    b    c          penalty (k <= 0)     a   b   c
                  a    11  -30    0                         a    10   0   k
                  b   -30    7    6                         b     0   2   0
                  c     0    0    5                         c     k   0  10

    coordination (diagonal payoffs differ, off-diagonal 0)
                  a   b   c
              a  1.0  0   0
              b   0  0.6  0
              c   0   0  0.3

Climbing has one optimum (a, a) guarded by -30 miscoordination penalties; independent learners
with average-based credit settle on (b, b) or (c, c) ("relative overgeneralization"). Penalty
has two optima (a, a) and (c, c) whose miscoordination costs ``k``; (b, b) is the safe
suboptimal equilibrium.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import datasets

from llm_marl.tasks.base import CooperativeTask

CLIMBING = ((11.0, -30.0, 0.0), (-30.0, 7.0, 6.0), (0.0, 0.0, 5.0))
COORDINATION = ((1.0, 0.0, 0.0), (0.0, 0.6, 0.0), (0.0, 0.0, 0.3))


def penalty_matrix(k: float = -10.0) -> tuple[tuple[float, ...], ...]:
    """The penalty game's payoffs for miscoordination cost ``k`` (k <= 0)."""
    if k > 0:
        raise ValueError(f"penalty k must be <= 0, got {k}")
    return ((10.0, 0.0, k), (0.0, 2.0, 0.0), (k, 0.0, 10.0))


class MatrixGame(CooperativeTask):
    """A two-agent cooperative matrix game over a word menu, one-shot or repeated."""

    agents = ("row", "column")

    def __init__(
        self,
        payoff: Sequence[Sequence[float]],
        *,
        menu: Sequence[str] = ("alpha", "beta", "gamma"),
        num_turns: int = 1,
        invalid_reward: float | None = None,
        name: str = "MatrixGame",
    ):
        self.payoff = tuple(tuple(float(v) for v in row) for row in payoff)
        self.menu = tuple(word.lower() for word in menu)
        if len(self.payoff) != len(self.menu) or any(len(row) != len(self.menu) for row in self.payoff):
            raise ValueError(f"payoff must be a {len(self.menu)}x{len(self.menu)} matrix for menu {self.menu}")
        if num_turns < 1:
            raise ValueError(f"num_turns must be >= 1, got {num_turns}")
        self.num_turns = num_turns
        self.invalid_reward = min(min(row) for row in self.payoff) if invalid_reward is None else invalid_reward
        self.name = name

    def dataset(self, split: str) -> datasets.Dataset:
        return datasets.Dataset.from_list([{"game": self.name}])

    def _instruction(self) -> str:
        return f"Answer with one word: {', '.join(self.menu)}."

    def initial_observations(self, item: Mapping[str, Any]) -> dict[str, str]:
        rounds = f" Round 1 of {self.num_turns}." if self.num_turns > 1 else ""
        return {agent: f"{self.name}: you are {agent}.{rounds} {self._instruction()}" for agent in self.agents}

    def word(self, answer: str) -> str | None:
        """The menu word an answer names, or None if it names none."""
        word = answer.strip().lower()
        return word if word in self.menu else None

    def reward(self, item, actions, history):
        row, column = self.word(actions["row"]), self.word(actions["column"])
        if row is None or column is None:
            return self.invalid_reward, {"joint": (row, column), "valid": False}
        value = self.payoff[self.menu.index(row)][self.menu.index(column)]
        return value, {"joint": (row, column), "valid": True}

    def transition(self, item, actions, history):
        partner = {"row": "column", "column": "row"}
        t = len(history)
        return {
            agent: (
                f"{self.name}: you are {agent}. Round {t + 1} of {self.num_turns}. "
                f"Your partner said: {actions[partner[agent]].strip().lower() or '(nothing)'}. {self._instruction()}"
            )
            for agent in self.agents
        }


def climbing_game(num_turns: int = 1, **kwargs) -> MatrixGame:
    return MatrixGame(CLIMBING, num_turns=num_turns, name="ClimbingGame", **kwargs)


def penalty_game(k: float = -10.0, num_turns: int = 1, **kwargs) -> MatrixGame:
    return MatrixGame(penalty_matrix(k), num_turns=num_turns, name="PenaltyGame", **kwargs)


def coordination_game(num_turns: int = 1, **kwargs) -> MatrixGame:
    return MatrixGame(COORDINATION, num_turns=num_turns, name="CoordinationGame", **kwargs)

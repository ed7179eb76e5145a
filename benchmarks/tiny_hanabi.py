"""The Tiny Hanabi suite (games A-F) against the published optima, with tabular policies.

Rows: MAGRPO (K answers per node: the player to move branches K ways, so player 0's answers are
scored against K continuations of player 1), MAGRPO with the options against collapse that
``examples/configs/tiny_hanabi.yaml`` sets (optimistic credit: docs/algorithms.md §3.9), IAC (independent actor-critic, tabular critics,
one answer per node) and independent REINFORCE without branching (K = 1, no baseline: the
classic independent learner). Columns: the six games. Each cell: the mean ± standard deviation
over seeds of the final policies' EXACT expected return (every deal and every action enumerated
by ``OpenSpielEnv.expected_return``, no sampling), and how many seeds reach >= 99% of the
optimum.

Every learner trains on the same deals (``--items`` items of the env's chance stream per epoch,
``--items-per-step`` trees per optimizer step) for the same number of epochs (``--epochs``; the
``tiny_hanabi.yaml`` row for the file's ``num_train_epochs``), with the same learning rate; the
settings are printed with the table.

Run: ``python benchmarks/tiny_hanabi.py`` (benchmarks/README.md has the latest table and its run time);
``--games A B --seeds 3`` for a quick look; ``--json PATH`` writes every seed's value.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import ClassVar

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import print_machine  # noqa: E402

from llm_marl.envs.openspiel import TINY_HANABI, tiny_hanabi  # noqa: E402
from llm_marl.learners import IACConfig, IACTrainer, MAGRPOConfig, MAGRPOTrainer  # noqa: E402
from llm_marl.learners.reinforce.config import MAREINFORCEConfig  # noqa: E402
from llm_marl.learners.reinforce.trainer import MAREINFORCETrainer  # noqa: E402
from llm_marl.policies.tabular import TabularPolicy  # noqa: E402


@dataclass
class IndependentREINFORCEConfig(MAREINFORCEConfig):
    """MAREINFORCE with one answer per node: no branching, no baseline (the classic independent learner)."""

    min_generations: ClassVar[int] = 1
    num_generations: int = 1
    """K = 1: one answer per node."""
    advantage_normalization: bool = False
    """A group of one has nothing to normalize against: the advantage is the return."""


class IndependentREINFORCETrainer(MAREINFORCETrainer):
    """MAREINFORCE at K = 1."""

    config_class = IndependentREINFORCEConfig


SHIPPED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "configs", "tiny_hanabi.yaml")
"""The shipped setting (docs/games.md): its row is MAGRPO with this file's options against collapse."""
OPTIONS = ("tree_return_aggregation", "tree_return_temperature", "dynamic_sampling", "dynamic_sampling_budget", "entropy_coef",
           "entropy_coef_final", "agent_learning_rates", "optim", "advantage_normalization", "agent_learning_rate",
           "agent_advantage_normalization", "num_train_epochs")


def shipped_options() -> dict:
    """The options against collapse (docs/algorithms.md §3.9) that examples/configs/tiny_hanabi.yaml sets, and its
    number of epochs (its row trains that long, whatever ``--epochs`` says)."""
    import yaml

    with open(SHIPPED) as f:
        loaded = yaml.safe_load(f)
    return {k: v for k, v in loaded.items() if k in OPTIONS}


LEARNERS = {
    "MAGRPO": (MAGRPOTrainer, MAGRPOConfig),
    "MAGRPO, tiny_hanabi.yaml": (MAGRPOTrainer, MAGRPOConfig),
    "IAC": (IACTrainer, IACConfig),
    "REINFORCE K=1": (IndependentREINFORCETrainer, IndependentREINFORCEConfig),
}


def settings(learner: str, args: argparse.Namespace, seed: int) -> dict:
    common = dict(
        num_turns=2,
        num_train_epochs=args.epochs,
        items_per_step=args.items_per_step,
        rollout_buffer_size=args.items_per_step,  # one optimizer step per batch of trees
        agent_learning_rate=args.lr,
        early_termination_threshold=None,
        eval_interval=0,
        progress_bar=False,
        logging_steps=10**9,
        seed=seed,
    )
    if learner == "MAGRPO, tiny_hanabi.yaml":
        common.update(num_generations=args.k, **shipped_options())
    if learner == "MAGRPO":
        common.update(num_generations=args.k)
        for option in getattr(args, "magrpo_option", None) or []:
            name, _, value = option.partition("=")
            common[name] = _value(value)
    elif learner == "IAC":
        common.update(num_generations=1, critic_learning_rate=args.lr, value_clip_range=None)
    return common


def _value(text: str):
    """A --magrpo-option value: a bool, an int, a float, a comma-separated list of them or a string."""
    if "," in text:
        return [_value(part) for part in text.split(",")]
    if text in ("true", "false"):
        return text == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def policy_tables(policies: dict, n: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """p0[c0, a0] and p1[c1, a0, a1] of tabular policies read at tiny_hanabi's observations."""
    p0 = np.array([policies["player_0"].probabilities(f"p0:d{c}").tolist() for c in range(n)])
    p1 = np.array([[policies["player_1"].probabilities(f"p1:d{c} p0:a{a}").tolist() for a in range(m)] for c in range(n)])
    return p0, p1


def unilateral_gain(payoff: np.ndarray, p0: np.ndarray, p1: np.ndarray) -> float:
    """How much the better of the two players could gain by changing its own policy alone (its
    best response to the other's current policy), exactly; 0 at a person-by-person optimum."""
    n = payoff.shape[0]
    w = 1.0 / (n * n)
    value = w * np.einsum("xa,yab,xyab->", p0, p1, payoff)
    # player 1: per (own card, player 0's action) the best action against player 0's policy
    by_answer = w * np.einsum("xa,xyab->yab", p0, payoff)
    best1 = by_answer.max(axis=2).sum()
    # player 0: per own card the best action against player 1's policy
    by_action = w * np.einsum("yab,xyab->xa", p1, payoff)
    best0 = by_action.max(axis=1).sum()
    return float(max(best0, best1) - value)


def best_deviation(payoff: np.ndarray, p0: np.ndarray, p1: np.ndarray) -> tuple[str, float, float]:
    """The single information set where one player changing its action alone gains most:
    (which, gain in expected return, the probability the player now gives that better action)."""
    n, _, m, _ = payoff.shape
    w = 1.0 / (n * n)
    found = ("none", 0.0, 1.0)
    by_answer = w * np.einsum("xa,xyab->yab", p0, payoff)  # player 1 at (own card y, partner's action a)
    for y in range(n):
        for a in range(m):
            gain = by_answer[y, a].max() - by_answer[y, a] @ p1[y, a]
            if gain > found[1]:
                found = (f"player 1 at card {y}, partner's action {a}", float(gain), float(p1[y, a, by_answer[y, a].argmax()]))
    by_action = w * np.einsum("yab,xyab->xa", p1, payoff)  # player 0 at its own card x
    for x in range(n):
        gain = by_action[x].max() - by_action[x] @ p0[x]
        if gain > found[1]:
            found = (f"player 0 at card {x}", float(gain), float(p0[x, by_action[x].argmax()]))
    return found


def train_one(learner: str, game: str, seed: int, args: argparse.Namespace) -> tuple[float, float]:
    """Train ``learner`` on ``game`` with ``seed``; the final policies' exact expected return and
    their best unilateral gain (:func:`unilateral_gain`)."""
    trainer_class, config_class = LEARNERS[learner]
    torch.manual_seed(seed)
    env = tiny_hanabi(game, num_items=args.items)
    actions = [str(a) for a in range(env.game.num_distinct_actions())]
    policies = {agent: TabularPolicy(actions) for agent in env.possible_agents}
    config = config_class(**settings(learner, args, seed))
    trainer_class(env=env, policies=policies, args=config, eval_env=env).train()

    def probabilities(agent, observation, legal):
        probs = policies[agent].probabilities(observation)
        return [float(probs[a]) for a in legal]

    payoff = np.asarray(TINY_HANABI[game][0], dtype=float)
    p0, p1 = policy_tables(policies, payoff.shape[0], payoff.shape[2])
    value = env.expected_return(probabilities)
    if args.diagnose and value < 0.99 * TINY_HANABI[game][1]:
        where, gain, p = best_deviation(payoff, p0, p1)
        print(f"  {learner} {game} seed {seed}: {value:.3f}; best single change: {where} gains {gain:.3f}, "
              f"its better action has probability {p:.2e}", file=sys.stderr, flush=True)
    return value, unilateral_gain(payoff, p0, p1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--games", nargs="+", default=sorted(TINY_HANABI), choices=sorted(TINY_HANABI))
    parser.add_argument("--learners", nargs="+", default=list(LEARNERS), choices=list(LEARNERS))
    parser.add_argument("--seeds", type=int, default=10, help="seeds per cell (0 .. seeds-1)")
    parser.add_argument("--epochs", type=int, default=40, help="passes over the items")
    parser.add_argument("--items", type=int, default=32, help="deals (items of the env's chance stream) per epoch")
    parser.add_argument("--items-per-step", type=int, default=8, help="trees per optimizer step")
    parser.add_argument("--k", type=int, default=4, help="MAGRPO's answers per node")
    parser.add_argument("--lr", type=float, default=0.1, help="learning rate of every policy (and IAC's critics)")
    parser.add_argument("--magrpo-option", action="append", metavar="FIELD=VALUE",
                        help="a MAGRPOConfig field for the MAGRPO row (repeatable), e.g. tree_return_aggregation=max")
    parser.add_argument("--diagnose", action="store_true",
                        help="for each seed below 99%% of the optimum, print the information set where one player "
                             "changing alone gains most, and the probability it now gives the better action")
    parser.add_argument("--json", help="write every seed's final expected return here")
    args = parser.parse_args(argv)

    info = print_machine()
    started = time.perf_counter()
    values: dict[str, dict[str, list[float]]] = {learner: {} for learner in args.learners}
    gains: dict[str, dict[str, list[float]]] = {learner: {} for learner in args.learners}
    for learner in args.learners:
        for game in args.games:
            runs = [train_one(learner, game, seed, args) for seed in range(args.seeds)]
            values[learner][game] = [v for v, _ in runs]
            gains[learner][game] = [g for _, g in runs]
            print(f"{learner} {game}: {[round(v, 3) for v in values[learner][game]]} "
                  f"unilateral gains {[round(g, 3) for g in gains[learner][game]]}", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - started

    print(f"Tiny Hanabi, tabular policies: final exact expected return, mean ± std over {args.seeds} seeds "
          f"(seeds reaching >= 99% of the optimum). {args.epochs} epochs x {args.items} deals, "
          f"{args.items_per_step} trees per step, lr {args.lr}, MAGRPO K={args.k}"
          + (f"; the tiny_hanabi.yaml row: {shipped_options()}" if "MAGRPO, tiny_hanabi.yaml" in args.learners else "") + ".\n")
    print("| learner | " + " | ".join(args.games) + " |")
    print("|---|" + "---|" * len(args.games))
    print("| optimum | " + " | ".join(f"{TINY_HANABI[g][1]:.3g}" for g in args.games) + " |")
    for learner in args.learners:
        cells = []
        for game in args.games:
            runs = values[learner][game]
            optimum = TINY_HANABI[game][1]
            spread = statistics.pstdev(runs) if len(runs) > 1 else 0.0
            hits = sum(v >= 0.99 * optimum for v in runs)
            cells.append(f"{statistics.mean(runs):.2f} ± {spread:.2f} ({hits}/{len(runs)})")
        print(f"| {learner} | " + " | ".join(cells) + " |")
    print("\nSeeds below 99% of the optimum that end at a person-by-person optimum (neither player can gain "
          "more than 0.01 by changing its own policy alone), per cell:\n")
    print("| learner | " + " | ".join(args.games) + " |")
    print("|---|" + "---|" * len(args.games))
    for learner in args.learners:
        cells = []
        for game in args.games:
            optimum = TINY_HANABI[game][1]
            short = [(v, g) for v, g in zip(values[learner][game], gains[learner][game]) if v < 0.99 * optimum]
            stuck = sum(g <= 0.01 for _, g in short)
            cells.append(f"{stuck}/{len(short)}" if short else "–")
        print(f"| {learner} | " + " | ".join(cells) + " |")
    print(f"\n{elapsed:.0f} s on {info['cpu']} ({info['usable_cpus']} usable CPUs, load average {info['load_average']} at the start), "
          f"{torch.get_num_threads()} thread per run, runs one after another")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": vars(args), "machine": info, "seconds": elapsed, "values": values, "unilateral_gains": gains}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

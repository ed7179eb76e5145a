"""Both players of Tiny Hanabi game E trained by expected updates, without sampling.

The diagnostic behind docs/games.md, "Why player 0 does not pass the safe convention": the two SmolLM2 LoRA adapters of
``benchmarks/lm_tiny_hanabi.py --set choice_answers=true`` (:class:`~llm_marl.policies.choice.ChoicePolicy`,
score temperature 0.7), each step updated by the *expected* update of a rule over every deal and
every answer of both menus, so that what a run does is what the rule does with this model, not
what its samples did. Player 0 sees ``p0:d<card>`` (two prompts), player 1 ``p1:d<card> p0:a<move>``
(six prompts). ``pi`` is held fixed inside a step; both players step at once.

Player 0's credit for move ``a0`` on a deal ``(c0, c1)`` (``--credit``), R the payoff:

- ``mean``: ``sum_a1 pi1(a1) R`` (the trees' default, ``tree_return_aggregation="mean"``, K -> inf);
- ``softmax`` / ``max``: the expectation, over K draws of player 1, of their soft maximum
  ``t log mean exp(R/t)`` (``--tau``) or maximum: what ``tree_return_aggregation`` computes from K
  sampled answers;
- ``menu-softmax``: ``t log sum_a1 pi1(a1) exp(R/t)``, the soft maximum over player 1's menu.

Rules (``--rule0``, ``--rule1``): ``pg``, the exact policy gradient of the credit (player 1: of the
payoff); ``imitate``, cross-entropy on each deal's (player 1: each prompt's) best answer weighted
by the chance ``1 - (1 - pi(best))^K`` that K draws contain it, the expectation of
``advantage_mode="best"``; ``imitate-card`` (player 0), the same on each card's best answer by
its credit averaged over player 1's cards (a group of every answer to one prompt, not one deal).
``--unweighted`` drops the chance-in-K-draws weight (cross-entropy on the best answer).
``--partner1 optimal`` fixes player 1 at the optimal convention's answers (player 0 alone);
``--floor1 f`` mixes player 1's menu distribution with the uniform one (weight f), so that no
answer falls below f/3; ``--alternate N`` lets one player step at a time, N steps each, player 1
first. AdamW without weight decay, as the trainer's. The prompts are the env's own
(``lm_tiny_hanabi.game_prompts``).

Each printed line: the exact return, ``pi0`` per card, ``pi1`` per prompt ``<card><move>``::

    OMP_NUM_THREADS=1 python benchmarks/lm_team_exact.py --partner1 optimal --rule0 pg --lr0 1e-4
    OMP_NUM_THREADS=1 python benchmarks/lm_team_exact.py --credit menu-softmax --tau 1 --rule1 imitate
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lm_player1_exact import load_benchmark  # noqa: E402


def optimal_answers(bench) -> dict[tuple[int, int], int]:
    """Player 1's answer at each ``(its card, player 0's move)``: its best against the optimal
    convention after ``p0a0`` and ``p0a2``, and after ``p0a1`` its best against the safe one."""
    return {**bench.best_answers("safe"), **bench.best_answers("optimal")}


def credit(payoff: list[float], pi1: list[float], how: str, k: int, tau: float) -> float:
    """Player 0's credit for one move on one deal: ``payoff[a1]`` for player 1's answers, ``pi1`` their probabilities."""
    if how == "mean":
        return sum(p * r for p, r in zip(pi1, payoff))
    if how == "menu-softmax":
        top = max(payoff)
        return top + tau * math.log(sum(p * math.exp((r - top) / tau) for p, r in zip(pi1, payoff)))
    total = 0.0
    for draws in itertools.product(range(len(payoff)), repeat=k):
        values = [payoff[a] for a in draws]
        top = max(values)
        value = top if how == "max" else top + tau * math.log(sum(math.exp((v - top) / tau) for v in values) / k)
        total += math.prod(pi1[a] for a in draws) * value
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--credit", choices=["mean", "softmax", "max", "menu-softmax"], default="mean")
    parser.add_argument("--tau", type=float, default=0.5, help="temperature of the soft maxima")
    parser.add_argument("--rule0", choices=["pg", "imitate", "imitate-card"], default="pg")
    parser.add_argument("--rule1", choices=["pg", "imitate"], default="pg")
    parser.add_argument("--unweighted", action="store_true", help="imitation without the chance-in-K-draws weight (cross-entropy on the best answer)")
    parser.add_argument("--partner1", choices=["learning", "optimal"], default="learning")
    parser.add_argument("--lr0", type=float, default=1e-4)
    parser.add_argument("--lr1", type=float, default=1e-4)
    parser.add_argument("--k", type=int, default=4, help="K: player 1's draws behind a credit, and the draws of the imitate rule")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--floor1", type=float, default=0.0, help="player 1's policy is (1 - f) x the adapter's menu distribution + f / 3: no answer below f / 3")
    parser.add_argument("--alternate", type=int, default=0, help="N > 0: only player 1 steps for N steps, then only player 0 for N, and so on")
    parser.add_argument("--print-every", type=int, default=2)
    ns = parser.parse_args()
    for name, value, ok, what in [
        ("--tau", ns.tau, ns.tau > 0, "> 0"),
        ("--lr0", ns.lr0, ns.lr0 > 0, "> 0"),
        ("--lr1", ns.lr1, ns.lr1 > 0, "> 0"),
        ("--k", ns.k, ns.k >= 1, ">= 1"),
        ("--steps", ns.steps, ns.steps >= 0, ">= 0"),
        ("--floor1", ns.floor1, 0 <= ns.floor1 < 1, "in [0, 1)"),
        ("--alternate", ns.alternate, ns.alternate >= 0, ">= 0"),
        ("--print-every", ns.print_every, ns.print_every >= 1, ">= 1"),
    ]:
        if not ok:
            parser.error(f"{name} must be {what}, got {value}")
    bench = load_benchmark()
    bench.print_machine()
    import torch

    from llm_marl.envs.openspiel import TINY_HANABI
    from llm_marl.policies.base import Completion

    payoff = TINY_HANABI["E"][0]  # payoff[c0][c1][a0][a1]
    keys1 = [(c1, a0) for c1 in (0, 1) for a0 in range(3)]
    optimal = optimal_answers(bench)

    def menu_log_probs(policy, prompts: list[str], player: int) -> torch.Tensor:
        """``log pi(p<player>a<m> | prompt)``, one row per prompt (differentiable)."""
        moves = [f"p{player}a{m}" for m in range(3)]
        return policy.log_probs([p for p in prompts for _ in moves], [Completion(m) for _ in prompts for m in moves]).view(len(prompts), 3)

    def imitation(values: list[float], probability: list[float], log_row: torch.Tensor) -> torch.Tensor:
        """The imitate rules' loss at one group: minus the log-probability of the best-valued
        answer, weighted by the chance that K draws contain it (1 with ``--unweighted``); 0 when
        the values tie."""
        if max(values) <= min(values) + 1e-9:
            return torch.zeros(())
        best = values.index(max(values))
        return -(1.0 if ns.unweighted else 1 - (1 - probability[best]) ** ns.k) * log_row[best]

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as out:
        trainer = bench.build({**bench.RUN, "choice_answers": True, "seed": 0, "output_dir": out, "num_threads": 1}, None)
        policy0, policy1 = trainer.policies["player_0"], trainer.policies["player_1"]
        by_card, by_prompt = bench.game_prompts(trainer)
        prompts0, prompts1 = [by_card[c0] for c0 in (0, 1)], [by_prompt[key] for key in keys1]
        opt0 = torch.optim.AdamW([p for p in policy0.parameters() if p.requires_grad], lr=ns.lr0, weight_decay=0.0)
        opt1 = torch.optim.AdamW([p for p in policy1.parameters() if p.requires_grad], lr=ns.lr1, weight_decay=0.0)
        start = time.time()
        for step in range(ns.steps + 1):
            log0, log1 = menu_log_probs(policy0, prompts0, 0), menu_log_probs(policy1, prompts1, 1)
            if ns.floor1:
                log1 = torch.log((1 - ns.floor1) * log1.exp() + ns.floor1 / 3)
            pi0 = log0.detach().exp().tolist()
            pi1 = {key: row for key, row in zip(keys1, log1.detach().exp().tolist())}
            if ns.partner1 == "optimal":
                pi1 = {key: [float(a == optimal[key]) for a in range(3)] for key in keys1}
            exact = sum(0.25 * pi0[c0][a0] * pi1[(c1, a0)][a1] * payoff[c0][c1][a0][a1]
                        for c0 in (0, 1) for c1 in (0, 1) for a0 in range(3) for a1 in range(3))
            if step % ns.print_every == 0 or step == ns.steps:
                cards = " ".join(",".join(f"{p:.2f}" for p in pi0[c0]) for c0 in (0, 1))
                answers = " ".join(f"{c1}{a0}:" + ",".join(f"{p:.2f}" for p in pi1[(c1, a0)]) for c1, a0 in keys1)
                print(f"step {step:3d} exact {exact:.2f} | pi0 {cards} | pi1 {answers} | {time.time() - start:.0f} s", flush=True)
            if step == ns.steps:
                break
            moving = {0, 1} if not ns.alternate else {(step // ns.alternate + 1) % 2}
            loss0 = torch.zeros(())
            for c0 in (0, 1):
                per_deal = [[credit(payoff[c0][c1][a0], pi1[(c1, a0)], ns.credit, ns.k, ns.tau) for a0 in range(3)] for c1 in (0, 1)]
                if ns.rule0 == "imitate-card":
                    loss0 = loss0 + 0.5 * imitation([(per_deal[0][a0] + per_deal[1][a0]) / 2 for a0 in range(3)], pi0[c0], log0[c0])
                    continue
                for values in per_deal:
                    if ns.rule0 == "pg":
                        loss0 = loss0 - 0.25 * sum(log0[c0, a0].exp() * values[a0] for a0 in range(3))
                    else:
                        loss0 = loss0 + 0.25 * imitation(values, pi0[c0], log0[c0])
            if 0 in moving:
                opt0.zero_grad()
                loss0.backward()
                opt0.step()
            if ns.partner1 == "optimal" or 1 not in moving:
                continue
            loss1 = torch.zeros(())
            for i, (c1, a0) in enumerate(keys1):
                weights = [0.25 * pi0[c0][a0] for c0 in (0, 1)]
                if sum(weights) == 0:
                    continue
                values = [sum(w * payoff[c0][c1][a0][a1] for c0, w in enumerate(weights)) / sum(weights) for a1 in range(3)]
                if ns.rule1 == "pg":
                    loss1 = loss1 - sum(weights) * sum(log1[i, a1].exp() * values[a1] for a1 in range(3))
                else:
                    loss1 = loss1 + sum(weights) * imitation(values, pi1[(c1, a0)], log1[i])
            opt1.zero_grad()
            loss1.backward()
            opt1.step()


if __name__ == "__main__":
    sys.exit(main())

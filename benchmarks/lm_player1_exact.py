"""Player 1 of Tiny Hanabi game E, trained by an update computed exactly, without sampling.

The diagnostic behind docs/games.md, "Answers as a choice among the listed moves": does player 1's
SmolLM2 LoRA adapter (a :class:`~llm_marl.policies.choice.ChoicePolicy`, as
``benchmarks/lm_tiny_hanabi.py --set choice_answers=true`` builds it) learn to answer by its
prompt when each step's update is the *expected* one of a rule, over every prompt it can see
against a scripted partner (``--partner``, :data:`lm_tiny_hanabi.PARTNERS`) and every answer of
its menu? Rules (``--rule``), per prompt ``x`` weighted by its probability, ``Q(x, a)`` the mean
payoff of answer ``a`` there (exact, from game E's payoffs), ``pi`` the policy (held fixed inside
a step):

- ``pg``: the exact policy gradient, ``sum_a pi(a|x) (Q(x,a) - V(x)) grad log pi(a|x)``;
- ``imitate``: cross-entropy on the best answer, weighted by the chance ``1 - (1 - pi(best|x))^K``
  that K draws contain it (the expectation of imitating each group's best answer);
- ``supervised``: cross-entropy on the best answer.

Each step prints the team's exact return and ``pi(p1a0) pi(p1a1) pi(p1a2) (best)`` per prompt::

    OMP_NUM_THREADS=1 python benchmarks/lm_player1_exact.py --rule pg --steps 12
    OMP_NUM_THREADS=1 python benchmarks/lm_player1_exact.py --rule imitate --partner nine
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def load_benchmark():
    spec = importlib.util.spec_from_file_location("lm_tiny_hanabi", HERE / "lm_tiny_hanabi.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prompt_values(bench, partner: str) -> tuple[dict, dict]:
    """Per player-1 prompt ``(card, partner's move)``: its probability, and each answer's mean payoff."""
    from llm_marl.envs.openspiel import TINY_HANABI

    payoff = TINY_HANABI["E"][0]
    moves = {int(card[-1]): int(move[-1]) for card, move in bench.PARTNERS[partner].items()}
    weights, values = {}, {}
    for a0 in sorted(set(moves.values())):
        cards = [c0 for c0, m in moves.items() if m == a0]
        for c1 in (0, 1):
            weights[(c1, a0)] = len(cards) / 4
            values[(c1, a0)] = [sum(payoff[c0][c1][a0][a1] for c0 in cards) / len(cards) for a1 in range(3)]
    return weights, values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rule", choices=["pg", "imitate", "supervised"], default="pg")
    parser.add_argument("--partner", default="optimal")
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--draws", type=int, default=4, help="K of the imitate rule")
    ns = parser.parse_args()
    bench = load_benchmark()
    bench.print_machine()
    if ns.partner not in bench.PARTNERS:
        parser.error(f"--partner: choose one of {sorted(bench.PARTNERS)}, got {ns.partner!r}")
    import torch

    from llm_marl.policies.base import Completion

    weights, values = prompt_values(bench, ns.partner)
    names = ["p1a0", "p1a1", "p1a2"]
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as out:
        trainer = bench.build({**bench.RUN, "choice_answers": True, "seed": 0, "output_dir": out, "num_threads": 1}, ns.partner)
        _, prompts = bench.game_prompts(trainer)
        policy = trainer.policies["player_1"]
        optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=ns.lr, weight_decay=0.0)

        def show(step: int) -> None:
            cells = []
            for k, q in values.items():
                probabilities = policy.probabilities(prompts[k])
                cells.append(" ".join(f"{probabilities[n]:.2f}" for n in names) + f" ({q.index(max(q))})")
            print(f"step {step:3d} exact {bench.exact_return(trainer):.2f} | " + " | ".join(cells), flush=True)

        show(0)
        for step in range(1, ns.steps + 1):
            keys = list(values)
            log_pi = policy.log_probs([prompts[k] for k in keys for _ in names], [Completion(n) for _ in keys for n in names]).view(len(keys), len(names))
            pi = log_pi.detach().exp()
            loss = torch.zeros(())
            for i, k in enumerate(keys):
                q = torch.tensor(values[k])
                best = int(q.argmax())
                if ns.rule == "pg":
                    loss = loss - weights[k] * (pi[i] * (q - (pi[i] * q).sum()) * log_pi[i]).sum()
                elif ns.rule == "imitate":
                    loss = loss - weights[k] * (1 - (1 - pi[i, best]) ** ns.draws) * log_pi[i, best]
                else:
                    loss = loss - weights[k] * log_pi[i, best]
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            show(step)


if __name__ == "__main__":
    sys.exit(main())

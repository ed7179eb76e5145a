"""A language-model team learns Tiny Hanabi game E from text prompts, against a reward-blind control.

Two SmolLM2-135M-Instruct LoRA adapters on one frozen base (the command's default model) play
``TinyHanabi-E-v0`` as ``llm-marl train --env TinyHanabi-E-v0 --policy lm`` builds it: each prompt
shows the player's information state and asks "Which move do you make? Choose one of: " its legal
moves by name; the answer is parsed to a legal move (an illegal one ends the game with the
game's minimum payoff, 0). For each seed the real MAGRPO learner and its reward-blind control
(``tests/controls.py``: each group's advantages shuffled, same seed, same start, same deals) are
trained one after the other, one pass over ``--batches`` batches of 4 deals. The eval return
(``eval/turn_1/expected_return``: the mean return of one sampled game on each of the first
``--eval-items`` eval deals, the same deals for every run) is measured before every batch and at
the end; so is the team's exact expected return (:func:`exact_return`) before and after, and each
run keeps its stall metrics (``train/<agent>/zero_advantage_groups`` and ``entropy``, per batch).
The script prints the machine, the settings, per arm and number of batches trained the
mean and min..max over seeds, the fraction of game E's optimum (10) reached, and end-of-run
games (prompts, both answers, return)::

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/lm_tiny_hanabi.py --seeds 0 1 2 --out lm_tiny_hanabi.json
    python benchmarks/lm_tiny_hanabi.py --seeds 0 --batches 2 --eval-items 8     # a quick look
    python benchmarks/lm_tiny_hanabi.py --summary lm_tiny_hanabi.json            # reprint a saved run
    python benchmarks/lm_tiny_hanabi.py --seeds 0 --runs magrpo --partner optimal # player 1 alone
    python benchmarks/lm_tiny_hanabi.py --supervised optimal                     # its capacity check

``--partner optimal`` (or ``nine``, ``safe``) replaces player 0 by a fixed script that plays that
convention (:data:`PARTNERS`; a :class:`~llm_marl.policies.scripted.ScriptedPolicy`, not trained),
so the run measures whether player 1 alone learns to answer it: against ``optimal`` its best
answers are worth 10, against ``nine`` 9, against ``safe`` 8. ``--supervised optimal`` trains
player 1's adapter instead by cross-entropy on those best answers (:func:`supervised_steps`), to
show whether the adapter can hold them at all.

The model is fetched and converted on first use (``llm_marl.policies.models``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import print_machine  # noqa: E402
from overrides import parse_sets  # noqa: E402

OPTIMUM = 10.0
RUN = {
    "env": "TinyHanabi-E-v0",
    "policy": "lm",
    "model": "smollm2-135m",
    "learner": "magrpo",
    "lora_r": 8,
    "lora_alpha": 16.0,
    "lora_target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "num_generations": 4,
    "joint_mode": "aligned",
    "num_train_epochs": 1,
    "items_per_step": 4,
    "rollout_buffer_size": 4,
    "max_new_tokens": 4,
    "temperature": 0.7,
    "top_p": 1.0,
    "top_k": None,
    "agent_learning_rate": 1e-3,
    "agent_learning_rates": [1e-3, 3e-4],
    "early_termination_threshold": None,
    "dynamic_sampling": True,
    "dynamic_sampling_budget": 2,
    "reference_kl_enabled": False,
    "eval_interval": 1,
    "logging_steps": 1,
    "rollout_log_steps": 0,
    "max_grad_norm": 1.0,
    "progress_bar": False,
}
"""The run's settings (``llm-marl train`` options); ``--set FIELD=VALUE`` overrides one. Measured
2026-12-03 (docs/games.md): answers of at most 4 tokens (a move name such as ``p0a1`` is exactly
4), dynamic sampling with 2 re-rolls per batch, and two timescales: player 1, who trains on up to
four times as many groups a batch as player 0 (each of player 0's K answers is followed by K of
its own), learns at 3e-4 against player 0's 1e-3 (``agent_learning_rates``; with one rate for both,
seed 0's player 1 settled on one answer for all its prompts before player 0 had settled); the
script's ``--batches`` is 12 (48 deals; 8 left seed 0's exact return at 7.50). The 2026-12-02
table used ``max_new_tokens=8`` without dynamic sampling, over 8 batches."""


KEY = "eval/turn_1/expected_return"

PARTNERS = {
    "optimal": {"d0": "p0a2", "d1": "p0a0"},
    "nine": {"d0": "p0a0", "d1": "p0a1"},
    "safe": {"d0": "p0a1", "d1": "p0a1"},
}
"""Player 0's move by its card (``p0:d0`` or ``p0:d1`` in its prompt) in each scripted convention
of game E: ``optimal`` tells the card with moves 2 and 0 (worth 10 with player 1's best answers),
``nine`` with moves 0 and 1 (9), ``safe`` always plays the middle move (8)."""


def partner_answers(convention: str):
    """``fn(observation, n)`` for a :class:`ScriptedPolicy`: player 0's move in ``convention`` for
    the card its observation shows, ``n`` times."""
    moves = PARTNERS[convention]

    def answer(observation: str, n: int) -> list[str]:
        cards = [card for card in moves if f"p0:{card}" in observation]
        if len(cards) != 1:
            raise ValueError(f"partner {convention!r}: no single card of player 0 in {observation!r}")
        return [moves[cards[0]]] * n

    return answer


def best_answers(convention: str) -> dict[tuple[int, int], int]:
    """Player 1's best move at each prompt it sees against ``convention``: (its card, player 0's
    move) -> the move with the highest mean payoff of game E over the cards of player 0 that play
    that move (the lowest move on a tie)."""
    from llm_marl.envs.openspiel import TINY_HANABI

    payoff = TINY_HANABI["E"][0]
    moves = {card: int(move[-1]) for card, move in PARTNERS[convention].items()}
    best = {}
    for c1 in (0, 1):
        for a0 in sorted(set(moves.values())):
            cards = [int(card[-1]) for card, move in moves.items() if move == a0]
            values = [sum(payoff[c0][c1][a0][a1] for c0 in cards) / len(cards) for a1 in range(3)]
            best[(c1, a0)] = values.index(max(values))
    return best


def game_prompts(trainer) -> tuple[dict[int, str], dict[tuple[int, int], str]]:
    """Every prompt of game E as the trainer's eval env words it: player 0's by its card, player
    1's by (its card, player 0's move)."""
    import re

    prompts: tuple[dict, dict] = ({}, {})

    def record(agent: str, observation: str, legal: list[int]) -> list[float]:
        if agent == "player_0":
            prompts[0][int(re.search(r"p0:d(\d)", observation).group(1))] = observation
        else:
            card, move = map(int, re.search(r"p1:d(\d) p0:a(\d)", observation).groups())
            prompts[1][(card, move)] = observation
        return [1.0 / len(legal)] * len(legal)

    trainer.eval_env.expected_return(record)  # visits every prompt of both players
    return prompts


def supervised_steps(trainer, convention: str, learning_rate: float = 1e-3, limit: int = 100) -> list[dict]:
    """Player 1's adapter trained by cross-entropy on its best answers against ``convention``
    (:func:`best_answers`; all its prompts in every AdamW step), the capacity check of
    docs/games.md: after each step, the probability of each prompt's right answer (its move's
    name as the whole answer; ``right``, rounded, and ``log_prob``). Stops once every one is above
    0.9, or after ``limit`` steps."""
    import torch

    from llm_marl.policies.base import Completion

    policy = trainer.policies["player_1"]
    _, prompts = game_prompts(trainer)
    targets = best_answers(convention)
    keys = sorted(targets)
    answers = [Completion(f"p1a{targets[k]}", token_ids=tuple(policy.tokenizer(f"p1a{targets[k]}", add_special_tokens=False)["input_ids"])) for k in keys]
    observations = [prompts[k] for k in keys]
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=learning_rate, weight_decay=0.0)
    trace = []
    for step in range(1, limit + 1):
        values, _ = policy.token_log_probs(observations, answers)
        loss = -torch.stack([v.sum() for v in values]).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            values, _ = policy.token_log_probs(observations, answers)
        right = {f"d{k[0]}a{k[1]}": round(float(v.sum().exp()), 3) for k, v in zip(keys, values)}
        trace.append({"step": step, "right": right, "log_prob": {f"d{k[0]}a{k[1]}": float(v.sum()) for k, v in zip(keys, values)}})
        print(f"supervised step {step}: probability of the right answer {right}", flush=True)
        if min(right.values()) > 0.9:
            break
    return trace


def build(options: dict, partner: str | None):
    """``cli.build_trainer(options)``; with ``partner``, player 0's policy is that scripted convention."""
    from unittest import mock

    from llm_marl import cli
    from llm_marl.policies.scripted import ScriptedPolicy

    if partner is None:
        return cli.build_trainer(options)
    made = cli._make_policies

    def with_partner(*args, **kwargs):
        policies = made(*args, **kwargs)
        return [ScriptedPolicy(partner_answers(partner), "player_0"), *policies[1:]]

    with mock.patch.object(cli, "_make_policies", with_partner):
        return cli.build_trainer(options)


def exact_return(trainer) -> float:
    """The team's exact expected return over game E's four deals, every move enumerated
    (``OpenSpielEnv.expected_return``): a player's probability of a move is the probability that
    its sampled answer begins with the move's name (temperature sampling, from the scoring pass);
    any other answer counts as illegal (return 0, the game's minimum). A choice policy
    (``choice_answers``) gives its menu probabilities."""
    import torch

    from llm_marl.policies.base import Completion
    from llm_marl.policies.choice import ChoicePolicy
    from llm_marl.policies.scripted import ScriptedPolicy

    env = trainer.eval_env

    def probabilities(agent: str, observation: str, legal: list[int]) -> list[float]:
        policy = trainer.policies[agent]
        names = env.legal_moves(agent)
        if isinstance(policy, ScriptedPolicy):
            [answer] = policy.fn(observation, 1)
            return [1.0 if name == answer else 0.0 for name in names]
        if isinstance(policy, ChoicePolicy):
            chosen = policy.probabilities(observation)
            return [chosen.get(name, 0.0) for name in names]
        tokens = [tuple(policy.tokenizer(name, add_special_tokens=False)["input_ids"]) for name in names]
        with torch.no_grad():
            values, _ = policy.token_log_probs([observation] * len(names), [Completion(n, token_ids=t) for n, t in zip(names, tokens)])
        return [float(v.sum().exp()) for v in values]

    return env.expected_return(probabilities)


def transcripts(trainer, count: int) -> list[str]:
    """One sampled game per eval item: both prompts, both answers and the reward."""
    from llm_marl.learners.tree import grow_trees

    roots = grow_trees(trainer.eval_env, trainer.policies, list(range(count)), num_samples=1, num_turns=2)
    shown = []
    for root in roots:
        lines, node = [], root
        while node is not None:
            for agent in node.agents:
                lines.append(f"  [{agent} sees] {node.observations[agent]!r}")
                lines.append(f"  [{agent} says] {node.completions[agent][0].text!r}")
            illegal = node.details[0].get("illegal") if node.details else None
            if illegal:
                lines.append(f"  illegal answer by {illegal}: the game ends")
            node = node.children[0] if node.children else None
        lines.append(f"  return {root.returns[0]:g}")
        shown.append("\n".join(lines))
    return shown


def run(seed: int, control: bool, overrides: dict, ns: argparse.Namespace) -> dict:
    import torch

    from controls import reward_blind

    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory(prefix="lm-tiny-hanabi-") as out:
        options = {**RUN, "seed": seed, "output_dir": out,
                   "eval_num_samples": ns.eval_items, "eval_batch_size": ns.eval_items, "num_threads": ns.threads, **overrides}
        started = time.time()
        trainer = build(options, getattr(ns, "partner", None))
        exact_before = exact_return(trainer)
        trainer.env.num_items = ns.batches * trainer.args.items_per_step  # one pass over the same items in every run
        if control:
            with reward_blind("shuffle", seed):
                trainer.train()
        else:
            trainer.train()
        final = trainer.evaluate()
        exact = [round(exact_before, 3), round(exact_return(trainer), 3)]
        # the logger's history holds every evaluation: before each batch, then the final one
        curve = [m[KEY] for _, m in trainer.logger.history if KEY in m]
        stalls = stall_metrics(trainer.logger.history)
        steps = trainer.state.global_step
        games = transcripts(trainer, ns.transcripts)
        minutes = (time.time() - started) / 60
    return {"seed": seed, "run": "control" if control else "magrpo", "curve": curve, "exact": exact, "steps": steps, "minutes": round(minutes, 2),
            "illegal_rate": {k.split("/")[1]: round(v, 3) for k, v in final.items() if k.endswith("illegal_rate")},
            "stalls": stalls, "transcripts": games, "load": round(os.getloadavg()[0], 2)}


STALLS = ("zero_advantage_groups", "entropy")


def stall_metrics(history: list) -> dict[str, list[float]]:
    """``train/<agent>/zero_advantage_groups`` and ``train/<agent>/entropy`` as logged, in order (one per logging step)."""
    found: dict[str, list[float]] = {}
    for _, metrics in history:
        for key, value in metrics.items():
            if key.startswith("train/") and key.rsplit("/", 1)[-1] in STALLS:
                found.setdefault(key[len("train/"):], []).append(round(value, 3))
    return found


def spread(values: list[float]) -> str:
    mean = sum(values) / len(values)
    return f"{mean:5.2f} ({min(values):.2f}..{max(values):.2f})"


def summarize(rows: list[dict], seeds: list[int]) -> None:
    """The curve table (mean and min..max over seeds per arm, by batches trained) and the transcripts."""
    print(f"\nmean eval return (min..max over seeds {seeds}) after b batches; game E's optimum is {OPTIMUM:g}")
    kinds = [k for k in ("magrpo", "control") if any(r["run"] == k for r in rows)]
    print("   b  " + "  ".join(f"{k:<20}" for k in kinds))
    for step in range(min(len(r["curve"]) for r in rows)):
        cells = [spread([r["curve"][step] for r in rows if r["run"] == k]) for k in kinds]
        print(f"{step:>4}  " + "  ".join(f"{c:<20}" for c in cells))
    for k in kinds:
        final = [r["curve"][-1] for r in rows if r["run"] == k]
        print(f"{k}: final {sum(final) / len(final):.2f} = {sum(final) / len(final) / OPTIMUM:.0%} of the optimum")
        exact = [r["exact"] for r in rows if r["run"] == k and "exact" in r]
        if exact:
            print(f"{k}: exact expected return before -> after, per seed: " + ", ".join(f"{a:.2f} -> {b:.2f}" for a, b in exact))
    for row in rows:
        print(f"\n--- seed {row['seed']} {row['run']}: end-of-run games")
        for game in row["transcripts"]:
            print(game)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--batches", type=int, default=12, help="batches of items_per_step items per run (one pass)")
    parser.add_argument("--eval-items", type=int, default=16, help="eval items (one sampled game each) per evaluation")
    parser.add_argument("--transcripts", type=int, default=4, help="end-of-run games shown per run")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", nargs="+", choices=["magrpo", "control"], default=["magrpo", "control"])
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a RUN option (JSON value)")
    parser.add_argument("--partner", choices=sorted(PARTNERS), help="player 0 plays this fixed convention (PARTNERS); only player 1 learns")
    parser.add_argument("--supervised", choices=sorted(PARTNERS), help="instead of RL: train player 1 by cross-entropy on its best answers against this convention, and stop")
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--summary", metavar="JSON", help="print the table and transcripts of a saved --out file, run nothing")
    ns = parser.parse_args()
    if ns.summary:
        rows = json.loads(Path(ns.summary).read_text())["rows"]
        summarize(rows, sorted({r["seed"] for r in rows}))
        return
    print_machine()
    overrides = parse_sets(ns.set)
    if ns.supervised:
        with tempfile.TemporaryDirectory(prefix="lm-tiny-hanabi-") as out:
            trainer = build({**RUN, "seed": ns.seeds[0], "output_dir": out, "num_threads": ns.threads, **overrides}, None)
            started = time.time()
            trace = supervised_steps(trainer, ns.supervised)
        print(f"{len(trace)} steps, {time.time() - started:.0f} s")
        if ns.out:
            Path(ns.out).write_text(json.dumps({"settings": {**RUN, **overrides}, "supervised": ns.supervised, "trace": trace}, indent=2))
        return
    print(f"settings: {json.dumps({**RUN, **overrides})}" + (f"; player 0 scripted: {ns.partner}" if ns.partner else ""), flush=True)
    rows = []
    started = time.time()
    for seed in ns.seeds:
        for kind in ns.runs:
            row = run(seed, kind == "control", overrides, ns)
            rows.append(row)
            print(f"seed {seed} {row['run']:<8} {row['steps']} optimizer steps; eval return after each batch: {' '.join(f'{v:.2f}' for v in row['curve'])}  "
                  f"exact return {row['exact'][0]:.2f} -> {row['exact'][1]:.2f}  illegal {row['illegal_rate']}  {row['minutes']:.1f} min, load {row['load']}", flush=True)
            if ns.out:
                Path(ns.out).write_text(json.dumps({"settings": {**RUN, **overrides}, "partner": ns.partner, "rows": rows}, indent=2))
    summarize(rows, ns.seeds)
    print(f"\ntotal {(time.time() - started) / 60:.1f} min; load average now {os.getloadavg()}")


if __name__ == "__main__":
    from llm_marl.cli import UsageError

    try:
        main()
    except UsageError as exc:  # a bad --set value: the command's one-line message, no traceback
        raise SystemExit(f"lm_tiny_hanabi.py: error: {exc}") from None

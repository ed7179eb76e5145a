"""Learning end to end, in seconds: tabular policies on the matrix games (docs/algorithms.md §2, §3.7).

Every test trains 5 seeds and asserts a success count; run with ``-s`` to see the curves (mean
training reward every few epochs), the joint action found and the final probabilities.

Expected reward of a joint policy: E = sum_ij p_row(i) p_col(j) M[i][j], computed exactly from the
payoff matrix; the uniform policy's is the mean of M (climbing -31/9 = -3.44, penalty 2/9 = 0.22,
coordination 1.9/9 = 0.21).

Measured, and why the settings are what they are:
- coordination game, default joint_mode="aligned": with the default advantage normalization every
  group with a single coordinated sample gets the same advantages whatever that sample's payoff
  (1.0, 0.6 or 0.3), and AdamW's per-coordinate scaling removes magnitudes again, so the
  learners lock into whichever diagonal cell they hit first (0/5 seeds found (alpha, alpha) at
  lr 0.3, 2/5 at lr 0.05). In joint_mode="cross" each answer is scored against all K partner
  answers, so alpha's higher payoff shows inside every group: 5/5 for all four learners.
- climbing and penalty games with the default cross_aggregation="sum": the agents coordinate on
  a joint action quickly, but (as docs/algorithms.md §3.7 says) not on the optimum: climbing typically
  ends at (beta, gamma) = 6 or (gamma, gamma) = 5, penalty at (beta, beta) = 2 or at an optimum.
- cross_aggregation="max" (optimistic credit) reaches (alpha, alpha) of the climbing game and an
  optimum of the penalty game.
- Controls: a learner with reward-blind advantages (tests/controls.py) also collapses onto a joint
  action, a random one; it reaches a named optimum in at most 1 of 5 seeds here, so the
  optimum-counting tests need no control run, while the sum-aggregation test (any coordination,
  any improvement) compares its mean final reward with control runs on the same seeds.
"""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(1)

from llm_marl.envs import make  # noqa: E402
from llm_marl.learners.reinforce.trainer import (  # noqa: E402
    MAGRPOTrainer,
    MAREINFORCETrainer,
    MARLOOTrainer,
    MAReMaxTrainer,
)
from llm_marl.policies.tabular import TabularPolicy  # noqa: E402
from llm_marl.tasks.matrix import CLIMBING, COORDINATION, penalty_matrix  # noqa: E402
from controls import reward_blind  # noqa: E402

MENU = ("alpha", "beta", "gamma")
PAYOFF = {"ClimbingGame-v0": CLIMBING, "PenaltyGame-v0": penalty_matrix(), "CoordinationGame-v0": COORDINATION}
SEEDS = range(5)


def expected_reward(payoff, p_row, p_col):
    return sum(p_row[i] * p_col[j] * payoff[i][j] for i in range(3) for j in range(3))


def uniform_reward(payoff):
    return sum(map(sum, payoff)) / 9


def train(trainer_class, env_id, seed, epochs, **overrides):
    """Train two TabularPolicy agents on a one-shot matrix game; return (p_row, p_col, curve)."""
    env = make(env_id)
    policies = {agent: TabularPolicy(MENU) for agent in env.possible_agents}
    settings = dict(
        num_turns=1,
        num_generations=4,
        num_train_epochs=epochs,
        agent_learning_rate=0.3,
        rollout_buffer_size=2,
        early_termination_threshold=None,
        eval_interval=0,
        progress_bar=False,
        seed=seed,
    )
    settings.update(overrides)
    trainer = trainer_class(env=env, policies=policies, args=trainer_class.config_class(**settings))
    trainer.train()
    observations, _ = env.reset(options={"index": 0})
    p_row, p_col = (policies[a].probabilities(observations[a]).tolist() for a in ("row", "column"))
    curve = [m["train/turn_1/reward_mean"] for _, m in trainer.logger.history if "train/turn_1/reward_mean" in m]
    return p_row, p_col, curve


def report(label, seed, payoff, p_row, p_col, curve):
    i, j = max(range(3), key=p_row.__getitem__), max(range(3), key=p_col.__getitem__)
    every = max(1, len(curve) // 10)
    print(
        f"{label} seed {seed}: found ({MENU[i]}, {MENU[j]}) payoff {payoff[i][j]:g}; "
        f"E[reward] {expected_reward(payoff, p_row, p_col):.3f} (uniform {uniform_reward(payoff):.3f}); "
        f"p_row {[round(p, 3) for p in p_row]} p_col {[round(p, 3) for p in p_col]}\n"
        f"    train reward every {every} epochs: {[round(r, 2) for r in curve[::every]]}"
    )
    return i, j


def reached(p_row, p_col, optima, confidence=0.9):
    i, j = max(range(3), key=p_row.__getitem__), max(range(3), key=p_col.__getitem__)
    return (i, j) in optima and p_row[i] > confidence and p_col[j] > confidence


@pytest.mark.parametrize("trainer_class", [MAGRPOTrainer, MAREINFORCETrainer, MARLOOTrainer, MAReMaxTrainer])
def test_coordination_game_optimum(trainer_class):
    payoff = PAYOFF["CoordinationGame-v0"]
    successes = 0
    for seed in SEEDS:
        p_row, p_col, curve = train(trainer_class, "CoordinationGame-v0", seed, epochs=40, joint_mode="cross")
        report(f"{trainer_class.__name__} coordination", seed, payoff, p_row, p_col, curve)
        successes += reached(p_row, p_col, {(0, 0)})
    print(f"{trainer_class.__name__}: optimum (alpha, alpha) in {successes}/5 seeds")
    assert successes >= 4


# Reward-blind controls (tests/controls.py), same seeds and settings, mean over the 5 seeds of the
# final E[reward] (measured): climbing real 5.75, shuffled advantages -13.19, constant advantages
# -14.11; penalty real 5.18, shuffled 2.67, constant 2.21. A reward-blind learner also collapses
# onto some joint action (3/5 "coordinated" for both controls on both games) and sometimes onto a
# good one, so the counts alone are near what it reaches; the real run must beat both controls'
# mean by CONTROL_MARGIN (measured gaps: climbing 18.9, penalty 2.5).
CONTROL_MARGIN = 1.0


def mean_final_reward(env_id, blind=None, **settings):
    payoff, values = PAYOFF[env_id], []
    for seed in SEEDS:
        if blind is None:
            p_row, p_col, _ = train(MAGRPOTrainer, env_id, seed, **settings)
        else:
            with reward_blind(blind, seed):
                p_row, p_col, _ = train(MAGRPOTrainer, env_id, seed, **settings)
        values.append(expected_reward(payoff, p_row, p_col))
    return sum(values) / len(values)


@pytest.mark.parametrize("env_id", ["ClimbingGame-v0", "PenaltyGame-v0"])
def test_sum_aggregation_coordinates_and_improves(env_id):
    payoff = PAYOFF[env_id]
    coordinated = improved = 0
    rewards = []
    for seed in SEEDS:
        p_row, p_col, curve = train(MAGRPOTrainer, env_id, seed, epochs=50, joint_mode="cross")
        report(f"sum {env_id}", seed, payoff, p_row, p_col, curve)
        coordinated += max(p_row) > 0.9 and max(p_col) > 0.9
        improved += expected_reward(payoff, p_row, p_col) > uniform_reward(payoff) + 1.5
        rewards.append(expected_reward(payoff, p_row, p_col))
    print(f"{env_id} (sum): coordinated {coordinated}/5, improved {improved}/5")
    assert coordinated >= 4 and improved >= 4
    real = sum(rewards) / len(rewards)
    for blind in ("shuffle", "constant"):
        control = mean_final_reward(env_id, blind, epochs=50, joint_mode="cross")
        print(f"{env_id} (sum): mean E[reward] {real:.2f}, reward-blind ({blind}) control {control:.2f}")
        assert real > control + CONTROL_MARGIN, (blind, real, control)


OPTIMA = {"ClimbingGame-v0": {(0, 0)}, "PenaltyGame-v0": {(0, 0), (2, 2)}}


def _max_aggregation(env_id, epochs):
    payoff = PAYOFF[env_id]
    successes = 0
    for seed in SEEDS:
        p_row, p_col, curve = train(
            MAGRPOTrainer, env_id, seed, epochs=epochs, joint_mode="cross", cross_aggregation="max"
        )
        report(f"max {env_id}", seed, payoff, p_row, p_col, curve)
        successes += reached(p_row, p_col, OPTIMA[env_id])
    print(f"{env_id} (max, {epochs} epochs): optimum in {successes}/5 seeds")
    assert successes >= 4


@pytest.mark.parametrize("env_id", ["ClimbingGame-v0", "PenaltyGame-v0"])
def test_max_aggregation_reaches_the_optimum(env_id):
    # 60 epochs: 10/10 seeds on both games when measured (all had settled by epoch ~40);
    # 300 epochs (the setting first measured for this test) also gives 5/5 on both, in ~45 s.
    _max_aggregation(env_id, epochs=60)

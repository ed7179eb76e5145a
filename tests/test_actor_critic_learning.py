"""Learning with IAC and MAAC, tabular policies and critics: 5 seeds each, against a control.

Control: the same learner, seeds and settings on the same game whose reward is replaced by noise
that ignores the answers (reward-blind advantages). Coordinated: both agents put more than 0.9 of
their probability on the same diagonal cell (an equilibrium joint action). The expected reward of
the final policies is computed exactly from the payoff matrix (one-shot games) or along the
greedy path (repeated games). Run with ``-s`` to see the per-seed results.
"""

from __future__ import annotations

import random

import datasets
import pytest
import torch

torch.set_num_threads(1)

from llm_marl.envs import DialogueEnv, make  # noqa: E402
from llm_marl.learners import IACConfig, IACTrainer, MAACConfig, MAACTrainer  # noqa: E402
from llm_marl.policies.tabular import TabularPolicy  # noqa: E402
from llm_marl.tasks.base import CooperativeTask  # noqa: E402
from llm_marl.tasks.matrix import CLIMBING, COORDINATION, MatrixGame, penalty_matrix  # noqa: E402

MENU = ("alpha", "beta", "gamma")
SEEDS = range(5)
PAYOFF = {"Coordination": COORDINATION, "Penalty": penalty_matrix(), "Climbing": CLIMBING}
LEARNERS = {"iac": (IACTrainer, IACConfig), "maac": (MAACTrainer, MAACConfig)}


class BlindGame(MatrixGame):
    """The control: the payoff matrix's shape and names, but every reward is N(0, 1) noise."""

    def __init__(self, payoff, seed, **kwargs):
        super().__init__(payoff, **kwargs)
        self.noise = random.Random(seed)

    def reward(self, item, actions, history):
        return self.noise.gauss(0.0, 1.0)


def game_env(name, turns, seed, blind):
    cls = BlindGame if blind else MatrixGame
    extra = {"seed": seed} if blind else {}
    return DialogueEnv(cls(PAYOFF[name], num_turns=turns, name=f"{name}Game", **extra))


def train(learner, env, seed, epochs, **overrides):
    trainer_class, config_class = LEARNERS[learner]
    policies = {agent: TabularPolicy(MENU) for agent in env.possible_agents}
    settings = dict(num_turns=env.task.num_turns, num_generations=4, num_train_epochs=epochs, agent_learning_rate=0.1,
                    critic_learning_rate=0.1, rollout_buffer_size=2, eval_interval=0, progress_bar=False, seed=seed,
                    value_clip_range=None)
    settings.update(overrides)
    trainer = trainer_class(env=env, policies=policies, args=config_class(**settings))
    trainer.train()
    return trainer, policies


def greedy_path(env, policies):
    """Follow every agent's most likely answer; returns (per-turn (probabilities, cells), total payoff)."""
    twin = env.fork()
    observations, _ = twin.reset(options={"index": 0})
    turns, total = [], 0.0
    for _ in range(env.task.num_turns):
        probs = {a: policies[a].probabilities(observations[a]).tolist() for a in ("row", "column")}
        cell = tuple(max(range(3), key=probs[a].__getitem__) for a in ("row", "column"))
        turns.append((probs, cell))
        total += env.task.payoff[cell[0]][cell[1]]
        observations, _, terminations, truncations, _ = twin.step({a: MENU[c] for a, c in zip(("row", "column"), cell)})
        if any(terminations.values()) or any(truncations.values()):
            break
    return turns, total


def expected_one_shot(payoff, p_row, p_col):
    return sum(p_row[i] * p_col[j] * payoff[i][j] for i in range(3) for j in range(3))


def coordinated(turns):
    return all(cell[0] == cell[1] and probs["row"][cell[0]] > 0.9 and probs["column"][cell[1]] > 0.9 for probs, cell in turns)


def run(learner, name, turns, epochs, blind, **overrides):
    results = []
    for seed in SEEDS:
        env = game_env(name, turns, seed, blind)
        _, policies = train(learner, env, seed, epochs, **overrides)
        path, total = greedy_path(game_env(name, turns, seed, False), policies)
        probs = path[0][0]
        value = expected_one_shot(PAYOFF[name], probs["row"], probs["column"]) if turns == 1 else total
        results.append((coordinated(path), value, [cell for _, cell in path]))
        print(f"{learner} {name} x{turns} {'control' if blind else 'trained'} seed {seed}: coordinated {results[-1][0]} "
              f"value {value:.3f} cells {results[-1][2]}")
    return results


FAST = dict(num_generations=8, agent_learning_rate=0.3, critic_learning_rate=0.3)
MARGIN = {"Coordination": 0.2, "Penalty": 2.0, "Climbing": 2.0}


def check(learner, name, turns, epochs, coordinate=True, **overrides):
    trained = run(learner, name, turns, epochs, blind=False, **overrides)
    control = run(learner, name, turns, epochs, blind=True, **overrides)
    wins, control_wins = sum(c for c, _, _ in trained), sum(c for c, _, _ in control)
    mean, control_mean = (sum(v for _, v, _ in r) / len(r) for r in (trained, control))
    print(f"{learner} {name} x{turns}, {epochs} epochs: coordinated {wins}/5 (control {control_wins}/5); "
          f"value {mean:.3f} (control {control_mean:.3f})")
    if coordinate:
        assert wins >= 4 and wins >= control_wins + 3
    assert mean > control_mean + MARGIN[name] * turns


# Measured (5 seeds, coordinated / mean value, trained vs control): IAC penalty one-shot, 20 epochs:
# 5/5, 8.17 vs 1/5, -0.75. IAC repeated coordination, 2 turns, 30 epochs (G=8, lr 0.2): 5/5, 1.70
# vs 0/5, 0.18. In a one-state game IAC's and MAAC's critics see the same single state, so their
# runs coincide there; they differ on the repeated games and on EchoLater below.


def test_iac_coordinates_on_the_penalty_game():
    check("iac", "Penalty", 1, 20, **FAST)


def test_maac_coordinates_on_the_repeated_coordination_game():
    check("maac", "Coordination", 2, 30, **FAST)


@pytest.mark.slow
@pytest.mark.parametrize("learner", ["iac", "maac"])
@pytest.mark.parametrize("name, turns", [("Coordination", 1), ("Penalty", 1), ("Coordination", 2), ("Penalty", 2)])
def test_every_learner_coordinates_on_one_shot_and_repeated_games(learner, name, turns):
    check(learner, name, turns, 30, **FAST)


@pytest.mark.slow
@pytest.mark.parametrize("learner", ["iac", "maac"])
def test_climbing_game_improves_without_reaching_the_guarded_optimum(learner):
    # Average-based critics settle on the safe cells (relative overgeneralization, as docs/algorithms.md
    # §3.7 describes for the REINFORCE family): the value beats the control, coordination varies.
    check(learner, "Climbing", 1, 30, coordinate=False, **FAST)


# --- a reward that depends on the partner's earlier answer: MAAC's central critic vs IAC ------


class EchoLater(CooperativeTask):
    """Two turns. Turn 1: the leader names a word (reward 0). Turn 2: the team earns 1 if the
    follower names the leader's turn-1 word. The follower is never told that word (its prompt
    is the same whatever the leader said); the leader's turn-2 prompt repeats its own word, so the
    joint observation — MAAC's critic input — knows it and the follower's own does not."""

    agents = ("leader", "follower")
    num_turns = 2

    def dataset(self, split):
        return datasets.Dataset.from_list([{"id": 0}])

    def initial_observations(self, item):
        return {"leader": "leader: name a word", "follower": "follower: wait"}

    def reward(self, item, actions, history):
        if not history:
            return 0.0
        return float(actions["follower"] == history[0].actions["leader"])

    def transition(self, item, actions, history):
        return {"leader": f"leader: you said {actions['leader']}", "follower": "follower: say the leader's word"}


def echo_success(policies):
    """P(follower's turn-2 word == leader's turn-1 word) under the final policies."""
    lead = policies["leader"].probabilities("leader: name a word").tolist()
    follow = policies["follower"].probabilities("follower: say the leader's word").tolist()
    return sum(p * q for p, q in zip(lead, follow))


def echo_run(learner, seed, epochs, blind=False, **overrides):
    task = EchoLater()
    if blind:
        noise = random.Random(seed)
        task.reward = lambda item, actions, history: noise.gauss(0.0, 1.0)
    env = DialogueEnv(task)
    _, policies = train(learner, env, seed, epochs, **overrides)
    return echo_success(policies)


ECHO = dict(num_generations=1, rollout_buffer_size=4, agent_learning_rate=0.2, critic_learning_rate=0.2)


def test_central_critic_against_independent_critics_when_a_reward_depends_on_an_earlier_answer():
    """Measured, reported whichever wins (docs/actor_critic_learners.md): the mean success
    probability over 5 seeds after 80 epochs of IAC, MAAC and the reward-blind control."""
    epochs = 80
    iac = [echo_run("iac", seed, epochs, **ECHO) for seed in SEEDS]
    maac = [echo_run("maac", seed, epochs, **ECHO) for seed in SEEDS]
    control = [echo_run("iac", seed, epochs, blind=True, **ECHO) for seed in SEEDS]
    mean = {name: sum(v) / len(v) for name, v in (("iac", iac), ("maac", maac), ("control", control))}
    print(f"EchoLater, {epochs} epochs, P(success) per seed: IAC {[round(v, 3) for v in iac]} "
          f"MAAC {[round(v, 3) for v in maac]} control {[round(v, 3) for v in control]}; means {mean}")
    assert mean["iac"] > mean["control"] + 0.3 and mean["maac"] > mean["control"] + 0.3

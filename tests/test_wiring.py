"""The trainer wires the config into the math: advantage mode and normalization reach the
update, and the reference-KL penalty reaches the returns with its sign (docs/algorithms.md §3.8, §4, §6).

The probe: each agent answers "0", "1", "2" (K = 3) in the aligned mode, the shared reward of
joint answer (k, k) is PAYOUT[k] = 1, 2, 6, and ``log pi(answer k) = theta[k]``, one parameter
per answer. One item, one optimizer step per agent, plain SGD with lr 1, so theta after training
is exactly minus the gradient of the loss mean_k(-A_k theta[k]): theta[k] = A_k / 3.

Advantages of the returns [1, 2, 6] by hand, without normalization:

    raw  (MAREINFORCE)  [1, 2, 6]
    mean (MAGRPO)       mean 3            -> [-2, -1, 3]
    rloo (MARLOO)       others' means 4, 3.5, 1.5 -> [-3, -1.5, 4.5]
    max  (MAReMax)      max 6             -> [-5, -4, 0]

With normalization every mode gives (r - 3) / sqrt(14/3) = [-0.92582, -0.46291, 1.38873].
"""

from __future__ import annotations

import math

import datasets
import pytest
import torch

torch.set_num_threads(1)

from llm_marl.envs import DialogueEnv  # noqa: E402
from llm_marl.learners.buffer import samples_from_trees  # noqa: E402
from llm_marl.learners.reinforce.trainer import (  # noqa: E402
    MAGRPOTrainer,
    MAREINFORCETrainer,
    MARLOOTrainer,
    MAReMaxTrainer,
)
from llm_marl.learners.tree import grow_trees  # noqa: E402
from llm_marl.policies.base import Completion  # noqa: E402
from llm_marl.tasks import CooperativeTask  # noqa: E402
from test_tree import Arith, policies as arith_policies  # noqa: E402

PAYOUT = (1.0, 2.0, 6.0)


class Payout(CooperativeTask):
    """One item; the shared reward of joint answer (k, k) is PAYOUT[k]."""

    agents = ("a", "b")
    num_turns = 1

    def dataset(self, split):
        return datasets.Dataset.from_list([{"n": 0}])

    def initial_observations(self, item):
        return {agent: f"{agent}?" for agent in self.agents}

    def reward(self, item, actions, history):
        assert actions["a"] == actions["b"], "aligned answers"
        return PAYOUT[int(actions["a"])]

    def transition(self, item, actions, history):
        return {agent: "over" for agent in self.agents}


class ProbePolicy:
    """Answers "0".."K-1"; log pi(answer k) = theta[k]."""

    def __init__(self, k: int = 3):
        self.theta = torch.nn.Parameter(torch.zeros(k, dtype=torch.float64))

    def sample(self, observations, num_samples):
        return [[Completion(str(k)) for k in range(num_samples)] for _ in observations]

    def log_probs(self, observations, completions, reduction="sum"):
        return self.theta[[int(c.text) for c in completions]]

    def parameters(self):
        return iter([self.theta])


def probe_thetas(trainer_class, **config):
    policies = {"a": ProbePolicy(), "b": ProbePolicy()}
    settings = dict(
        num_turns=1,
        num_generations=3,
        num_train_epochs=1,
        joint_mode="aligned",
        rollout_buffer_size=1,
        train_batch_size=1,
        early_termination_threshold=None,
        eval_interval=0,
        logging_steps=1,
        progress_bar=False,
    )
    settings.update(config)
    optimizers = {agent: torch.optim.SGD([policy.theta], lr=1.0) for agent, policy in policies.items()}
    trainer = trainer_class(
        env=DialogueEnv(Payout()), policies=policies, args=trainer_class.config_class(**settings), optimizers=optimizers
    )
    trainer.train()
    assert trainer.state.global_step == 1
    return {agent: policy.theta.detach().tolist() for agent, policy in policies.items()}, trainer


UNNORMALIZED = {
    MAREINFORCETrainer: [1.0, 2.0, 6.0],
    MAGRPOTrainer: [-2.0, -1.0, 3.0],
    MARLOOTrainer: [-3.0, -1.5, 4.5],
    MAReMaxTrainer: [-5.0, -4.0, 0.0],
}
NORMALIZED = [(r - 3.0) / math.sqrt(14 / 3) for r in PAYOUT]


@pytest.mark.parametrize("trainer_class", list(UNNORMALIZED), ids=lambda c: c.__name__)
def test_each_learner_updates_with_its_own_unnormalized_advantages(trainer_class):
    thetas, trainer = probe_thetas(trainer_class, advantage_normalization=False)
    expected = [a / 3 for a in UNNORMALIZED[trainer_class]]
    for agent in ("a", "b"):
        assert thetas[agent] == pytest.approx(expected, abs=1e-12), agent
    logged = dict(trainer.logger.history)[0]
    assert logged["train/a/advantage_mean"] == pytest.approx(sum(UNNORMALIZED[trainer_class]) / 3)


@pytest.mark.parametrize("trainer_class", list(UNNORMALIZED), ids=lambda c: c.__name__)
def test_normalized_advantages_reach_the_update(trainer_class):
    thetas, _ = probe_thetas(trainer_class, advantage_normalization=True)
    for agent in ("a", "b"):
        assert thetas[agent] == pytest.approx([a / 3 for a in NORMALIZED], abs=1e-5), agent


def test_advantage_mode_overrides_the_learners_default():
    thetas, _ = probe_thetas(MAGRPOTrainer, advantage_mode="max", advantage_normalization=False)
    assert thetas["a"] == pytest.approx([-5 / 3, -4 / 3, 0.0], abs=1e-12)


# --- the reference-KL penalty in the returns (samples_from_trees) ------------------------------
#
# The aligned two-turn Arith tree of test_tree.py (gamma 1): root returns [-4, 2]; child of (1,3)
# rewards [2, 4]; child of (2,4) rewards [2, 6]. Answers: a root [1,2], children [3,4] and [4,6];
# b root [3,4], children [1,0] and [2,0]. The stub KL of an answer is 0.1 x its number, kl_coef 2:
#   a: root [-4 - 0.2, 2 - 0.4] = [-4.2, 1.6]; child 1 [2 - 0.6, 4 - 0.8] = [1.4, 3.2];
#      child 2 [2 - 0.8, 6 - 1.2] = [1.2, 4.8]
#   b: root [-4 - 0.6, 2 - 0.8] = [-4.6, 1.2]; child 1 [2 - 0.2, 4 - 0] = [1.8, 4.0];
#      child 2 [2 - 0.4, 6 - 0] = [1.6, 6.0]

KL_RETURNS = {
    "a": [[-4.2, 1.6], [1.4, 3.2], [1.2, 4.8]],
    "b": [[-4.6, 1.2], [1.8, 4.0], [1.6, 6.0]],
}


def stub_kl(calls):
    def penalty(agent, observations, completions):
        calls.append((agent, list(observations), [c.text for c in completions]))
        return [0.1 * int(c.text) for c in completions]

    return penalty


def test_kl_penalty_is_subtracted_from_the_returns_before_the_baseline():
    roots = grow_trees(DialogueEnv(Arith(2)), arith_policies(), [0], num_samples=2, num_turns=2)
    calls = []
    samples = samples_from_trees(
        roots, ["a", "b"], advantage_mode="mean", normalize=False, kl_penalty=stub_kl(calls), kl_coef=2.0
    )
    # one call per agent with all of that agent's answers, nodes in creation order
    assert [(agent, texts) for agent, _, texts in calls] == [
        ("a", ["1", "2", "3", "4", "4", "6"]),
        ("b", ["3", "4", "1", "0", "2", "0"]),
    ]
    assert calls[0][1][:2] == ["a|x|start"] * 2 and calls[0][1][2] == "a|x|prev=1,3"
    assert [(s.agent, s.turn) for s in samples] == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 1), ("b", 1)]
    for agent in ("a", "b"):
        mine = [s for s in samples if s.agent == agent]
        assert [s.returns for s in mine] == [pytest.approx(r) for r in KL_RETURNS[agent]]
        for sample, returns in zip(mine, KL_RETURNS[agent]):
            half = (returns[1] - returns[0]) / 2
            assert sample.advantages == pytest.approx([-half, half])
            assert sample.kl == pytest.approx([0.1 * int(c.text) for c in sample.completions])


def test_no_kl_penalty_leaves_the_returns_alone():
    roots = grow_trees(DialogueEnv(Arith(2)), arith_policies(), [0], num_samples=2, num_turns=2)
    samples = samples_from_trees(roots, ["a", "b"], advantage_mode="raw", normalize=False, kl_coef=2.0)
    assert [s.returns for s in samples if s.agent == "a"] == [[-4.0, 2.0], [2.0, 4.0], [2.0, 6.0]]
    assert all(s.kl == [] for s in samples)

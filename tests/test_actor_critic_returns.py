"""Logged returns of the actor-critic learners (issue 22.5): ``returns`` of the samples (and of
CoMLRL's RolloutSample) and ``train/turn_k/expected_return`` are Σ_{t'≥t} r̃_{t'}: undiscounted and
shaped (SPEC-actor-critic §3.2), whatever ``discount`` the TD targets use.

SPEC T3: r = [−1, −2, 0.5], γ = 0.9 → returns [−2.5, −1.5, 0.5] (the previous main logged the
discounted −1 + 0.9·(−2 + 0.9·0.5) = −2.395 and −2 + 0.9·0.5 = −1.55). With a reference KL of 0.5
per answer and β = 0.1, r̃ = r − 0.05 → returns [−2.65, −1.6, 0.45] (the previous main ignored the
shaping).
"""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(1)

from llm_marl.envs.dialogue import DialogueEnv  # noqa: E402
from llm_marl.learners import IACConfig, IACTrainer, MAACConfig, MAACTrainer  # noqa: E402
from llm_marl.learners.actor_critic import math as acm  # noqa: E402
from llm_marl.learners.actor_critic.trainer import rollout_samples  # noqa: E402
from llm_marl.policies.tabular import TabularPolicy  # noqa: E402
from toy_tasks import Scheduled  # noqa: E402

MENU = ("red", "green", "blue")
T3 = [-1.0, -2.0, 0.5]


def trainer_for(trainer_class=IACTrainer, config_class=IACConfig, kl=None, **overrides):
    settings = dict(num_turns=3, num_generations=1, num_train_epochs=1, discount=0.9, agent_learning_rate=0.1,
                    critic_learning_rate=0.1, rollout_buffer_size=1, eval_interval=0, logging_steps=1,
                    progress_bar=False, seed=3, reference_kl_coef=0.1)
    settings.update(overrides)
    trainer = trainer_class(env=DialogueEnv(Scheduled(T3)), policies=[TabularPolicy(MENU), TabularPolicy(MENU)],
                            args=config_class(**settings))
    if kl is not None:  # a fixed reference KL per answer (no reference model needed)
        trainer._answer_kl = lambda nodes: {agent: [[kl] * len(node.completions[agent]) for node in nodes] for agent in trainer.agents}
    return trainer


def test_logged_returns_sum_the_shaped_rewards_from_the_children_undiscounted():
    # a chain, leaf first: 0.5; then -2 + 0.5 = -1.5; then -1 + (-1.5) = -2.5
    leaf = acm.logged_returns([0.5], [None])
    middle = acm.logged_returns([-2.0], [leaf])
    assert leaf == [0.5] and middle == [-1.5] and acm.logged_returns([-1.0], [middle]) == [-2.5]
    # a node with two answers: one continued (children's mean 1.0), one ended
    assert acm.logged_returns([1.0, 2.0], [[0.5, 1.5], None]) == [2.0, 2.0]


@pytest.mark.parametrize("trainer_class, config_class", [(IACTrainer, IACConfig), (MAACTrainer, MAACConfig)])
def test_t3_sample_returns_are_undiscounted(trainer_class, config_class):
    trainer = trainer_for(trainer_class, config_class)
    roots = trainer._collect([0])[0]
    samples = trainer._samples(roots)
    for agent in trainer.agents:
        mine = [s for s in samples if s.agent == agent]
        assert [s.returns for s in mine] == [pytest.approx([-2.5]), pytest.approx([-1.5]), pytest.approx([0.5])]
        assert [s.targets[0] for s in mine][2] == pytest.approx(0.5)  # the TD targets still use gamma (T3 y)
    # CoMLRL's RolloutSample.returns (what a metrics_callback reads) are the same
    assert [float(r.returns) for r in rollout_samples(samples, trainer.agents) if r.agent_idx == 0] == pytest.approx([-2.5, -1.5, 0.5])


def test_t3_sample_returns_are_shaped():
    trainer = trainer_for(kl=0.5)
    samples = trainer._samples(trainer._collect([0])[0])
    assert [s.rewards[0] for s in samples if s.agent == "a"] == pytest.approx([-1.05, -2.05, 0.45])
    assert [s.returns[0] for s in samples if s.agent == "a"] == pytest.approx([-2.65, -1.6, 0.45])


@pytest.mark.parametrize("kl, expected", [(None, [-2.5, -1.5, 0.5]), (0.5, [-2.65, -1.6, 0.45])])
def test_logged_expected_return_is_the_mean_logged_return(kl, expected):
    trainer = trainer_for(kl=kl)
    trainer.train()
    metrics = trainer.logger.history[0][1]
    assert [metrics[f"train/turn_{t}/expected_return"] for t in (1, 2, 3)] == pytest.approx(expected)
    assert [metrics[f"train/turn_{t}/reward_mean"] for t in (1, 2, 3)] == pytest.approx(T3)  # raw R, before KL

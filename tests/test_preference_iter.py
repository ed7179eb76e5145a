"""The iterative preference learners (docs/preference.md §5): comparison pairs, replay, rounds,
learning against shuffled labels, a fresh reward model per round, and exact resume.

Hand values: current rewards [1, 3, 2, 0] against comparator rewards [2, 1, 2, 5] give pairs at
k = 0 (comparator wins, gap 1, comparator reward 2), k = 1 (current wins, gap 2, comparator
reward 1) and k = 3 (comparator wins, gap 5, reward 5); k = 2 ties. "comparator_reward" orders
them by comparator reward: k = 3, 0, 1; "reward_gap" by gap: k = 3, 1, 0. lambda_decay weights
of 3 rounds with lambda 1/2, oldest first: (1/8, 1/4, 1/2) / (7/8) = (1/7, 2/7, 4/7).
"""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

torch.set_num_threads(1)

import llm_marl.learners.preference.iterative as preference_iter  # noqa: E402
from llm_marl.envs import make  # noqa: E402
from llm_marl.envs.dialogue import DialogueEnv  # noqa: E402
from llm_marl.learners.preference import math as pm  # noqa: E402
from llm_marl.learners.preference.iterative import MADPOIterConfig, MADPOIterTrainer, MARLHFIterConfig, MARLHFIterTrainer  # noqa: E402
from llm_marl.learners.tree import RolloutNode  # noqa: E402
from llm_marl.policies.base import Completion  # noqa: E402
from llm_marl.policies.tabular import TabularPolicy  # noqa: E402
from llm_marl.tasks.matrix import CLIMBING  # noqa: E402
from toy_tasks import MENU as COLOURS, ColourMatch  # noqa: E402
from resumed import uninterrupted_and_resumed  # noqa: E402

MENU = ("alpha", "beta", "gamma")
CURRENT, COMPARATOR = [1.0, 3.0, 2.0, 0.0], [2.0, 1.0, 2.0, 5.0]


def test_comparison_pairs_per_mode_by_hand():
    comparator_first = [(("comparator", 3), ("current", 3)), (("comparator", 0), ("current", 0)), (("current", 1), ("comparator", 1))]
    assert pm.select_comparison_pairs(CURRENT, COMPARATOR, "comparator_reward") == comparator_first
    assert [w[1] for w, _ in pm.select_comparison_pairs(CURRENT, COMPARATOR, "reward_gap")] == [3, 1, 0]
    assert [w[1] for w, _ in pm.select_comparison_pairs(CURRENT, COMPARATOR, "all")] == [0, 1, 3]
    assert pm.select_comparison_pairs(CURRENT, COMPARATOR, "comparator_reward", limit=1) == comparator_first[:1]
    drawn = pm.select_comparison_pairs(CURRENT, COMPARATOR, "random", limit=2, rng=random.Random(1))
    assert len(drawn) == 2 and set(drawn) <= set(comparator_first)
    with pytest.raises(ValueError, match="preference_pairs_per_sample must be None"):
        pm.select_comparison_pairs(CURRENT, COMPARATOR, "all", limit=2)


def test_replay_weights_and_samples():
    assert pm.lambda_decay_weights(3, 0.5) == pytest.approx([1 / 7, 2 / 7, 4 / 7])
    assert pm.lambda_decay_weights(4, 1.0) == [0.25] * 4
    assert pm.lambda_decay_weights(2, 0.0) == [0.0, 1.0]  # lambda 0: only the newest round
    picked = pm.replay_sample([3, 0, 2], 4, random.Random(0))
    assert len(picked) == 4 and all(r in (0, 2) for r, _ in picked)
    assert picked == pm.replay_sample([3, 0, 2], 4, random.Random(0))
    assert {r for r, _ in pm.replay_sample([3, 3], 5, random.Random(0), weights=[0.0, 1.0])} == {1}
    assert sorted(pm.replay_sample([2], 2, random.Random(0))) == [(0, 0), (0, 1)]  # without replacement while they last


def test_a_node_pairs_current_k_with_comparator_k():
    env = make("ClimbingGame-v0")
    trainer = MADPOIterTrainer(env=env, policies=[TabularPolicy(MENU), TabularPolicy(MENU)],
                               args=MADPOIterConfig(preference_num_candidates=4, eval_interval=0, progress_bar=False))
    assert trainer._candidates() == 8
    node = RolloutNode(turn=0, index=0, observations={}, joint=[(k, k) for k in range(8)], rewards=CURRENT + COMPARATOR)
    # comparator_reward: k = 3, 0, 1; current k is joint answer k, comparator k is joint answer 4 + k
    assert trainer._node_pairs(node) == [(7, 3), (4, 0), (1, 5)]


def madpo_iter(seed, shuffled=False, **overrides):
    env = make("ClimbingGame-v0")
    policies = {agent: TabularPolicy(MENU) for agent in env.possible_agents}
    settings = dict(num_iterations=15, num_train_epochs=2, agent_learning_rate=0.3, preference_num_candidates=8, preference_pairs_per_sample=4,
                    dpo_beta=0.5, train_batch_size=2, eval_interval=0, progress_bar=False, seed=seed)
    settings.update(overrides)
    trainer = MADPOIterTrainer(env=env, policies=policies, args=MADPOIterConfig(**settings))
    if shuffled:  # the control: each item's candidate rewards permuted before the pairs are chosen
        rng = random.Random(seed)
        real = preference_iter._comparison_pairs

        def blind(args, rewards, pair_rng):
            permuted = list(rewards)
            rng.shuffle(permuted)
            return real(args, permuted, pair_rng)

        preference_iter._comparison_pairs = blind
    try:
        trainer.train()
    finally:
        if shuffled:
            preference_iter._comparison_pairs = real
    observations, _ = env.reset(options={"index": 0})
    p_row, p_col = (policies[a].probabilities(observations[a]).tolist() for a in ("row", "column"))
    return trainer, sum(p_row[i] * p_col[j] * CLIMBING[i][j] for i in range(3) for j in range(3))


def test_madpo_iter_trains_only_at_round_ends_on_the_chosen_pairs():
    trainer, _ = madpo_iter(0, num_iterations=3, num_train_epochs=2, preference_replay_mode="nearest_k", preference_replay_k=2)
    history = [m for _, m in trainer.logger.history if "iter/train_preference_pairs" in m]
    assert len(history) == 3 and len(trainer.rounds.rounds) == 2  # nearest_k keeps the last 2 rounds
    steps = sum(2 * math.ceil(m["iter/train_preference_pairs"] / 2) for m in history)
    assert trainer.state.global_step == steps and steps > 0


# Measured (climbing game, 3 seeds, 15 rounds, 2 passes, C = C' = 8, 4 pairs per item, beta 0.5):
# final E[reward] real 6.91 / 6.95 / 10.71; shuffled labels 4.67 / 0.62 / -3.69 (uniform -3.44).


def test_madpo_iter_beats_a_shuffled_label_control():
    real = [madpo_iter(seed)[1] for seed in range(3)]
    control = [madpo_iter(seed, shuffled=True)[1] for seed in range(3)]
    print(f"MADPOIter climbing E[reward]: real {[round(v, 2) for v in real]}, shuffled {[round(v, 2) for v in control]}")
    assert all(r > c for r, c in zip(real, control))
    assert sum(real) / 3 > sum(control) / 3 + 3.0


def colour_iter(trainer_class, config_class, output_dir, **overrides):
    settings = dict(num_iterations=3, num_train_epochs=1, preference_num_candidates=2, preference_pairs_per_sample=2, pair_selection="random",
                    train_batch_size=2, agent_learning_rate=0.2, save_steps=2, save_total_limit=None, eval_interval=2, eval_num_samples=2,
                    output_dir=str(output_dir), progress_bar=False, seed=4, preference_replay_mode="all_history")
    if trainer_class is MARLHFIterTrainer:
        settings.update(reward_learning_rate=0.05, reward_train_batch_size=2, num_generations=2, rollout_buffer_size=2)
    settings.update(overrides)
    return trainer_class(env=DialogueEnv(ColourMatch(num_items=4, num_turns=1)), policies=[TabularPolicy(COLOURS), TabularPolicy(COLOURS)],
                         args=config_class(**settings))


@pytest.mark.parametrize("trainer_class,config_class", [(MADPOIterTrainer, MADPOIterConfig), (MARLHFIterTrainer, MARLHFIterConfig)])
def test_stop_resume_equals_uninterrupted(tmp_path, trainer_class, config_class):
    full, resumed = uninterrupted_and_resumed(lambda out, **kw: colour_iter(trainer_class, config_class, out, **kw), tmp_path, max_steps=3)
    for agent in full.agents:
        assert torch.equal(full.policies[agent].logits, resumed.policies[agent].logits), agent
    assert [len(r) for r in full.rounds.rounds] == [len(r) for r in resumed.rounds.rounds]


def test_marlhf_iter_fits_a_fresh_reward_model_every_round(tmp_path):
    trainer = colour_iter(MARLHFIterTrainer, MARLHFIterConfig, tmp_path / "run", num_train_epochs=2, preference_scoring_reward="model")
    assert trainer.args.preference_scoring_reward == "reward_model"
    starts = []
    original = trainer.fit_reward_model

    def recording(pairs):
        starts.append({k: v.clone() for k, v in trainer.reward_model.state_dict().items()})
        return original(pairs)

    trainer.fit_reward_model = recording
    trainer.train()
    assert len(starts) == 3 and trainer.rounds.fitted == 2 and trainer.state.epoch == 6
    for start in starts:
        assert all(torch.equal(start[k], v) for k, v in trainer._initial_reward_state.items())
    assert not all(torch.equal(trainer.reward_model.state_dict()[k], v) for k, v in trainer._initial_reward_state.items())


def test_iterative_config_errors_name_the_field():
    with pytest.raises(ValueError, match="preference_replay_k is required when preference_replay_mode='nearest_k'"):
        MADPOIterConfig(preference_replay_mode="nearest_k")
    with pytest.raises(ValueError, match="preference_replay_lambda must be in \\[0, 1\\]"):
        MADPOIterConfig(preference_replay_mode="lambda_decay", preference_replay_lambda=1.5)
    with pytest.raises(ValueError, match="preference_replay_sample_size is only for"):
        MADPOIterConfig(preference_replay_sample_size=3)
    with pytest.raises(ValueError, match="comparator_policy must be one of 'current'"):
        MADPOIterConfig(comparator_policy="history")
    with pytest.raises(ValueError, match="comparator_model_name belongs to a comparator not built here"):
        MARLHFIterConfig(comparator_model_name="m")
    with pytest.raises(ValueError, match="preference_scoring_reward must be one of"):
        MARLHFIterConfig(preference_scoring_reward="votes")
    from llm_marl.learners.config_docs import field_docs

    for config_class in (MADPOIterConfig, MARLHFIterConfig):
        assert [name for name, doc in field_docs(config_class).items() if not doc] == [], config_class


@pytest.mark.parametrize("trainer_class,config_class", [(MADPOIterTrainer, MADPOIterConfig), (MARLHFIterTrainer, MARLHFIterConfig)])
def test_log_steps_never_go_back_across_rounds(tmp_path, trainer_class, config_class):
    """Issue 34.6: MARLHFIter logged each round's reward-model fit at steps 0..E-1 again
    ([0,0,1,0,1,2,3,1,0,1,4,...]), overwriting earlier rounds in TensorBoard (W&B drops them).
    Every metric is on the train/ x-axis: the steps of each metric strictly increase."""
    trainer = colour_iter(trainer_class, config_class, tmp_path, reward_num_train_epochs=3, logging_steps=1) \
        if trainer_class is MARLHFIterTrainer else colour_iter(trainer_class, config_class, tmp_path, logging_steps=1)
    trainer.train()
    steps = [step for step, _ in trainer.logger.history]
    assert steps == sorted(steps)
    by_name: dict[str, list[int]] = {}
    for step, metrics in trainer.logger.history:
        for name in metrics:
            by_name.setdefault(name, []).append(step)
    for name, seen in by_name.items():
        assert seen == sorted(set(seen)), (name, seen)
    assert len(by_name["iter/train_preference_pairs"]) == 3 and by_name["iter/round"] == sorted(by_name["iter/round"])
    if trainer_class is MARLHFIterTrainer:
        assert len(by_name["reward_model/loss"]) == 3 and {"reward_model/first_epoch_loss", "reward_model/pairs"} <= set(by_name)
    with open(tmp_path / "metrics.jsonl") as f:
        written = [json.loads(line)["step"] for line in f]
    assert written == sorted(written)


def test_madpo_iter_stops_at_max_steps_inside_a_round_and_resumes_exactly(tmp_path):
    """Issue 34.7: MADPOIter trained a whole round past max_steps (max_steps=2 ran 12 steps)."""
    settings = dict(num_train_epochs=2, train_batch_size=1, preference_pairs_per_sample=2)
    full = colour_iter(MADPOIterTrainer, MADPOIterConfig, tmp_path / "full", **settings)
    full.train()
    first = colour_iter(MADPOIterTrainer, MADPOIterConfig, tmp_path / "split", max_steps=2, **settings)
    first.train()
    assert first.state.global_step == 2 and first.rounds.cut is not None and first.state.epoch == 0
    again = colour_iter(MADPOIterTrainer, MADPOIterConfig, tmp_path / "split", max_steps=5, **settings)
    again.train(resume_from_checkpoint=True)
    assert again.state.global_step == 5
    resumed = colour_iter(MADPOIterTrainer, MADPOIterConfig, tmp_path / "split", **settings)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == full.state.global_step > 5 and resumed.rounds.cut is None
    for agent in full.agents:
        assert torch.equal(full.policies[agent].logits, resumed.policies[agent].logits), agent
    assert [len(r) for r in full.rounds.rounds] == [len(r) for r in resumed.rounds.rounds]


def test_log_steps_never_go_back_for_every_learner(tmp_path):
    """Issue 34.6, the other learners: every metric's steps strictly increase on one x-axis."""
    from llm_marl.learners import IACConfig, IACTrainer, MAGRPOConfig, MAGRPOTrainer
    from llm_marl.learners.preference.madpo import MADPOConfig, MADPOTrainer
    from llm_marl.learners.preference.reward_model import MARLHFConfig, MARLHFTrainer

    common = dict(num_train_epochs=2, eval_interval=2, eval_num_samples=2, logging_steps=1, progress_bar=False, seed=1, num_turns=1)
    runs = [
        (MAGRPOTrainer, MAGRPOConfig(num_generations=2, **common)),
        (IACTrainer, IACConfig(num_generations=2, **common)),
        (MADPOTrainer, MADPOConfig(preference_num_candidates=2, **common)),
        (MARLHFTrainer, MARLHFConfig(preference_num_candidates=2, num_generations=2, reward_num_train_epochs=3, **common)),
        (MARLHFTrainer, MARLHFConfig(rl_algorithm="iac", preference_num_candidates=2, num_generations=2, **common)),
    ]
    for trainer_class, args in runs:
        trainer = trainer_class(env=DialogueEnv(ColourMatch(num_items=4, num_turns=1)), policies=[TabularPolicy(COLOURS), TabularPolicy(COLOURS)], args=args)
        trainer.train()
        by_name: dict[str, list[int]] = {}
        for step, metrics in trainer.logger.history:
            for name in metrics:
                by_name.setdefault(name, []).append(step)
        assert [s for s, _ in trainer.logger.history] == sorted(s for s, _ in trainer.logger.history), trainer_class.__name__
        for name, seen in by_name.items():
            assert seen == sorted(set(seen)), (trainer_class.__name__, name, seen)

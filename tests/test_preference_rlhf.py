"""MARLHF (docs/preference.md): the reward model's Bradley–Terry step by hand, its ranking of
held-out joint answers, RL against it beating a shuffled-label control, and exact resume.

Hand values (a reward model whose backbone maps the winner's text to features (2, 0) and the
loser's to (0, 0), head weight (1, 0), bias 0): s(w) = 2, s(l) = 0, L = −log σ(2) = 0.1269280;
∂L/∂weight = −σ(−2)·(f_w − f_l) = −0.1192029·(2, 0) = (−0.2384058, 0), ∂L/∂bias = 0.
"""

from __future__ import annotations


import pytest
import torch
from torch import nn

torch.set_num_threads(1)

import llm_marl.learners.preference.reward_model as reward_model  # noqa: E402
from llm_marl.envs.dialogue import DialogueEnv  # noqa: E402
from llm_marl.learners.preference import math as pm  # noqa: E402
from llm_marl.learners.preference.reward_model import JointRewardModel, MARLHFConfig, MARLHFTrainer, joint_answer_text  # noqa: E402
from llm_marl.policies.tabular import TabularPolicy  # noqa: E402
from llm_marl.tasks.matrix import MatrixGame  # noqa: E402
from toy_tasks import MENU as COLOURS, ColourMatch, reward_blind_pairs  # noqa: E402

MENU = ("alpha", "beta", "gamma")
ROW, COLUMN = (2.0, 0.0, 1.0), (0.0, 1.5, 3.0)
PAYOFF = tuple(tuple(r + c for c in COLUMN) for r in ROW)  # additive: optimum (alpha, gamma) = 5, uniform mean 2.5


class Lookup(nn.Module):
    """A backbone with fixed features per text (a test double)."""

    hidden_size = 2

    def __init__(self, table):
        super().__init__()
        self.table = table
        self.dummy = nn.Parameter(torch.zeros(()))

    def forward(self, texts):
        return torch.tensor([self.table[t] for t in texts]) + 0 * self.dummy


def test_bradley_terry_step_of_the_reward_model_by_hand():
    env = DialogueEnv(MatrixGame(PAYOFF, name="AdditiveGame"))
    model = JointRewardModel(Lookup({"w": (2.0, 0.0), "l": (0.0, 0.0)}), freeze_backbone=True)
    with torch.no_grad():
        model.reward_head.weight.copy_(torch.tensor([[1.0, 0.0]]))
        model.reward_head.bias.zero_()
    trainer = MARLHFTrainer(env=env, policies=[TabularPolicy(MENU), TabularPolicy(MENU)], reward_model=model,
                            args=MARLHFConfig(num_train_epochs=1, eval_interval=0, progress_bar=False))
    loss, accuracy = trainer.reward_model_loss([("w", "l")])
    assert loss.item() == pytest.approx(0.1269280, abs=1e-6) and accuracy == 1.0
    loss.backward()
    assert model.reward_head.weight.grad[0].tolist() == pytest.approx([-0.2384058, 0.0], abs=1e-6)
    assert model.reward_head.bias.grad.item() == pytest.approx(0.0, abs=1e-7)


def additive_marlhf(seed, shuffled=False, output_dir=None, **overrides):
    env = DialogueEnv(MatrixGame(PAYOFF, name="AdditiveGame"))
    policies = {agent: TabularPolicy(MENU) for agent in env.possible_agents}
    settings = dict(num_train_epochs=15, agent_learning_rate=0.3, preference_num_candidates=6, preference_pairs_per_sample=None,
                    pair_selection="all", reward_learning_rate=0.05, reward_num_train_epochs=30, reward_train_batch_size=4,
                    num_generations=4, rollout_buffer_size=1, eval_interval=0, progress_bar=False, seed=seed)
    settings.update(overrides)
    trainer = MARLHFTrainer(env=env, policies=policies, args=MARLHFConfig(**settings))
    with reward_blind_pairs(reward_model, seed, blind=shuffled):  # the control (shuffled): pairs blind to the reward
        trainer.train()
    return trainer


def held_out_accuracy(trainer):
    """Ranking accuracy over every pair of the 9 joint answers (different true rewards) that the
    reward model was not fit to."""
    observations, _ = trainer.env.reset(options={"index": 0})
    texts = {(i, j): joint_answer_text(observations, trainer.agents, [MENU[i], MENU[j]]) for i in range(3) for j in range(3)}
    with torch.no_grad():
        scores = dict(zip(texts, trainer.reward_model.scores(list(texts.values())).tolist()))
    seen = {frozenset(pair) for pair in trainer.reward_pairs}
    pairs = [(a, b) for a in texts for b in texts if PAYOFF[a[0]][a[1]] > PAYOFF[b[0]][b[1]] and frozenset((texts[a], texts[b])) not in seen]
    assert len(pairs) >= 15
    return pm.pair_accuracy([scores[a] for a, _ in pairs], [scores[b] for _, b in pairs])


def true_reward(trainer):
    observations, _ = trainer.env.reset(options={"index": 0})
    p_row, p_col = (trainer.policies[a].probabilities(observations[a]).tolist() for a in ("row", "column"))
    return sum(p_row[i] * p_col[j] * PAYOFF[i][j] for i in range(3) for j in range(3))


# Measured (3 seeds): held-out accuracy real 1.0 / 1.0 / 0.83 vs shuffled labels 0.36 / 0.53 / 0.47;
# final E[true reward] real 4.96 / 4.97 / 4.01 vs 1.50 / 3.27 / 2.51 (uniform 2.5, optimum 5).


def test_reward_model_ranks_held_out_joint_answers_and_rl_against_it_beats_a_shuffled_label_control():
    real = [additive_marlhf(seed) for seed in range(3)]
    control = [additive_marlhf(seed, shuffled=True) for seed in range(3)]
    accuracy = [held_out_accuracy(t) for t in real]
    reward, control_reward = [true_reward(t) for t in real], [true_reward(t) for t in control]
    print(f"MARLHF held-out accuracy {accuracy}; E[true reward] real {reward}, shuffled labels {control_reward}")
    assert all(a >= 0.75 for a in accuracy)
    assert sum(held_out_accuracy(t) for t in control) / 3 < 0.65
    assert all(r > c for r, c in zip(reward, control_reward))
    assert sum(reward) / 3 > sum(control_reward) / 3 + 1.0
    logged = {k for _, m in real[0].logger.history for k in m}
    assert {"reward_model/loss", "reward_model/accuracy", "train/reward_model/score_mean", "train/turn_1/reward_mean"} <= logged


def colour_marlhf(output_dir, **overrides):
    settings = dict(num_train_epochs=3, preference_num_candidates=3, preference_pairs_per_sample=2, pair_selection="random",
                    reward_learning_rate=0.05, reward_num_train_epochs=2, reward_train_batch_size=2, num_generations=2,
                    rollout_buffer_size=3, train_batch_size=2, agent_learning_rate=0.2, save_steps=2, save_total_limit=None,
                    eval_interval=2, eval_num_samples=2, output_dir=str(output_dir), progress_bar=False, seed=5)
    settings.update(overrides)
    return MARLHFTrainer(env=DialogueEnv(ColourMatch(num_items=4, num_turns=1)), policies=[TabularPolicy(COLOURS), TabularPolicy(COLOURS)],
                         args=MARLHFConfig(**settings))


def test_stop_resume_equals_uninterrupted_without_refitting_the_reward_model(tmp_path):
    full = colour_marlhf(tmp_path / "full")
    full.train()
    first = colour_marlhf(tmp_path / "split", max_steps=3)
    first.train()
    assert 3 <= first.state.global_step < full.state.global_step
    resumed = colour_marlhf(tmp_path / "split")
    resumed.train(resume_from_checkpoint=True)
    assert resumed.reward_pairs == []  # restored from the checkpoint, not fit again
    assert resumed.state.global_step == full.state.global_step
    for agent in full.agents:
        assert torch.equal(full.policies[agent].logits, resumed.policies[agent].logits), agent
    for (name, a), (_, b) in zip(full.reward_model.state_dict().items(), resumed.reward_model.state_dict().items()):
        assert torch.equal(a, b), name


def test_config_errors_and_rl_algorithm_sets_the_advantage_mode():
    assert MARLHFConfig(rl_algorithm="MARLOO").advantage_mode == "rloo"
    assert MARLHFConfig(rl_algorithm="mareforce").rl_algorithm == "mareinforce"
    assert MARLHFConfig(reference_kl_enabled=True).reference_kl_enabled
    with pytest.raises(ValueError, match="rl_algorithm must be one of"):
        MARLHFConfig(rl_algorithm="ppo")
    with pytest.raises(ValueError, match="reward_learning_rate"):
        MARLHFConfig(reward_learning_rate=0.0)
    with pytest.raises(ValueError, match="reward_train_batch_size"):
        MARLHFConfig(reward_train_batch_size=0)
    from llm_marl.learners.config_docs import field_docs

    assert [name for name, doc in field_docs(MARLHFConfig).items() if not doc] == []


def test_no_preference_pair_is_an_error_naming_the_cause():
    tied = MatrixGame(((1.0, 1.0, 1.0),) * 3, name="Flat")
    trainer = MARLHFTrainer(env=DialogueEnv(tied), policies=[TabularPolicy(MENU), TabularPolicy(MENU)],
                            args=MARLHFConfig(num_train_epochs=1, preference_num_candidates=3, eval_interval=0, progress_bar=False))
    with pytest.raises(ValueError, match="gave no preference pair"):
        trainer.train()


# --- the actor-critic RL phase ------------------------------------------------------------------


def test_rl_algorithm_iac_trains_critics_on_the_reward_models_scores():
    from llm_marl.learners.actor_critic.trainer import ACSample, IACTrainer, MAACTrainer

    env = DialogueEnv(MatrixGame(PAYOFF, name="AdditiveGame"))
    args = MARLHFConfig(rl_algorithm="iac", num_train_epochs=1, preference_num_candidates=6, preference_pairs_per_sample=None, pair_selection="all",
                        reward_learning_rate=0.05, reward_num_train_epochs=5, num_generations=3, eval_interval=0, progress_bar=False, seed=1)
    trainer = MARLHFTrainer(env=env, policies=[TabularPolicy(MENU), TabularPolicy(MENU)], args=args)
    assert isinstance(trainer, MARLHFTrainer) and isinstance(trainer, IACTrainer) and not isinstance(trainer, MAACTrainer)
    assert trainer.args.rl_algorithm == "iac" and trainer.args.num_generations == 3 and sorted(trainer.critics) == ["column", "row"]
    assert {"critic_0", "critic_1", "reward_model", "reward_phase"} <= set(trainer.checkpoint_extras())
    central = MARLHFTrainer(env=env, policies=[TabularPolicy(MENU), TabularPolicy(MENU)],
                            args=MARLHFConfig(**{**args.to_dict(), "rl_algorithm": "maac"}))
    assert isinstance(central, MAACTrainer) and list(central.critics) == ["critic"]
    trainer._learn_reward_model()
    roots, samples, _ = trainer._collect([0])
    [node] = roots
    scores = trainer.reward_model_scores([node])[0]
    assert all(isinstance(s, ACSample) for s in samples) and len(samples) == 2
    for sample in samples:
        assert sample.rewards == pytest.approx(scores)  # the critic's targets come from the model's scores
    truth = [PAYOFF[MENU.index(node.completions["row"][j].text)][MENU.index(node.completions["column"][j].text)] for j in range(3)]
    assert node.rewards == truth  # the tree keeps the env's reward


@pytest.mark.parametrize("algorithm", ["iac", "maac"])
def test_actor_critic_rl_phase_beats_a_shuffled_label_control(algorithm):
    overrides = dict(rl_algorithm=algorithm, num_train_epochs=30, critic_learning_rate=0.3)
    real = [true_reward(additive_marlhf(seed, **overrides)) for seed in range(3)]
    control = [true_reward(additive_marlhf(seed, shuffled=True, **overrides)) for seed in range(3)]
    print(f"MARLHF {algorithm}: E[true reward] real {real}, shuffled labels {control}")
    assert all(r > c for r, c in zip(real, control)) and sum(real) / 3 > sum(control) / 3 + 1.0


def test_resume_is_exact_with_an_iac_rl_phase(tmp_path):
    full = colour_marlhf(tmp_path / "full", rl_algorithm="iac", critic_learning_rate=0.1)
    full.train()
    first = colour_marlhf(tmp_path / "split", rl_algorithm="iac", critic_learning_rate=0.1, max_steps=3)
    first.train()
    resumed = colour_marlhf(tmp_path / "split", rl_algorithm="iac", critic_learning_rate=0.1)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == full.state.global_step > first.state.global_step
    for agent in full.agents:
        assert torch.equal(full.policies[agent].logits, resumed.policies[agent].logits), agent
        assert torch.equal(full.critics[agent].table, resumed.critics[agent].table), agent


def test_language_model_reward_model_without_a_tokenizer_scores_ids_and_refuses_texts():
    """As CoMLRL: JointRewardModel(lm) builds without a tokenizer and scores token ids; texts need one."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    lm = GPT2LMHeadModel(GPT2Config(vocab_size=12, n_positions=8, n_embd=4, n_layer=1, n_head=1))
    model = JointRewardModel(lm)
    ids, mask = torch.tensor([[3, 4, 0], [0, 3, 4]]), torch.tensor([[1, 1, 0], [0, 1, 1]])
    scores = model(ids, mask)
    assert scores.shape == (2,) and torch.isfinite(scores).all()
    with pytest.raises(ValueError, match="scoring texts with a language-model backbone needs its tokenizer="):
        model.scores(["a joint answer"])

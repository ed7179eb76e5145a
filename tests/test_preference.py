"""MADPO (docs/preference.md): pair selection, the joint DPO loss and its per-agent gradients
against hand computation, learning against a shuffled-label control, and exact resume.

Hand values (tabular agents over (alpha, beta, gamma); the log-softmax normalizer cancels in a
margin, so Δ = (z_w − z_l) − (z_ref,w − z_ref,l) in logits z):
    row policy logits (ln 6, 0, 0), reference (ln 2, 0, 0), winner alpha, loser beta: Δ_row = ln 3
    (reference-free: ln 6); column policy = reference: Δ_column = 0.
    beta = 1: L = −log σ(ln 3) = ln(4/3) = 0.2876821; dL/dΣΔ = −σ(−ln 3) = −1/4, and ∂Δ/∂z = e_w − e_l,
    so both agents' logit gradients are (−0.25, +0.25, 0) (an agent-by-agent DPO would give the
    column −σ(0) = −1/2 instead). With row logits (ln 3, 0, 0) and a fixed column partner at
    (ln 3, 0, 0), both over a uniform reference, ΣΔ = ln 9: L = ln(10/9) = 0.1053605, the row's gradient (−0.1, +0.1, 0).
"""

from __future__ import annotations

import math
import random

import pytest
import torch

torch.set_num_threads(1)

import llm_marl.learners.preference.madpo as preference  # noqa: E402
from llm_marl.envs import make  # noqa: E402
from llm_marl.envs.dialogue import DialogueEnv  # noqa: E402
from llm_marl.learners.preference import math as pm  # noqa: E402
from llm_marl.learners.preference.madpo import MADPOConfig, MADPOTrainer, PreferenceSample  # noqa: E402
from llm_marl.learners.tree import RolloutNode  # noqa: E402
from llm_marl.policies.base import Completion  # noqa: E402
from llm_marl.policies.tabular import TabularPolicy  # noqa: E402
from llm_marl.tasks.matrix import CLIMBING  # noqa: E402
from toy_tasks import MENU as COLOURS, ColourMatch, reward_blind_pairs  # noqa: E402
from resumed import uninterrupted_and_resumed  # noqa: E402

MENU = ("alpha", "beta", "gamma")


# --- pure functions -------------------------------------------------------------------------


REWARDS = [1.0, 3.0, 2.0, 3.0]  # ordered pairs with a higher first: (1,0) 2, (1,2) 1, (2,0) 1, (3,0) 2, (3,2) 1


def test_pair_selection_all_keeps_every_strict_pair_in_winner_loser_order():
    assert pm.select_pairs(REWARDS, "all") == [(1, 0), (1, 2), (2, 0), (3, 0), (3, 2)]


def test_pair_selection_reward_gap_takes_largest_gaps_first_ties_in_order():
    assert pm.select_pairs(REWARDS, "reward_gap", limit=3) == [(1, 0), (3, 0), (1, 2)]
    assert pm.select_pairs(REWARDS, "reward_gap") == [(1, 0), (3, 0), (1, 2), (2, 0), (3, 2)]


def test_pair_selection_random_is_a_seeded_subset_of_the_strict_pairs():
    every = set(pm.select_pairs(REWARDS, "all"))
    draws = [pm.select_pairs(REWARDS, "random", limit=3, rng=random.Random(seed)) for seed in range(6)]
    for draw in draws:
        assert len(draw) == 3 and len(set(draw)) == 3 and set(draw) <= every
    assert draws[0] == pm.select_pairs(REWARDS, "random", limit=3, rng=random.Random(0))
    assert len({tuple(d) for d in draws}) > 1  # not a fixed order


def test_pair_selection_ties_and_errors():
    assert pm.select_pairs([2.0, 2.0, 2.0], "reward_gap", limit=4) == []
    with pytest.raises(ValueError, match="preference_pairs_per_sample must be None"):
        pm.select_pairs(REWARDS, "all", limit=2)
    with pytest.raises(ValueError, match="pair_selection must be one of"):
        pm.select_pairs(REWARDS, "best")
    with pytest.raises(ValueError, match="candidate 1: reward is nan"):
        pm.select_pairs([0.0, math.nan], "all")


def test_joint_dpo_loss_sums_margins_over_agents_before_the_sigmoid():
    chosen = torch.tensor([[math.log(6)], [0.0]])
    rejected = torch.zeros(2, 1)
    ref_chosen = torch.tensor([[math.log(2)], [0.0]])
    margins = pm.dpo_margins(chosen, rejected, ref_chosen, torch.zeros(2, 1))
    assert margins[:, 0].tolist() == pytest.approx([math.log(3), 0.0])
    assert pm.joint_dpo_losses(margins, beta=1.0).item() == pytest.approx(math.log(4 / 3))
    assert pm.dpo_margins(chosen, rejected, None, None)[0, 0].item() == pytest.approx(math.log(6))
    # beta = 0.5: -log sigmoid(0.5 ln 3) = ln(1 + 1/sqrt(3)) = 0.4571108
    assert pm.joint_dpo_losses(margins, beta=0.5).item() == pytest.approx(math.log(1 + 3 ** -0.5))


def test_bradley_terry_loss_hand_computed():
    losses = pm.bradley_terry_losses(torch.tensor([2.0, 0.0]), torch.tensor([0.0, 0.0]))
    # -log sigmoid(2) = ln(1 + e^-2) = 0.1269280; -log sigmoid(0) = ln 2 = 0.6931472
    assert losses.tolist() == pytest.approx([0.1269280, 0.6931472], abs=1e-6)
    assert losses.mean().item() == pytest.approx(0.4100376, abs=1e-6)
    assert pm.pair_accuracy([2.0, 0.0, -1.0], [0.0, 0.0, 0.0]) == pytest.approx(0.5)


# --- the trainer's loss and gradients ---------------------------------------------------------


def matrix_trainer(column_trainable=True, **overrides):
    env = make("ClimbingGame-v0")
    policies = {agent: TabularPolicy(MENU) for agent in env.possible_agents}
    observations, _ = env.reset(options={"index": 0})
    for agent, policy in policies.items():
        policy.row(observations[agent])
    if not column_trainable:
        policies["column"].logits.requires_grad_(False)
    settings = dict(num_train_epochs=1, preference_num_candidates=2, dpo_beta=1.0, eval_interval=0, progress_bar=False)
    settings.update(overrides)
    return MADPOTrainer(env=env, policies=policies, args=MADPOConfig(**settings)), observations


def set_logits(policy, observation, values):
    with torch.no_grad():
        policy.logits[policy.row(observation)] = torch.tensor(values)


def hand_node(observations):
    """One item, two aligned joint answers: (alpha, alpha) earns 11, (beta, beta) 7."""
    answers = [Completion("alpha", action=0), Completion("beta", action=1)]
    return RolloutNode(
        turn=0, index=0, observations=dict(observations), completions={"row": list(answers), "column": list(answers)},
        joint=[(0, 0), (1, 1)], rewards=[11.0, 7.0], returns=[11.0, 7.0], children=[None, None],
    )


def logit_grad(trainer, agent, observation):
    policy = trainer.policies[agent]
    return policy.logits.grad[policy.rows[observation]].tolist()


def test_joint_dpo_loss_and_per_agent_gradients_on_a_tabular_team():
    trainer, obs = matrix_trainer()
    set_logits(trainer.policies["row"], obs["row"], [math.log(6), 0.0, 0.0])
    set_logits(trainer.dpo_references["row"], obs["row"], [math.log(2), 0.0, 0.0])
    samples = trainer._samples([hand_node(obs)])
    assert [type(s) for s in samples] == [PreferenceSample, PreferenceSample]
    row, column = samples
    assert row.pairs == [(0, 1)] and row.answer_pairs == [(0, 1)] and row.pair_rewards == [(11.0, 7.0)]
    assert row.reference_log_probs[0] == pytest.approx((math.log(1 / 2), math.log(1 / 4)))
    assert row.advantages == [1.0, -1.0] and column.fixed_margins == [0.0]
    done = trainer._team_backward({"row": [row], "column": [column]})
    assert done["row"][0].item() == pytest.approx(math.log(4 / 3))
    assert done["column"][0].item() == pytest.approx(math.log(4 / 3))
    assert logit_grad(trainer, "row", obs["row"]) == pytest.approx([-0.25, 0.25, 0.0])
    assert logit_grad(trainer, "column", obs["column"]) == pytest.approx([-0.25, 0.25, 0.0])


def test_reference_free_margins_drop_the_reference():
    trainer, obs = matrix_trainer(dpo_reference=False)
    assert trainer.dpo_references is None
    set_logits(trainer.policies["row"], obs["row"], [math.log(6), 0.0, 0.0])
    row, column = trainer._samples([hand_node(obs)])
    assert row.reference_log_probs == []
    done = trainer._team_backward({"row": [row], "column": [column]})
    assert done["row"][0].item() == pytest.approx(math.log(7 / 6))  # -log sigmoid(ln 6)
    assert logit_grad(trainer, "row", obs["row"]) == pytest.approx([-1 / 7, 1 / 7, 0.0])


def test_a_fixed_partner_enters_the_joint_margin_without_being_trained():
    trainer, obs = matrix_trainer(column_trainable=False)
    assert "column" not in trainer.optimizers
    set_logits(trainer.policies["column"], obs["column"], [math.log(3), 0.0, 0.0])
    set_logits(trainer.policies["row"], obs["row"], [math.log(3), 0.0, 0.0])
    row, column = trainer._samples([hand_node(obs)])
    assert row.fixed_margins == pytest.approx([math.log(3)])
    done = trainer._team_backward({"row": [row]})
    assert done["row"][0].item() == pytest.approx(math.log(10 / 9))
    assert logit_grad(trainer, "row", obs["row"]) == pytest.approx([-0.1, 0.1, 0.0])


def test_misaligned_minibatches_are_refused_naming_the_agents():
    trainer, obs = matrix_trainer()
    row, column = trainer._samples([hand_node(obs)])
    other = PreferenceSample("column", obs["column"], column.completions, column.returns, column.advantages, 5, 0, pairs=[(0, 1)],
                             answer_pairs=[(0, 1)])
    with pytest.raises(ValueError, match="agents 'row' and 'column' have mini-batches of different preference pairs"):
        trainer._team_backward({"row": [row], "column": [other]})


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="num_turns must be 1"):
        MADPOConfig(num_turns=2)
    with pytest.raises(ValueError, match="preference_num_candidates"):
        MADPOConfig(preference_num_candidates=1)
    with pytest.raises(ValueError, match="preference_pairs_per_sample must be None when pair_selection='all'"):
        MADPOConfig(pair_selection="all")
    with pytest.raises(ValueError, match="dpo_beta"):
        MADPOConfig(dpo_beta=0.0)
    with pytest.raises(ValueError, match="pair_selection must be one of"):
        MADPOConfig(pair_selection="best", preference_pairs_per_sample=None)
    with pytest.raises(ValueError, match="reference_kl_enabled is a REINFORCE field"):
        MADPOConfig(reference_kl_enabled=True)


# --- learning ----------------------------------------------------------------------------------

# Measured (climbing game, 3 seeds, 15 epochs, C=8, 8 pairs per item, beta 0.5, lr 0.3): final
# E[reward] real 5.24 / 5.69 / 10.39 (mean 7.11); shuffled preference labels -2.93 / -4.22 / -0.33
# (mean -2.49); the uniform policy's is -3.44.


def climbing_madpo(seed, shuffled=False):
    env = make("ClimbingGame-v0")
    policies = {agent: TabularPolicy(MENU) for agent in env.possible_agents}
    args = MADPOConfig(num_train_epochs=15, agent_learning_rate=0.3, preference_num_candidates=8, preference_pairs_per_sample=8,
                       dpo_beta=0.5, rollout_buffer_size=1, eval_interval=0, progress_bar=False, seed=seed)
    trainer = MADPOTrainer(env=env, policies=policies, args=args)
    with reward_blind_pairs(preference, seed, blind=shuffled):  # the control (shuffled): pairs blind to the reward
        trainer.train()
    observations, _ = env.reset(options={"index": 0})
    p_row, p_col = (policies[a].probabilities(observations[a]).tolist() for a in ("row", "column"))
    return sum(p_row[i] * p_col[j] * CLIMBING[i][j] for i in range(3) for j in range(3))


def test_madpo_beats_a_shuffled_label_control_on_the_climbing_game():
    real = [climbing_madpo(seed) for seed in range(3)]
    control = [climbing_madpo(seed, shuffled=True) for seed in range(3)]
    print(f"MADPO climbing E[reward]: real {[round(v, 2) for v in real]}, shuffled labels {[round(v, 2) for v in control]}")
    assert all(r > c for r, c in zip(real, control))
    assert sum(real) / 3 > sum(control) / 3 + 3.0


# --- run machinery -----------------------------------------------------------------------------


def colour_madpo(output_dir, **overrides):
    settings = dict(num_train_epochs=3, preference_num_candidates=3, preference_pairs_per_sample=2, pair_selection="random",
                    rollout_buffer_size=3, train_batch_size=2, agent_learning_rate=0.2, save_steps=2, save_total_limit=None,
                    eval_interval=2, eval_num_samples=2, output_dir=str(output_dir), progress_bar=False, seed=3)
    settings.update(overrides)
    return MADPOTrainer(env=DialogueEnv(ColourMatch(num_items=4, num_turns=1)), policies=[TabularPolicy(COLOURS), TabularPolicy(COLOURS)],
                        args=MADPOConfig(**settings))


@pytest.mark.parametrize("refresh", ["epoch", "once"])
def test_stop_resume_equals_uninterrupted(tmp_path, refresh):
    def past_the_first_epoch(stopped):
        assert stopped.state.epoch >= 1  # the "once" store is used after the resume

    full, resumed = uninterrupted_and_resumed(lambda out, **kw: colour_madpo(out, preference_refresh=refresh, **kw), tmp_path,
                                              max_steps=3, on_stopped=past_the_first_epoch)
    for agent in full.agents:
        assert torch.equal(full.policies[agent].logits, resumed.policies[agent].logits), agent
        assert not torch.equal(full.policies[agent].logits, torch.zeros_like(full.policies[agent].logits))
    logged = {k for _, m in full.logger.history for k in m}
    assert {"train/dpo/loss", "train/dpo/accuracy", "train/preference/pairs_per_item", "eval/turn_1/reward_mean"} <= logged
    from llm_marl.runs.recording import iter_records

    records = [r for r in iter_records(str(tmp_path / "full")) if r["kind"] == "train"]
    assert records and all(len(n["agents"]["left"]["advantages"]) == 3 for r in records for n in r["nodes"])  # C answers recorded
    from llm_marl.viewer.page import write_page

    assert "<html" in open(write_page(str(tmp_path / "full"))).read().lower()  # llm-marl view reads the run


def test_every_config_field_has_a_one_line_doc():
    from llm_marl.learners.config_docs import field_docs

    missing = [name for name, doc in field_docs(MADPOConfig).items() if not doc]
    assert missing == []


def test_refresh_once_samples_in_the_first_epoch_only_and_replays_its_pairs(tmp_path):
    trainer = colour_madpo(tmp_path / "run", preference_refresh="once", eval_interval=0, save_steps=0)
    calls = []
    for policy in trainer.policies.values():
        original = policy.sample
        policy.sample = lambda obs, k, generators=None, original=original: calls.append(len(obs)) or original(obs, k, generators=generators)
    trainer.train()
    assert calls == [1] * 8  # 4 items, 2 agents, first epoch only
    steps_per_epoch = 3  # rollout_buffer_size 3, train_batch_size 2: items 1-3 in steps of 2 and 1, item 4 at the epoch end
    assert trainer.state.global_step == 3 * steps_per_epoch and sorted(trainer.pair_store.batches) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="preference_refresh must be one of"):
        MADPOConfig(preference_refresh="never")


def test_a_non_finite_dpo_loss_raises_naming_agent_step_and_item_and_updates_no_agent():
    trainer, obs = matrix_trainer()
    row, column = trainer._samples([hand_node(obs)])
    set_logits(trainer.policies["row"], obs["row"], [math.nan, 0.0, 0.0])
    before = trainer.policies["column"].logits.detach().clone()
    with pytest.raises(FloatingPointError, match=r"agent 'row', optimizer step 1, items \[0\]: loss is nan; no agent was updated"):
        trainer._joint_optimizer_step({"row": [row], "column": [column]})
    assert torch.equal(trainer.policies["column"].logits, before)

"""MADPO and MARLHF with a team of LoRA adapters on a tiny language model: one forward scores
both agents, the reference is the base with adapters disabled (no copy), only adapters train.

Hand value: peft starts every lora_B at 0, so before the first step every adapter scores exactly
like the base — each agent's DPO margin is 0 and the first step's joint loss is −log σ(0) = ln 2.
"""

from __future__ import annotations

import math

import pytest
import torch

torch.set_num_threads(1)

from llm_marl.envs.dialogue import DialogueEnv  # noqa: E402
from llm_marl.learners.preference.madpo import MADPOConfig, MADPOTrainer  # noqa: E402
from llm_marl.learners.preference.reward_model import MARLHFConfig, MARLHFTrainer  # noqa: E402
from llm_marl.policies import LoRATeam  # noqa: E402
from llm_marl.tasks.function_task import FunctionTask  # noqa: E402

PROMPTS = ["The assert statement", "A", "If the module being imported is not a top level module,"]
AGENTS = ("agent_0", "agent_1")


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir  # tests/conftest.py: built once a session


def team_of(model_dir):
    return LoRATeam.from_pretrained(model_dir, agents=AGENTS, r=4, alpha=8, max_new_tokens=4, temperature=1.0, top_p=None, top_k=None)


def reward(*answers):
    return [float(sum(len(a[0]) for a in answers)) / 40.0]


def env():
    return DialogueEnv(FunctionTask(reward, lambda item: item["prompt"], None, [{"prompt": p} for p in PROMPTS], num_agents=2, num_turns=1))


SETTINGS = dict(num_agents=2, num_train_epochs=1, agent_learning_rate=1e-2, max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=None,
                preference_num_candidates=3, preference_pairs_per_sample=2, rollout_buffer_size=3, eval_interval=0, logging_steps=1,
                progress_bar=False, seed=3)


def lora_state(team):
    return {n: p.detach().clone() for n, p in team.model.named_parameters()}


def test_madpo_trains_a_team_in_one_forward_against_the_base(model_dir):
    team = team_of(model_dir)
    trainer = MADPOTrainer(env=env(), policies=team.policies, args=MADPOConfig(**SETTINGS))
    for reference in trainer.dpo_references.values():
        assert reference.model is team.model and list(reference.parameters()) == []
    before = lora_state(team)
    scored = []
    original = team.log_probs
    team.log_probs = lambda requests, reduction="sum": scored.append(sorted(requests)) or original(requests, reduction)
    trainer.train()
    assert trainer.state.global_step == 1 and scored == [list(AGENTS)]
    losses = [row["train/dpo/loss"] for _, row in trainer.logger.history if "train/dpo/loss" in row]
    assert losses == [pytest.approx(math.log(2), abs=1e-5)]
    after = lora_state(team)
    assert all(torch.equal(before[n], after[n]) for n in before if "lora_" not in n)
    assert any(not torch.equal(before[n], after[n]) for n in before if "lora_B" in n)


def test_marlhf_fits_a_reward_model_on_a_copy_of_the_base_and_trains_the_team(model_dir):
    team = team_of(model_dir)
    args = MARLHFConfig(**SETTINGS, num_generations=2, reward_learning_rate=1e-3, reward_train_batch_size=2)
    trainer = MARLHFTrainer(env=env(), policies=team.policies, args=args)
    backbone = trainer.reward_model.backbone
    assert trainer.reward_model.is_language_model and not any(p is q for p in backbone.parameters() for q in team.model.parameters())
    before = lora_state(team)
    trainer.train()
    assert trainer.reward_phase.done and trainer.reward_phase.pairs > 0 and trainer.state.global_step >= 1
    assert any("reward_model/loss" in row for _, row in trainer.logger.history)
    assert not any("lora_" in n for n, _ in backbone.named_parameters())
    after = lora_state(team)
    assert all(torch.equal(before[n], after[n]) for n in before if "lora_" not in n)
    assert any(not torch.equal(before[n], after[n]) for n in before if "lora_B" in n)


# --- learning on the writing task (slow; the climbing-game test in test_preference.py is its fast sibling) ---

# Measured (torch CPU, one thread): the default tiny model and llm_marl.cli.DEFAULT_RUN's sampling on
# 48 train items, MADPO with C = 4, 4 pairs per item, beta 0.1, lr 3e-4, 8 items per update (6 steps,
# ~6 s of training). Mean eval reward over 4 sampling seeds of the 32 eval items; untrained 0.1089.
# Seeds 0 / 1 / 2: real 0.2120 / 0.2494 / 0.2067; shuffled preference labels 0.0880 / 0.1954 / 0.1354
# (real minus control: 0.124 / 0.054 / 0.071). Margins about half the smallest measured.
WRITING_GAIN, WRITING_CONTROL_MARGIN = 0.05, 0.04


def writing_madpo(seed, shuffled):
    import llm_marl.learners.preference.madpo as preference
    from toy_tasks import reward_blind_pairs
    from llm_marl.cli import DEFAULT_RUN, build_trainer

    options = dict(DEFAULT_RUN)
    options.update(train_items=48, seed=seed, progress_bar=False)
    base = build_trainer(options)
    args = MADPOConfig(num_agents=2, num_train_epochs=1, preference_num_candidates=4, preference_pairs_per_sample=4, dpo_beta=0.1,
                       items_per_step=8, rollout_buffer_size=8, max_new_tokens=32, temperature=1.0, top_p=1.0, top_k=None,
                       agent_learning_rate=3e-4, eval_interval=0, eval_num_samples=32, eval_batch_size=32, max_grad_norm=1.0,
                       progress_bar=False, seed=seed, rollout_log_steps=0)
    trainer = MADPOTrainer(env=base.env, policies=base.policies, args=args, eval_env=base.eval_env)
    before = mean_eval_reward(trainer)
    with reward_blind_pairs(preference, seed, blind=shuffled):
        trainer.train()
    return before, mean_eval_reward(trainer)


def mean_eval_reward(trainer):
    values = []
    for eval_seed in (5000, 5001, 5002, 5003):
        values.append(trainer.evaluate(seed=eval_seed)["eval/turn_1/reward_mean"])
    return sum(values) / len(values)


@pytest.mark.slow
def test_madpo_raises_the_writing_reward_against_shuffled_labels():
    runs = [writing_madpo(seed, False) for seed in range(3)]
    control = [writing_madpo(seed, True)[1] for seed in range(3)]
    real = [after for _, after in runs]
    print(f"MADPO writing reward: untrained {runs[0][0]}, real {real}, shuffled labels {control}")
    assert all(after > before + WRITING_GAIN for before, after in runs)
    assert all(r > c for r, c in zip(real, control)) and sum(real) / 3 > sum(control) / 3 + WRITING_CONTROL_MARGIN

"""The sampler–scorer gap, logged in every run (issue 33.2): ``train/<agent>/sampler_gap`` is the
mean |log p_sampler − log p_scorer| per token of the answers an agent sampled and was scored on
with the same weights; past the sampler dtype's default threshold a warning says so once, and
``max_sampler_gap`` stops the run."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from llm_marl.envs import make
from llm_marl.envs.dialogue import DialogueEnv
from llm_marl.learners import IACConfig, IACTrainer, MADPOConfig, MADPOTrainer, MAGRPOConfig, MAGRPOTrainer
from llm_marl.learners.update import SamplerGapError
from llm_marl.policies import CausalLMPolicy, LoRATeam, TabularPolicy
from llm_marl.policies.base import Completion, GapMeter, sampler_record
from llm_marl.policies.lm_runner import LowPrecisionShadow
from llm_marl.tasks.function_task import FunctionTask
from llm_marl.viewer.page import read_metrics
from toy_tasks import ColourMatch

PROMPTS = ["The assert statement", "A", "If the module being imported is not a top level module,"]
SETTINGS = dict(max_new_tokens=12, temperature=0.8, top_p=0.9, top_k=20)


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir  # tests/conftest.py: built once a session


def lm_env(items=3):
    task = FunctionTask(
        lambda a, b: [float(len(a[0]) - len(b[0]))], lambda item: item["prompt"],
        dataset=[{"prompt": PROMPTS[i % len(PROMPTS)]} for i in range(items)], num_agents=2, num_turns=1,
    )
    return DialogueEnv(task)


def lm_config(**overrides):
    settings = dict(
        num_agents=2, num_turns=1, num_train_epochs=2, num_generations=4, rollout_buffer_size=1, eval_interval=0,
        early_termination_threshold=None, agent_learning_rate=0.05, progress_bar=False, output_dir=None, logging_steps=1,
        **SETTINGS,
    )
    settings.update(overrides)
    return MAGRPOConfig(**settings)


def gaps(trainer, agent):
    trainer._flush_metrics(force=True)
    return [m[f"train/{agent}/sampler_gap"] for _, m in trainer.logger.history if f"train/{agent}/sampler_gap" in m]


@pytest.mark.parametrize("learner", ["magrpo", "iac", "madpo"])
def test_tabular_runs_of_every_learner_family_log_an_exact_zero_gap(learner, tmp_path):
    if learner == "magrpo":
        trainer = MAGRPOTrainer(env=make("ClimbingGame-v0"), policies=[TabularPolicy(["alpha", "beta", "gamma"]) for _ in range(2)],
                                args=MAGRPOConfig(num_turns=1, num_train_epochs=2, agent_learning_rate=0.1, eval_interval=0,
                                                  logging_steps=1, progress_bar=False, output_dir=str(tmp_path)))
    elif learner == "iac":
        trainer = IACTrainer(env=make("ClimbingGame-v0"), policies=[TabularPolicy(["alpha", "beta", "gamma"]) for _ in range(2)],
                             args=IACConfig(num_turns=1, num_train_epochs=2, agent_learning_rate=0.1, eval_interval=0, logging_steps=1,
                                            progress_bar=False, output_dir=str(tmp_path)))
    else:
        trainer = MADPOTrainer(env=DialogueEnv(ColourMatch(num_items=4, num_turns=1)), policies=[TabularPolicy(["red", "green", "blue"]) for _ in range(2)],
                               args=MADPOConfig(num_train_epochs=2, preference_num_candidates=3, preference_pairs_per_sample=2,
                                                rollout_buffer_size=3, train_batch_size=2, agent_learning_rate=0.2, eval_interval=0,
                                                logging_steps=1, progress_bar=False, output_dir=str(tmp_path)))
    trainer.train()
    for agent in trainer.agents:
        found = gaps(trainer, agent)
        assert found and all(g == 0.0 for g in found), (agent, found)
    # in metrics.jsonl, hence in the viewer's curves
    assert f"train/{trainer.agents[0]}/sampler_gap" in read_metrics(str(tmp_path))


def test_an_lm_run_logs_a_rounding_sized_fp32_gap_and_a_bounded_bf16_gap(model_dir):
    found = {}
    for dtype in (None, "bfloat16"):
        policies = [CausalLMPolicy.from_pretrained(model_dir, sample_dtype=dtype, **SETTINGS) for _ in range(2)]
        trainer = MAGRPOTrainer(env=lm_env(), policies=policies, args=lm_config())
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # within the default thresholds: no warning
            trainer.train()
        found[dtype] = [g for agent in trainer.agents for g in gaps(trainer, agent)]
        assert len(found[dtype]) >= 2 * 4
    assert max(found[None]) < 1e-4  # kernel rounding of the same fp32 weights
    assert 1e-4 < max(found["bfloat16"]) < 0.15  # bf16 rounding of the trained weights


def test_answers_sampled_through_hf_generate_are_measured_too(model_dir):
    policy = CausalLMPolicy.from_pretrained(model_dir, use_hf_generate=True, **SETTINGS)
    torch.manual_seed(2)
    completions = [c for group in policy.sample(PROMPTS, 2) for c in group]
    assert all(c.sampler is not None and len(c.sampler.log_probs) == len(c.token_ids) for c in completions)
    policy.log_probs([p for p in PROMPTS for _ in range(2)], completions)
    gap, tokens = policy.sampler_gap.take()
    assert tokens == sum(len(c.token_ids) for c in completions) and gap < 1e-4


def test_a_team_logs_each_agents_gap_from_its_one_scoring_forward(model_dir):
    team = LoRATeam.from_pretrained(model_dir, agents=("agent_0", "agent_1"), r=4, alpha=8, sample_dtype="bfloat16", **SETTINGS)
    trainer = MAGRPOTrainer(env=lm_env(), policies=team.policies, args=lm_config(agent_learning_rate=0.2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    # healthy: agent_1's gap spikes past its threshold on two steps in a row (one sampled token
    # far off), which is not the lasting gap of a lagging sampler (GAP_PERSISTENCE)
    assert not [w for w in caught if "sampler_gap" in str(w.message) or "log-probs differ" in str(w.message)]
    for agent in ("agent_0", "agent_1"):
        found = gaps(trainer, agent)
        assert len(found) >= 4 and all(0 < g < 0.15 for g in found), (agent, found)


def stale_copy(monkeypatch):
    """The old main's bug, planted: the bf16 copy is never refreshed after it is built."""
    monkeypatch.setattr(LowPrecisionShadow, "current", lambda self: self.runner)


def test_a_stale_sampler_is_warned_once_with_its_numbers(model_dir, monkeypatch):
    stale_copy(monkeypatch)
    policies = [CausalLMPolicy.from_pretrained(model_dir, sample_dtype="bfloat16", **SETTINGS) for _ in range(2)]
    trainer = MAGRPOTrainer(env=lm_env(), policies=policies, args=lm_config(agent_learning_rate=0.3, num_train_epochs=3))
    trainer.on_policy = False  # sampler_staleness would stop it first (tests/test_sampler_staleness.py): the gap's turn
    with pytest.warns(UserWarning, match=r"sampled tokens' log-probs differ from the scorer's by .* past the threshold .* for bfloat16") as caught:
        trainer.train()
    assert len([w for w in caught if "sampler" in str(w.message)]) <= 2  # once per agent
    found = gaps(trainer, trainer.agents[0])
    assert found[-1] > 0.15 and found[-1] > found[0]  # the gap grows as the weights move away


def test_max_sampler_gap_stops_the_run_before_the_step(model_dir, monkeypatch):
    stale_copy(monkeypatch)
    policies = [CausalLMPolicy.from_pretrained(model_dir, sample_dtype="bfloat16", **SETTINGS) for _ in range(2)]
    trainer = MAGRPOTrainer(env=lm_env(), policies=policies, args=lm_config(agent_learning_rate=0.3, num_train_epochs=3, max_sampler_gap=0.1))
    trainer.on_policy = False  # sampler_staleness would stop it first
    with pytest.raises(SamplerGapError, match=r"agent '\w+', optimizer step \d+: .* past max_sampler_gap=0.1; likely causes"):
        trainer.train()
    with pytest.raises(ValueError, match="max_sampler_gap"):
        MAGRPOConfig(max_sampler_gap=-1.0)


def test_the_meter_counts_only_the_samplers_own_answers_scored_with_its_sampling_weights():
    policy = TabularPolicy(["x", "y"])
    other = TabularPolicy(["x", "y"])
    torch.manual_seed(0)
    own = [c for group in policy.sample(["o"], 4) for c in group]
    foreign = [Completion("x", action=0, sampler=sampler_record(other, [-0.1]))]
    policy.log_probs(["o"] * 5, own + foreign)
    assert policy.sampler_gap.take() == (0.0, 4)  # the foreign answer is not measured
    assert policy.sampler_gap.take() is None
    optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
    (-policy.log_probs(["o"], own[:1]).sum()).backward()
    optimizer.step()
    policy.sampler_gap.take()
    policy.log_probs(["o"] * 4, own)  # sampled before the step: learning, not the sampler
    assert policy.sampler_gap.take() is None
    meter = GapMeter("bfloat16")
    assert meter.threshold == 0.15 and GapMeter("float32").threshold == 1e-3
    assert json.dumps(own[0].text)  # completions stay plain values (the record is not part of ==)
    assert own[0] == Completion(own[0].text, action=own[0].action)

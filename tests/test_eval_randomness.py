"""Evaluation draws its own, seeded random numbers (llm_marl/runs/rng.py, ``evaluate``'s docstring).

Found in a real run: two ``llm-marl train`` runs with one seed printed different "before" answers,
because the first evaluation comes before ``train()`` seeds the run and language-model sampling
draws from torch's global generator, which the command had drawn from by then. And an evaluation
in the middle of training drew from that same generator, so ``eval_interval`` changed what
training sampled next. The reward here is a hash of the joint answer, so a changed sample shows
in the metric.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from llm_marl.envs.dialogue import DialogueEnv
from llm_marl.learners import MAGRPOConfig, MAGRPOTrainer
from llm_marl.policies import CausalLMPolicy
from llm_marl.policies.tiny import build_tiny_model, default_model_dir
from llm_marl.runs.rng import seeded_aside
from llm_marl.tasks.function_task import FunctionTask

PROMPTS = ["The assert statement", "A", "If the module being imported is", "The class"]


def text_hash(a, b):
    return [sum(ord(c) * (i + 1) for i, c in enumerate(a[0] + "|" + b[0])) % 9973 / 9973]


def trainer(eval_interval=0, seed=11):
    model_dir = build_tiny_model(default_model_dir())
    task = FunctionTask(text_hash, lambda item: item["prompt"], dataset=[{"prompt": p} for p in PROMPTS],
                        eval_dataset=[{"prompt": p} for p in reversed(PROMPTS)], num_agents=2)
    policies = [CausalLMPolicy.from_pretrained(model_dir, max_new_tokens=8, temperature=1.0) for _ in range(2)]
    args = MAGRPOConfig(num_agents=2, num_turns=1, num_train_epochs=1, num_generations=2, items_per_step=2, rollout_buffer_size=2,
                        eval_interval=eval_interval, eval_num_samples=4, early_termination_threshold=None, agent_learning_rate=0.05,
                        progress_bar=False, output_dir=None, seed=seed)
    return MAGRPOTrainer(env=DialogueEnv(task), policies=policies, args=args)


def test_two_runs_with_one_seed_evaluate_alike_before_training_whatever_was_drawn_before():
    first = trainer()
    before = first.evaluate()
    torch.rand(7), random.random(), np.random.rand()  # what a script or a library draws before the first evaluation
    second = trainer()
    torch.rand(3)
    assert second.evaluate() == before
    assert trainer(seed=12).evaluate() != before  # the seed does reach the samples
    assert first.evaluate(seed=5) == second.evaluate(seed=5) != before  # more draws to average over, by seed


def test_evaluating_leaves_every_generator_as_it_was_so_eval_interval_does_not_change_training():
    probe = trainer()
    states = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    probe.evaluate()
    assert torch.equal(torch.get_rng_state(), states[0]) and random.getstate() == states[1]
    assert np.array_equal(np.random.get_state()[1], states[2])

    quiet, evaluating = trainer(eval_interval=0), trainer(eval_interval=1)
    quiet.train(), evaluating.train()
    assert quiet.state.global_step == evaluating.state.global_step == 2
    for agent in quiet.agents:
        for (name, a), b in zip(quiet.policies[agent].model.named_parameters(), evaluating.policies[agent].model.parameters()):
            assert torch.equal(a, b), (agent, name)


def test_seeded_aside_restores_the_generators_when_the_block_raises():
    generator = torch.Generator().manual_seed(5)

    class Holder:
        pass

    holder = Holder()
    holder.generator = generator
    expected = torch.rand(4, generator=torch.Generator().manual_seed(5))
    before = torch.get_rng_state()
    with pytest.raises(RuntimeError, match="inside"):
        with seeded_aside(99, {"a": holder}):
            inside = torch.rand(2)
            raise RuntimeError("inside")
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(torch.rand(4, generator=generator), expected)  # the policy's own generator too
    with seeded_aside(99, {}):
        assert torch.equal(torch.rand(2), inside)  # the block's draws depend on the seed alone

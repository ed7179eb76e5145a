"""Stop/resume and determinism with tiny language-model agents (the tabular twin is
test_reliability.py)."""

from __future__ import annotations

import json
import os

import pytest
import torch

from llm_marl.envs.dialogue import DialogueEnv
from llm_marl.learners import MAGRPOConfig, MAGRPOTrainer
from llm_marl.policies.causal_lm import CausalLMPolicy
from llm_marl.policies.tiny import build_tiny_model
from llm_marl.tasks.function_task import FunctionTask

torch.set_num_threads(1)

PROMPTS = ["The import statement", "A class definition", "The for loop"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), pretrain_steps=10, batch_size=4)


def reward(short, long):
    return [len(long[0].split()) / (1 + len(short[0].split()))]


def transition(prompt, agent_completions, **kwargs):
    return [prompt + " " + text[:40] for text in agent_completions]


def make_trainer(model_dir, output_dir=None, **overrides):
    settings = dict(
        num_turns=2, num_generations=2, num_train_epochs=2, agent_learning_rate=1e-3, max_new_tokens=6,
        temperature=1.0, top_p=1.0, top_k=None, early_termination_threshold=None, eval_interval=2,
        eval_num_samples=1, logging_steps=1, rollout_buffer_size=3, progress_bar=False, save_steps=2,
        reference_kl_enabled=True, output_dir=output_dir, seed=11,
    )
    settings.update(overrides)
    args = MAGRPOConfig(**settings)
    task = FunctionTask(reward, lambda item: item["prompt"], transition, [{"prompt": p} for p in PROMPTS],
                        num_turns=2, eval_dataset=[{"prompt": p} for p in PROMPTS])
    policies = [CausalLMPolicy.from_pretrained(model_dir, max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=None)
                for _ in range(2)]
    return MAGRPOTrainer(env=DialogueEnv(task), policies=policies, args=args, eval_env=DialogueEnv(task, split="eval"))


def state(trainer):
    return {a: {k: v.clone() for k, v in p.state_dict().items()} for a, p in trainer.policies.items()}


def lines(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(l).items() if not k.endswith("per_second")} for l in f]


def test_lm_stop_resume_equals_uninterrupted(model_dir, tmp_path):
    full = make_trainer(model_dir, str(tmp_path / "full"))
    full.train()
    first = make_trainer(model_dir, str(tmp_path / "split"), max_steps=3)
    first.train()
    assert first.state.global_step < full.state.global_step
    resumed = make_trainer(model_dir, str(tmp_path / "split"))
    resumed.train(resume_from_checkpoint=True)
    a, b = state(full), state(resumed)
    for agent in a:
        for name in a[agent]:
            assert torch.equal(a[agent][name], b[agent][name]), (agent, name)
    assert lines(tmp_path / "full") == lines(tmp_path / "split")


def test_lm_seeded_runs_identical_and_seeds_differ(model_dir):
    runs = [make_trainer(model_dir, num_train_epochs=1, seed=s) for s in (5, 5, 6)]
    for trainer in runs:
        trainer.train()
    (a, b, c) = (state(t) for t in runs)
    same = lambda x, y: all(torch.equal(x[g][n], y[g][n]) for g in x for n in x[g])
    assert same(a, b)
    assert not same(a, c)

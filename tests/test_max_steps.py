"""``max_steps`` counts optimizer steps for every learner (issue 34, item 7): a run stops after
exactly ``max_steps`` steps even when one batch's update makes several (train_batch_size below
rollout_buffer_size, actor-critic's whitened buffers, the end-of-epoch update), and a run stopped
there and resumed equals one that never stopped (the rest of the cut update is checkpointed)."""

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch

torch.set_num_threads(1)

import llm_marl.learners as learners  # noqa: E402
from llm_marl.cli import LEARNERS  # noqa: E402
from llm_marl.envs.dialogue import DialogueEnv  # noqa: E402
from llm_marl.learners.reinforce.centralized import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer  # noqa: E402
from llm_marl.policies.tabular import TabularPolicy  # noqa: E402
from toy_tasks import MENU, ColourMatch  # noqa: E402

SEVERAL = dict(train_batch_size=1, rollout_buffer_size=3)
"""Several optimizer steps per update, and a leftover update at each epoch's end."""


def build(name, output_dir, **overrides):
    """Learner ``name`` (a CLI learner, or "centralized") on tabular ColourMatch (ClimbingGame for
    the centralized learner)."""
    settings = dict(num_train_epochs=2, num_generations=2, output_dir=str(output_dir), progress_bar=False, seed=3,
                    eval_interval=0, save_steps=0, save_total_limit=None, agent_learning_rate=0.3, **SEVERAL)
    if name == "centralized":  # one policy answers for both roles ("red blue")
        settings.update(num_agents=2, num_turns=1)
        settings.update(overrides)
        joint = [f"{x} {y}" for x in MENU for y in MENU]
        return CentralizedMAGRPOTrainer(env=DialogueEnv(ColourMatch(num_items=4, num_turns=1)), policy=TabularPolicy(joint),
                                        args=CentralizedMAGRPOConfig(**settings))
    turns = 1 if name.startswith(("madpo", "marlhf")) else 2
    settings.update(num_turns=turns)
    if name.endswith("iter"):
        settings.update(num_iterations=2, num_train_epochs=1)
    if name.startswith("marlhf"):
        settings.update(reward_train_batch_size=2, reward_learning_rate=0.05)
    settings.update(overrides)
    prefix = LEARNERS[name]
    config_class, trainer_class = getattr(learners, f"{prefix}Config"), getattr(learners, f"{prefix}Trainer")
    return trainer_class(env=DialogueEnv(ColourMatch(num_items=4, num_turns=turns)), policies=[TabularPolicy(MENU), TabularPolicy(MENU)],
                         args=config_class(**settings))


def train(trainer, resume=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train(resume_from_checkpoint=resume)
    return trainer


def metrics_lines(run_dir):
    """Every logged metric but wall-clock throughput."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if not k.endswith("per_second")} for line in f]


def weights(trainer):
    return {agent: policy.logits.detach().clone() for agent, policy in trainer.policies.items()}


@pytest.mark.parametrize("name", [*LEARNERS, "centralized"])
def test_stops_at_exactly_max_steps(tmp_path, name):
    """Fails on the old main for every learner but the iterative MADPO: with three samples per update
    and one per mini-batch, max_steps=1 and 2 took 3 steps."""
    full = train(build(name, tmp_path / "full")).state.global_step
    assert full >= 5
    for k in (1, 2, full - 1):
        assert train(build(name, tmp_path / f"k{k}", max_steps=k)).state.global_step == k, k


@pytest.mark.parametrize("name", [*LEARNERS, "centralized"])
def test_stopped_then_resumed_equals_uninterrupted(tmp_path, name):
    full = train(build(name, tmp_path / "full"))
    first = train(build(name, tmp_path / "split", max_steps=2))
    assert first.state.global_step == 2
    same = train(build(name, tmp_path / "split", max_steps=2), resume=True)  # nothing to do: its checkpoint is saved again, as it was
    assert same.state.global_step == 2 and not [p for p in os.listdir(tmp_path / "split") if ".replaced" in p]
    again = train(build(name, tmp_path / "split", max_steps=4), resume=True)
    assert again.state.global_step == 4
    resumed = train(build(name, tmp_path / "split"), resume=True)
    assert resumed.state.global_step == full.state.global_step
    assert resumed.state.batch_step == full.state.batch_step and resumed.state.epoch == full.state.epoch
    expected = weights(full)
    for agent, logits in weights(resumed).items():
        assert torch.equal(logits, expected[agent]), agent


@pytest.mark.parametrize("name,overrides", [
    ("magrpo", {}), ("marloo", {"num_turns": 2, "items_per_step": 2}), ("iac", {}), ("maac", {}),
    ("iac", {"sample_unit": "answer", "rollout_buffer_size": 5, "train_batch_size": 2}),
])
def test_every_cut_point_resumes_exactly(tmp_path, name, overrides):
    """Cut after every step k of the run (inside a batch's update, between updates, inside the
    end-of-epoch update), resume to the end: the weights (and, actor-critic, the critics) and
    every logged metric equal an uninterrupted run's."""
    overrides = dict(logging_steps=1, eval_interval=2, eval_num_samples=2, **overrides)
    full = train(build(name, tmp_path / "full", **overrides))
    expected = weights(full)
    for k in range(1, full.state.global_step):
        cut = train(build(name, tmp_path / f"k{k}", max_steps=k, **overrides))
        assert cut.state.global_step == k
        resumed = train(build(name, tmp_path / f"k{k}", **overrides), resume=True)
        assert resumed.state.global_step == full.state.global_step, k
        assert metrics_lines(tmp_path / f"k{k}") == metrics_lines(tmp_path / "full"), k
        for agent, logits in weights(resumed).items():
            assert torch.equal(logits, expected[agent]), (k, agent)
        for (name_, extra), (_, other) in zip(full.checkpoint_extras().items() if hasattr(full, "checkpoint_extras") else [],
                                              resumed.checkpoint_extras().items() if hasattr(resumed, "checkpoint_extras") else []):
            for key, value in extra.state_dict().items():
                if isinstance(value, torch.Tensor):
                    assert torch.equal(value, other.state_dict()[key]), (k, name_, key)


@pytest.mark.parametrize("name", ["magrpo", "iac", "madpoiter"])
def test_train_again_with_a_higher_max_steps_goes_on_exactly(tmp_path, name):
    """The same trainer, stopped by max_steps inside an update, trains on when train() is called again."""
    full = train(build(name, tmp_path / "full"))
    trainer = train(build(name, tmp_path / "again", max_steps=1))
    for k in (2, 4, None):
        trainer.args.max_steps = k
        train(trainer)
        assert trainer.state.global_step == (k or full.state.global_step)
    expected = weights(full)
    for agent, logits in weights(trainer).items():
        assert torch.equal(logits, expected[agent]), agent

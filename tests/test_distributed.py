"""Data-parallel training across processes (torchrun, gloo on CPU) and agent placement ("mp")."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from llm_marl.envs.dialogue import DialogueEnv
from llm_marl.learners import MAGRPOConfig, MAGRPOTrainer
from llm_marl.policies.tabular import TabularPolicy
from toy_tasks import MENU, ColourMatch

torch.set_num_threads(1)

TESTS = os.path.dirname(os.path.abspath(__file__))

RANK_SCRIPT = r"""
import os, sys, torch
sys.path.insert(0, {tests!r})
torch.set_num_threads(1)
from test_distributed import train
trainer = train(output_dir={out!r}, items_per_step=1, rollout_buffer_size=1{extra})
rank = int(os.environ["RANK"])
policies = {{a: p.state_dict() for a, p in trainer.policies.items()}}
torch.save({{"world_size": trainer.dist.world_size, "policies": policies}}, os.path.join({weights!r}, f"rank{{rank}}.pt"))
sys.stdout.flush(); sys.stderr.flush()
os._exit(0)  # results are written: skip interpreter teardown, where gloo's threads can abort a rank
"""


def train(output_dir=None, **overrides):
    settings = dict(
        num_turns=1,
        num_generations=3,
        num_train_epochs=3,
        agent_learning_rate=0.2,
        early_termination_threshold=None,
        eval_interval=0,
        logging_steps=1,
        progress_bar=False,
        output_dir=output_dir,
        seed=3,
    )
    settings.update(overrides)
    trainer = MAGRPOTrainer(
        env=DialogueEnv(ColourMatch(num_items=4, num_turns=1)),
        policies=[TabularPolicy(MENU), TabularPolicy(MENU)],
        args=MAGRPOConfig(**settings),
    )
    trainer.train()
    return trainer


def test_two_gloo_ranks_match_one_process_on_the_union(tmp_path):
    out, weights = tmp_path / "ddp", tmp_path / "weights"
    weights.mkdir()
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT.format(tests=TESTS, out=str(out), weights=str(weights), extra=""))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517", str(script)],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    saved = [torch.load(weights / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    assert [s["world_size"] for s in saved] == [2, 2]
    rank0, rank1 = (s["policies"] for s in saved)
    for agent in rank0:
        assert rank0[agent]["_extra_state"] == rank1[agent]["_extra_state"], f"ranks laid out {agent}'s table differently"
        assert torch.equal(rank0[agent]["logits"], rank1[agent]["logits"]), f"ranks disagree on {agent}"

    single = train(items_per_step=2, rollout_buffer_size=2)
    distributed = TabularPolicy(MENU)
    observations = [DialogueEnv(ColourMatch(num_items=4, num_turns=1)).reset(options={"index": i})[0] for i in range(4)]
    for agent, policy in single.policies.items():
        distributed.load_state_dict(rank0[agent])
        for obs in observations:
            learned = distributed.probabilities(obs[agent])
            assert torch.allclose(learned, policy.probabilities(obs[agent]), atol=1e-6), (agent, obs[agent])
            assert (learned - 1 / 3).abs().max() > 0.01, "nothing was learned (still uniform)"

    # The loss is the mean over the union of the ranks' samples: the logged loss and gradient norm
    # equal the one process's (AdamW hides a gradient scaled by the world size; these do not).
    with open(out / "metrics.jsonl") as f:
        logged = [json.loads(line) for line in f]
    names = [f"train/{agent}/{name}" for agent in rank0 for name in ("loss", "grad_norm")]
    assert len(logged) == len(single.logger.history) == 6
    for metrics, (step, expected) in zip(logged, single.logger.history):
        assert metrics["step"] == step
        for name in names:
            assert metrics[name] == pytest.approx(expected[name], rel=1e-6, abs=1e-9), (name, step)
    assert sum(m[name] > 0.1 for m in logged for name in names if name.endswith("grad_norm")) >= 10
    assert sum(abs(m[name]) > 0.01 for m in logged for name in names if name.endswith("loss")) >= 3

    # Rank 0 alone wrote logs and checkpoints, into the one output_dir both ranks were given.
    written = sorted(os.listdir(out))
    assert "metrics.jsonl" in written and any(name.startswith("checkpoint-") for name in written)
    assert len(os.listdir(out / "logs")) == 1


def test_two_ranks_precondition_with_the_natural_gradient_of_the_union(tmp_path):
    """natural_gradient under torchrun: each rank's Fisher is built from every rank's observations
    and sample counts (DistributedContext.gather), so two ranks of one item each step as one
    process of both items does."""
    weights = tmp_path / "weights"
    weights.mkdir()
    script = tmp_path / "rank.py"
    extra = ", natural_gradient=True, optim='sgd', agent_learning_rate=0.5"
    script.write_text(RANK_SCRIPT.format(tests=TESTS, out=str(tmp_path / "ddp"), weights=str(weights), extra=extra))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29521", str(script)],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rank0 = torch.load(weights / "rank0.pt", weights_only=False)["policies"]
    single = train(items_per_step=2, rollout_buffer_size=2, natural_gradient=True, optim="sgd", agent_learning_rate=0.5)
    plain = train(items_per_step=2, rollout_buffer_size=2, optim="sgd", agent_learning_rate=0.5)
    distributed = TabularPolicy(MENU)
    observations = [DialogueEnv(ColourMatch(num_items=4, num_turns=1)).reset(options={"index": i})[0] for i in range(4)]
    for agent, policy in single.policies.items():
        distributed.load_state_dict(rank0[agent])
        for obs in observations:
            assert torch.allclose(distributed.probabilities(obs[agent]), policy.probabilities(obs[agent]), atol=1e-6), (agent, obs[agent])
        assert not torch.allclose(policy.logits, plain.policies[agent].logits, atol=1e-3)  # the preconditioner acted


def test_mp_mode_on_cpu_devices_matches_none_mode():
    plain = train(num_turns=1)
    placed = train(parallel_training="mp", agent_devices=["cpu", "cpu"])
    for agent in plain.policies:
        assert torch.equal(plain.policies[agent].logits, placed.policies[agent].logits)
    assert plain.state.global_step == placed.state.global_step > 0


def test_mp_without_devices_is_rejected():
    with pytest.raises(ValueError, match="agent_devices"):
        MAGRPOConfig(parallel_training="mp")

"""MADPO across processes (torchrun, gloo on CPU) and with agents placed apart ("mp"): the joint
DPO loss is the mean over the union of the ranks' pairs, so two ranks of one item each train
exactly like one process on both items."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import torch

from llm_marl.envs.dialogue import DialogueEnv
from llm_marl.learners.preference.madpo import MADPOConfig, MADPOTrainer
from llm_marl.policies.tabular import TabularPolicy
from toy_tasks import MENU, ColourMatch

torch.set_num_threads(1)

TESTS = os.path.dirname(os.path.abspath(__file__))

RANK_SCRIPT = r"""
import os, sys, torch
sys.path.insert(0, {tests!r})
torch.set_num_threads(1)
from test_preference_distributed import train
trainer = train(output_dir={out!r}, items_per_step=1, rollout_buffer_size=1)
rank = int(os.environ["RANK"])
torch.save({{"world_size": trainer.dist.world_size, "policies": {{a: p.state_dict() for a, p in trainer.policies.items()}}}},
           os.path.join({weights!r}, f"rank{{rank}}.pt"))
sys.stdout.flush(); sys.stderr.flush()
os._exit(0)  # results are written: skip interpreter teardown, where gloo's threads can abort a rank
"""


def train(output_dir=None, **overrides):
    settings = dict(num_train_epochs=3, preference_num_candidates=3, preference_pairs_per_sample=2, pair_selection="random",
                    agent_learning_rate=0.2, eval_interval=0, logging_steps=1, progress_bar=False, output_dir=output_dir, seed=3)
    settings.update(overrides)
    trainer = MADPOTrainer(env=DialogueEnv(ColourMatch(num_items=4, num_turns=1)), policies=[TabularPolicy(MENU), TabularPolicy(MENU)],
                           args=MADPOConfig(**settings))
    trainer.train()
    return trainer


def test_two_gloo_ranks_match_one_process_on_the_union(tmp_path):
    out, weights = tmp_path / "ddp", tmp_path / "weights"
    weights.mkdir()
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT.format(tests=TESTS, out=str(out), weights=str(weights)))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    with socket.socket() as probe:  # a free port: other test runs on this machine may hold a fixed one
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port), str(script)],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    saved = [torch.load(weights / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    assert [s["world_size"] for s in saved] == [2, 2]
    rank0, rank1 = (s["policies"] for s in saved)
    single = train(items_per_step=2, rollout_buffer_size=2)
    observations = [DialogueEnv(ColourMatch(num_items=4, num_turns=1)).reset(options={"index": i})[0] for i in range(4)]
    for agent, policy in single.policies.items():
        assert torch.equal(rank0[agent]["logits"], rank1[agent]["logits"]), f"ranks disagree on {agent}"
        learned = TabularPolicy(MENU)
        learned.load_state_dict(rank0[agent])
        for obs in observations:
            assert torch.allclose(learned.probabilities(obs[agent]), policy.probabilities(obs[agent]), atol=1e-6), (agent, obs[agent])
        assert any((learned.probabilities(obs[agent]) - 1 / 3).abs().max() > 0.01 for obs in observations), "nothing was learned"


def test_mp_mode_on_cpu_devices_matches_none_mode():
    plain = train()
    placed = train(parallel_training="mp", agent_devices=["cpu", "cpu"])
    assert plain.state.global_step == placed.state.global_step > 0
    for agent in plain.policies:
        assert torch.equal(plain.policies[agent].logits, placed.policies[agent].logits)

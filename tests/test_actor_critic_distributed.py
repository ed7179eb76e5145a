"""IAC and MAAC data-parallel across two gloo ranks (torchrun) equal one process on the union.

Two-turn items, one answer per node (G = 1), so that a rank's consecutive mini-batches of one
sample and the single process's mini-batches of two hold the same (turn, item) pairs.

With advantage whitening off (it is per rank, like a group), a rank's loss share is its samples'
sum over the union's count, so two ranks with one item each take the same steps as one process
with both items: actors, critics and the critics' table layouts agree exactly.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from llm_marl.envs.dialogue import DialogueEnv
from llm_marl.learners import IACConfig, IACTrainer, MAACConfig, MAACTrainer
from llm_marl.policies.tabular import TabularPolicy
from toy_tasks import MENU, ColourMatch

torch.set_num_threads(1)

TESTS = os.path.dirname(os.path.abspath(__file__))
LEARNERS = {"iac": (IACTrainer, IACConfig), "maac": (MAACTrainer, MAACConfig)}

RANK_SCRIPT = r"""
import os, sys, torch
sys.path.insert(0, {tests!r})
torch.set_num_threads(1)
from test_actor_critic_distributed import train
trainer = train({learner!r}, output_dir={out!r}, items_per_step=1, rollout_buffer_size=1)
rank = int(os.environ["RANK"])
state = {{"policies": {{a: p.state_dict() for a, p in trainer.policies.items()}},
          "critics": {{n: c.state_dict() for n, c in trainer.critics.items()}}, "world_size": trainer.dist.world_size}}
torch.save(state, os.path.join({weights!r}, f"rank{{rank}}.pt"))
sys.stdout.flush(); sys.stderr.flush()
os._exit(0)  # results are written: skip interpreter teardown, where gloo's threads can abort a rank
"""


def train(learner, output_dir=None, **overrides):
    trainer_class, config_class = LEARNERS[learner]
    settings = dict(num_turns=2, num_generations=1, num_train_epochs=3, agent_learning_rate=0.2, critic_learning_rate=0.2,
                    advantage_normalization=False, eval_interval=0, logging_steps=1, progress_bar=False,
                    output_dir=output_dir, seed=3)
    settings.update(overrides)
    trainer = trainer_class(env=DialogueEnv(ColourMatch(num_items=4, num_turns=settings["num_turns"])),
                            policies=[TabularPolicy(MENU), TabularPolicy(MENU)], args=config_class(**settings))
    trainer.train()
    return trainer


@pytest.mark.parametrize("learner, port", [("iac", 29531), ("maac", 29532)])
def test_two_gloo_ranks_match_one_process_on_the_union(tmp_path, learner, port):
    out, weights = tmp_path / "ddp", tmp_path / "weights"
    weights.mkdir()
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT.format(tests=TESTS, learner=learner, out=str(out), weights=str(weights)))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port), str(script)],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rank0, rank1 = (torch.load(weights / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    assert rank0["world_size"] == rank1["world_size"] == 2
    single = train(learner, items_per_step=2, rollout_buffer_size=2)
    for kind in ("policies", "critics"):
        for name, state in rank0[kind].items():
            assert state["_extra_state"] == rank1[kind][name]["_extra_state"], f"ranks laid out {kind} {name} differently"
            table = "logits" if kind == "policies" else "table"
            assert torch.equal(state[table], rank1[kind][name][table]), f"ranks disagree on {kind} {name}"
            mine = (single.policies[name] if kind == "policies" else single.critics[name]).state_dict()
            rows, my_rows = state["_extra_state"]["rows"], mine["_extra_state"]["rows"]
            assert rows.keys() == my_rows.keys()
            for key in rows:  # rows are laid out in a different order: compare key by key
                assert torch.allclose(state[table][rows[key]], mine[table][my_rows[key]], atol=1e-6), (kind, name, key)
    critic = next(iter(rank0["critics"].values()))
    assert critic["table"].abs().max() > 0.01  # the critics learned something
    assert "metrics.jsonl" in os.listdir(out)

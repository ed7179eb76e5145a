"""A run under torchrun (2 gloo ranks) stopped where buffers are partly filled and resumed equals
the uninterrupted run: weights equal, ``metrics.jsonl`` equal (issue 43).

Each rank keeps its own samples in its buffers; a checkpoint holds every rank's own buffers,
generators and pending metrics (runs/checkpoint.py), so the resumed rank 1 trains on its own
items, not on rank 0's. One torchrun launch runs, on each rank, the command three times in one
process: uninterrupted, stopped with ``--max_steps``, resumed with ``--resume``.

CI runs the tabular MAGRPO cell on Tiny Hanabi A (a turn-based game: the two agents' buffers fill
at different times, so the stop finds a partly filled one); the cells for the other learner
families, a language model and ``--fsdp`` are marked ``slow``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch

TESTS = os.path.dirname(os.path.abspath(__file__))

RANK_SCRIPT = r"""
import os, sys, torch
torch.set_num_threads(1)
from llm_marl import cli
base = {base!r}
runs = [("full", []), ("split", ["--max_steps", str({stop})]), ("split", ["--resume"])] + {more!r}
if any(name == "term" for name, _ in runs):  # rank 1 alone gets SIGTERM after the batch reaching step {stop}
    import signal
    from llm_marl.learners import MAGRPOTrainer
    after_batch, sent = MAGRPOTrainer._after_batch, []

    def _after_batch(self, *args, **kwargs):
        after_batch(self, *args, **kwargs)
        if os.environ["RANK"] == "1" and self.state.global_step == {stop} and os.path.basename(self.args.output_dir) == "term" and not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)

    MAGRPOTrainer._after_batch = _after_batch
for name, extra in runs:
    code = cli.main(base + ["--output_dir", os.path.join({out!r}, name)] + extra)
    assert code == (143 if name == "term" and not extra else 0), (name, extra, code)
sys.stdout.flush(); sys.stderr.flush()
os._exit(0)  # results are written: skip interpreter teardown, where gloo's threads can abort a rank
"""

COMMON = ["--num_generations", "2", "--items_per_step", "1", "--rollout_buffer_size", "2", "--train_items", "8",
          "--num_train_epochs", "2", "--save_steps", "1", "--save_total_limit", "100", "--logging_steps", "1",
          "--threads", "1", "--seed", "0"]
TABULAR = ["train", "--env", "TinyHanabi-A-v0", "--policy", "tabular", "--actions", "0,1,2"]
SHIPPED_OPTIONS = ["--agent_advantage_normalization", "false,true", "--agent_learning_rates", "0.3,0.1", "--entropy_coef", "0.5",
                   "--entropy_coef_final", "0", "--tree_return_aggregation", "softmax", "--tree_return_temperature", "0.5"]
"""examples/configs/tiny_hanabi.yaml's options against collapse: the CI cell runs with them (the
annealed bonus depends on the batch a resumed run continues from)."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(tmp_path, argv: list[str], stop: int, nproc: int = 2, more: list | None = None) -> subprocess.CompletedProcess:
    """The rank script under torchrun on ``nproc`` gloo ranks; ``more``: (folder, arguments) of
    runs after the three it always makes."""
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT.format(base=argv, stop=stop, out=str(tmp_path), more=more or []))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([os.path.dirname(TESTS), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port", str(_free_port()), str(script)],
        capture_output=True, text=True, timeout=900, env=env,
    )


def metrics_lines(run_dir) -> list[dict]:
    """Every logged metric except wall-clock throughput, which no two runs share."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if not k.endswith("per_second")} for line in f]


def final_weights(run_dir) -> dict[str, dict[str, torch.Tensor]]:
    """Each agent's weights in the run's newest checkpoint (rank 0's; ranks hold the same)."""
    from llm_marl.runs.checkpoint import list_checkpoints

    last = list_checkpoints(str(run_dir))[-1]
    found = {}
    for folder in sorted(os.listdir(last)):
        shards = os.path.join(last, folder, "shards")
        if os.path.isdir(shards):  # fsdp: read the sharded checkpoint whole
            from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

            dcp_to_torch_save(shards, os.path.join(str(run_dir), f"{folder}.pt"))
            state = torch.load(os.path.join(str(run_dir), f"{folder}.pt"), weights_only=False)["model"]
        elif os.path.exists(os.path.join(last, folder, "policy.pt")):
            state = torch.load(os.path.join(last, folder, "policy.pt"), weights_only=False)
        else:
            continue
        found[folder] = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    return found


def ranks_samples(checkpoint_dir) -> list[dict[str, list[int]]]:
    """Each rank's buffered items (agent -> item indices) in a checkpoint."""
    found = []
    for folder in (".", "rank_1"):
        saved = torch.load(os.path.join(checkpoint_dir, folder, "buffers.pt"), weights_only=False)
        plan = [s.index for s in saved["update_plan"] or []]
        found.append({agent: [s.index for s in samples] + plan for agent, samples in saved["buffers"].items()})
    return found


def assert_resume_is_exact(tmp_path, argv: list[str], stop: int, more: list | None = None, stopped: str = "split") -> None:
    """``stopped`` (stopped at step ``stop``, then resumed) ends as the uninterrupted run did."""
    done = launch(tmp_path, argv, stop, more=more)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert_same_as_uninterrupted(tmp_path, stopped, stop)


def assert_same_as_uninterrupted(tmp_path, stopped: str, stop: int) -> None:
    # the stop left samples in the buffers, each rank its own items
    at_stop = ranks_samples(tmp_path / stopped / f"checkpoint-{stop}")
    assert any(at_stop[1].values()), f"no rank-1 sample buffered at the stop: the cell tests nothing ({at_stop})"
    assert at_stop[0] != at_stop[1], at_stop
    full, split = final_weights(tmp_path / "full"), final_weights(tmp_path / stopped)
    assert full and full.keys() == split.keys()
    for agent in full:
        differ = [n for n in full[agent] if not torch.equal(full[agent][n], split[agent][n])]
        assert not differ, f"resumed {agent} differs from the uninterrupted run in {differ[:3]}"
    assert metrics_lines(tmp_path / "full") == metrics_lines(tmp_path / stopped)


def test_two_ranks_stopped_with_partly_filled_buffers_resume_exactly(tmp_path):
    # and a run that rank 1 alone gets SIGTERM in: both ranks stop after that batch, each writes
    # its own state into the closing checkpoint, and the resume ends as the uninterrupted run;
    # and a run started again with --overwrite by both ranks: rank 0 alone moves the old one aside
    more = [("term", []), ("term", ["--resume"]), ("again", ["--max_steps", "1"]), ("again", ["--overwrite", "--max_steps", "2"])]
    assert_resume_is_exact(tmp_path, TABULAR + COMMON + SHIPPED_OPTIONS, stop=3, more=more)
    assert_same_as_uninterrupted(tmp_path, "term", 3)
    annealed = [row["train/entropy_coef"] for row in metrics_lines(tmp_path / "full") if "train/entropy_coef" in row]
    assert len(annealed) > 2 and annealed[0] > annealed[-1]  # the shipped options are in force
    aside = [p for p in os.listdir(tmp_path) if p.startswith("again.replaced-")]
    assert len(aside) == 1 and sorted(p for p in os.listdir(tmp_path / aside[0]) if p.startswith("checkpoint-")) == ["checkpoint-1"]
    assert sorted(p for p in os.listdir(tmp_path / "again") if p.startswith("checkpoint-")) == ["checkpoint-1", "checkpoint-2"]
    assert os.path.isdir(tmp_path / "again" / "checkpoint-2" / "rank_1") and os.path.isdir(tmp_path / aside[0] / "checkpoint-1" / "rank_1")
    assert json.load(open(tmp_path / "again" / "run.json"))["run_id"] != json.load(open(tmp_path / aside[0] / "run.json"))["run_id"]
    # the same checkpoint, written by 2 ranks with samples buffered, is refused by one process
    resumed = subprocess.run(
        [sys.executable, "-m", "llm_marl.cli", *TABULAR, *COMMON, *SHIPPED_OPTIONS, "--output_dir", str(tmp_path / "one"),
         "--resume", str(tmp_path / "split" / "checkpoint-3")],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert resumed.returncode == 1, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    error = [line for line in resumed.stderr.splitlines() if line.startswith("llm-marl: error")]
    assert len(error) == 1 and "written by 2 rank(s)" in error[0] and "resume it with 2 rank(s), not 1" in error[0], resumed.stderr


SLOW_CELLS = {
    "iac-tabular": (["train", "--env", "TinyHanabi-A-v0", "--policy", "tabular", "--actions", "0,1,2", "--learner", "iac"], 3),
    "lm-tiny": (["train", "--env", "TinyHanabi-A-v0", "--policy", "lm", "--model", "tiny", "--max_new_tokens", "2", "--train_batch_size", "1"], 3),
    "fsdp-lm-tiny": (["train", "--env", "TinyHanabi-A-v0", "--policy", "lm", "--model", "tiny", "--max_new_tokens", "2", "--train_batch_size", "1", "--fsdp"], 3),
}


@pytest.mark.slow
@pytest.mark.parametrize("cell", sorted(SLOW_CELLS))
def test_distributed_resume_cell(cell, tmp_path):
    argv, stop = SLOW_CELLS[cell]
    assert_resume_is_exact(tmp_path, argv + COMMON, stop)

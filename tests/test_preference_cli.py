"""``llm-marl train --learner madpo|marlhf|madpoiter|marlhfiter`` (tabular policies)."""

from __future__ import annotations

import json

import pytest
import torch

from llm_marl.cli import main

torch.set_num_threads(1)

COMMON = ["--env", "ClimbingGame-v0", "--policy", "tabular", "--num_turns", "1", "--agent_learning_rate", "0.3",
          "--preference_num_candidates", "6", "--eval_interval", "0", "--progress_bar", "false"]


@pytest.mark.parametrize("learner,extra,steps", [
    ("madpo", ["--num_train_epochs", "3"], 3),
    ("marlhf", ["--num_train_epochs", "3", "--reward_learning_rate", "0.05"], 3),
    ("madpoiter", ["--num_iterations", "2", "--train_batch_size", "2"], None),
    ("marlhfiter", ["--num_iterations", "2", "--num_train_epochs", "1", "--reward_learning_rate", "0.05"], 2),
])
def test_the_cli_trains_each_preference_learner(tmp_path, learner, extra, steps):
    out = tmp_path / learner
    assert main(["train", *COMMON, "--learner", learner, *extra, "--output_dir", str(out)]) == 0
    summary = json.load(open(out / "summary.json"))
    assert summary["options"]["learner"] == learner
    assert summary["optimizer_steps"] == steps if steps is not None else summary["optimizer_steps"] > 0


def test_list_names_the_preference_learners(capsys):
    assert main(["list"]) == 0
    printed = capsys.readouterr().out
    assert all(name in printed for name in ("madpo", "marlhf", "madpoiter", "marlhfiter"))

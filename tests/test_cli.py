"""The llm-marl command: train, eval, list, plot, YAML configs and resume (tabular policies)."""

from __future__ import annotations

import json
import os

import pytest
import torch

from llm_marl.cli import main

torch.set_num_threads(1)

CLIMB = [
    "--env", "ClimbingGame-v0", "--policy", "tabular", "--learner", "magrpo",
    "--num_turns", "1", "--joint_mode", "cross", "--cross-aggregation", "max",
    "--agent_learning_rate", "0.3", "--early_termination_threshold", "none",
    "--eval_interval", "20", "--logging_steps", "10", "--progress_bar", "false",
]


def test_train_tabular_climbing_learns_and_writes_a_run(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *CLIMB, "--num_train_epochs", "60", "--output_dir", str(out)]) == 0
    printed = capsys.readouterr().out
    summary = json.load(open(out / "summary.json"))
    assert summary["eval_after"]["eval/turn_1/reward_mean"] == 11.0, printed
    assert summary["optimizer_steps"] == 60
    assert "eval/turn_1/reward_mean" in printed and "before" in printed and "after" in printed
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(out / "logs"))
    assert (out / "checkpoint-60" / "manifest.json").exists()
    assert (out / "final" / "agent_0" / "policy.pt").exists()


def test_yaml_config_flags_override_it_and_resume_continues(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("env: CoordinationGame-v0\npolicy: tabular\nlearner: marloo\nnum_turns: 1\n"
                      "num_train_epochs: 6\nsave_steps: 2\neval_interval: 0\nprogress_bar: false\n"
                      "early_termination_threshold: null\n")
    out = tmp_path / "run"
    assert main(["train", "--config", str(config), "--output_dir", str(out), "--max_steps", "4"]) == 0
    first = json.load(open(out / "summary.json"))
    assert first["optimizer_steps"] == 4 and first["options"]["learner"] == "marloo"
    assert main(["train", "--config", str(config), "--output_dir", str(out), "--resume"]) == 0
    resumed = json.load(open(out / "summary.json"))
    assert resumed["optimizer_steps"] == 6 and resumed["batches"] == 6


def test_bad_options_are_named(tmp_path, capsys):
    assert main(["train", "--env", "ClimbingGame-v0", "--config", _yaml(tmp_path, "learner: ppo\n")]) == 2
    assert "unknown learner 'ppo'" in capsys.readouterr().err
    assert main(["train", "--env", "ClimbingGame-v0", "--config", _yaml(tmp_path, "colour: red\n")]) == 2
    assert "unknown option(s) ['colour']" in capsys.readouterr().err
    assert main(["train", "--env", "ClimbingGame-v0", "--num_generations", "1", "--output_dir", str(tmp_path / "x")]) == 2
    assert "num_generations must be an int >= 2" in capsys.readouterr().err
    assert main(["train", "--env", "ClimbingGame-v0", "--num_generations", "many"]) == 2
    assert "--num_generations: expected an int, got 'many'" in capsys.readouterr().err


def _yaml(tmp_path, text):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return str(path)


def test_list_eval_and_plot(tmp_path, capsys):
    assert main(["list"]) == 0
    listing = capsys.readouterr().out
    for name in ("ClimbingGame-v0", "WritingCollab-v0", "CoopCode-v0", "magrpo", "maremax"):
        assert name in listing
    assert main(["eval", "--env", "PenaltyGame-v0", "--policy", "tabular", "--num_turns", "1"]) == 0
    assert "eval/turn_1/reward_mean" in capsys.readouterr().out

    out = tmp_path / "run"
    main(["train", *CLIMB, "--num_train_epochs", "5", "--output_dir", str(out)])
    assert main(["plot", str(out)]) == 0
    written = capsys.readouterr().out.split()
    pngs = [p for p in written if p.endswith(".png")]
    assert any(p.endswith("eval_turn_1.png") for p in pngs)
    for path in pngs:
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"

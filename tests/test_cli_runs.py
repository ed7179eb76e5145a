"""The llm-marl command as a separate process: run folders that never mix runs, custom envs
named three ways, typed YAML, and Ctrl-C / SIGTERM with an exact resume.

Every run is a tabular policy on a one-item matrix game (seconds); the process's exit status and
stderr are checked, and no stderr may hold a traceback.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
CLI = [sys.executable, "-m", "llm_marl.cli"]
QUICK = ["--policy", "tabular", "--eval_interval", "1", "--logging_steps", "1", "--progress_bar", "false",
         "--agent_learning_rate", "0.3", "--early_termination_threshold", "none"]


def run(args, *, extra_path=(), env_vars=None, cwd=None, timeout=240):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_vars or {})}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(TESTS), *map(str, extra_path)])
    result = subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, cwd=cwd or REPO, timeout=timeout)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def tree_digest(folder: Path) -> dict[str, str]:
    """Relative path -> SHA-256 of every file under ``folder``."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*")) if p.is_file()
    }


def final_tables(run_dir: Path) -> list[dict]:
    return [torch.load(run_dir / "final" / agent / "policy.pt", weights_only=False) for agent in ("row", "column")]


def assert_same_tables(left: list[dict], right: list[dict]) -> None:
    for a, b in zip(left, right):
        assert a.keys() == b.keys()
        for key in a:
            if isinstance(a[key], torch.Tensor):
                assert torch.equal(a[key], b[key]), key
            else:
                assert a[key] == b[key], key


# --- run folders -------------------------------------------------------------------------------

CLIMB = ["--env", "ClimbingGame-v0", *QUICK]


def test_reused_folder_is_refused_and_overwrite_moves_the_old_run_aside(tmp_path):
    out = tmp_path / "run"
    first = run(["train", *CLIMB, "--num_train_epochs", "3", "--output_dir", str(out)])
    assert first.returncode == 0, first.stderr
    before = tree_digest(out)
    run_a = json.loads((out / "run.json").read_text())["run_id"]

    refused = run(["train", *CLIMB, "--num_train_epochs", "5", "--output_dir", str(out)])
    assert refused.returncode == 2
    message = refused.stderr.strip()
    assert str(out) in message and "--resume" in message and "--overwrite" in message and run_a in message
    assert len(message.splitlines()) <= 2
    assert tree_digest(out) == before  # run A untouched: not one byte written

    replaced = run(["train", *CLIMB, "--num_train_epochs", "5", "--output_dir", str(out), "--overwrite"])
    assert replaced.returncode == 0, replaced.stderr
    [aside] = [p for p in tmp_path.iterdir() if p.name.startswith("run.replaced-")]
    assert tree_digest(aside) == before  # moved aside, not deleted
    assert str(aside) in replaced.stdout
    assert json.loads((out / "run.json").read_text())["run_id"] != run_a
    assert json.loads((out / "summary.json").read_text())["optimizer_steps"] == 5
    assert not (out / "checkpoint-3").exists()  # nothing of run A is left in the new run's folder


def test_resume_takes_the_newest_checkpoint_of_its_own_run(tmp_path):
    """A folder that also holds another run's checkpoint with a higher step (copied in, or from
    a version without run identities): resume continues this run from its own newest checkpoint,
    equals an uninterrupted run, and leaves the other run's checkpoint alone."""
    steps = ["--save_steps", "2", "--save_total_limit", "2"]
    whole, part, other = tmp_path / "whole", tmp_path / "part", tmp_path / "other"
    assert run(["train", *CLIMB, *steps, "--num_train_epochs", "8", "--output_dir", str(whole)]).returncode == 0
    assert run(["train", *CLIMB, *steps, "--num_train_epochs", "4", "--output_dir", str(part)]).returncode == 0
    assert run(["train", *CLIMB, *steps, "--num_train_epochs", "9", "--seed", "7", "--output_dir", str(other)]).returncode == 0
    os.rename(other / "checkpoint-9", part / "checkpoint-9")
    foreign = tree_digest(part / "checkpoint-9")

    resumed = run(["train", *CLIMB, *steps, "--num_train_epochs", "8", "--output_dir", str(part), "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads((part / "summary.json").read_text())
    assert summary["optimizer_steps"] == 8 and summary["batches"] == 8
    assert_same_tables(final_tables(part), final_tables(whole))
    assert tree_digest(part / "checkpoint-9") == foreign  # never rotated away or overwritten

    changed = run(["train", *CLIMB, *steps, "--num_train_epochs", "8", "--output_dir", str(part), "--resume",
                   "--agent_learning_rate", "0.5"])
    assert changed.returncode == 2
    assert "agent_learning_rate: 0.3 -> 0.5" in changed.stderr
    before = tree_digest(part)
    elsewhere = run(["train", "--env", "PenaltyGame-v0", *QUICK, *steps, "--num_train_epochs", "8",
                     "--output_dir", str(part), "--resume"])
    assert elsewhere.returncode == 2
    assert "env: 'ClimbingGame-v0' -> 'PenaltyGame-v0'" in elsewhere.stderr
    other_menu = run(["train", *CLIMB, *steps, "--num_train_epochs", "8", "--output_dir", str(part), "--resume",
                      "--actions", "x,y,z"])
    assert other_menu.returncode == 2 and "actions: None -> 'x,y,z'" in other_menu.stderr
    assert tree_digest(part) == before  # nothing written by the refused resumes


# --- custom envs ---------------------------------------------------------------------------------

SUM = [*QUICK, "--num_train_epochs", "2", "--eval_interval", "0"]


def _trained_three_agents(out: Path) -> None:
    state = json.loads(next(out.glob("checkpoint-*/trainer_state.json")).read_text())
    assert state["args"]["num_agents"] == 3
    assert set(json.loads((out / "summary.json").read_text())["eval_after"]) == {
        "eval/turn_1/reward_mean", "eval/turn_1/expected_return"}


def test_custom_env_by_entry_point_string(tmp_path):
    result = run(["train", "--env", "cli_envs:make_sum_target", *SUM, "--output_dir", str(tmp_path / "r")])
    assert result.returncode == 0, result.stderr
    _trained_three_agents(tmp_path / "r")


def test_custom_env_by_import(tmp_path):
    result = run(["train", "--import", "cli_envs", "--env", "SumTarget-v0", *SUM, "--output_dir", str(tmp_path / "r")])
    assert result.returncode == 0, result.stderr
    _trained_three_agents(tmp_path / "r")
    without = run(["train", "--env", "SumTarget-v0", *SUM, "--output_dir", str(tmp_path / "s")])
    assert without.returncode == 2
    for way in ("unknown environment id 'SumTarget-v0'", "ClimbingGame-v0", "--env package.module:factory",
                "--import module", "'llm_marl.envs' entry points"):
        assert way in without.stderr


def test_custom_env_by_installed_entry_point(tmp_path):
    site = tmp_path / "site"
    info = site / "sum_target_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sum-target-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[llm_marl.envs]\nPluginSum-v0 = cli_envs:SumTarget\n")
    listed = run(["list"], extra_path=[site])
    assert "PluginSum-v0" in listed.stdout
    result = run(["train", "--env", "PluginSum-v0", *SUM, "--output_dir", str(tmp_path / "r")], extra_path=[site])
    assert result.returncode == 0, result.stderr
    _trained_three_agents(tmp_path / "r")


# --- typed YAML ------------------------------------------------------------------------------------

def test_yaml_values_are_typed_per_field(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        "env: CoordinationGame-v0\npolicy: tabular\nnum_train_epochs: 2\neval_interval: 0\nprogress_bar: false\n"
        "agent_learning_rate: 1e-3\nweight_decay: 1e-2\nadvantage_normalization: \"false\"\n"
        "agent_devices: [cpu, cpu]\nreference_devices: cpu\nearly_termination_threshold: null\n"
        f"output_dir: {tmp_path / 'r'}\n"
    )
    result = run(["train", "--config", str(config)])
    assert result.returncode == 0, result.stderr
    args = json.loads((tmp_path / "r" / "checkpoint-2" / "trainer_state.json").read_text())["args"]
    assert args["agent_learning_rate"] == 0.001 and args["weight_decay"] == 0.01
    assert args["advantage_normalization"] is False
    assert args["agent_devices"] == ["cpu", "cpu"] and args["reference_devices"] == ["cpu", "cpu"]

    config.write_text("env: CoordinationGame-v0\nadvantage_normalization: \"maybe\"\n")
    bad = run(["train", "--config", str(config)])
    assert bad.returncode == 2
    assert f"{config}: advantage_normalization: expected true or false, got 'maybe'" in bad.stderr


# --- signals -----------------------------------------------------------------------------------------

SIGNAL_RUN = ["train", "--env", "cli_envs:signalling_climb", *QUICK, "--num_train_epochs", "10"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("whole") / "run"
    result = run([*SIGNAL_RUN, "--output_dir", str(out)])
    assert result.returncode == 0, result.stderr
    return out


@pytest.mark.parametrize("name, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_signal_mid_run_checkpoints_hints_and_resumes_exactly(tmp_path, uninterrupted, name, code):
    out = tmp_path / "run"
    stopped = run([*SIGNAL_RUN, "--output_dir", str(out)], env_vars={"LLM_MARL_TEST_SIGNALS": f"{name}@4"})
    assert stopped.returncode == code, stopped.stderr
    assert (out / "checkpoint-4" / "manifest.json").exists()  # stopped after batch 4, at its end
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())["state"]
    assert state["batch_step"] == 4
    assert not (out / "final").exists() and not (out / "summary.json").exists()
    [hint] = [line for line in stopped.stderr.splitlines() if line.startswith("resume with: ")]
    command = shlex.split(hint[len("resume with: "):])
    assert command[0] == "llm-marl" and command[-1] == "--resume"

    resumed = run(command[1:])
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((out / "summary.json").read_text())["optimizer_steps"] == 10
    assert_same_tables(final_tables(out), final_tables(uninterrupted))


def test_second_ctrl_c_stops_at_once(tmp_path):
    out = tmp_path / "run"
    stopped = run([*SIGNAL_RUN, "--save_steps", "2", "--output_dir", str(out)],
                  env_vars={"LLM_MARL_TEST_SIGNALS": "SIGINT,SIGINT@3"})
    assert stopped.returncode == 130, stopped.stderr
    assert "stopped at once" in stopped.stderr
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]  # none for batch 3


def test_ctrl_c_while_the_command_still_loads_torch_is_a_clean_exit(tmp_path):
    """The package imports torch only on first use, inside the command's error handling: a Ctrl-C
    during that import (seen as torch's modules being imported, -X importtime) exits 130 with the
    command's one line, not a traceback, and writes nothing."""
    import signal

    process = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "llm_marl.cli", "train", *CLIMB, "--output_dir", str(tmp_path / "r")],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # a terminal's Ctrl-C: Python's handler, even where the suite runs with SIGINT ignored (nohup ... &)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    def torch_module(line: str) -> bool:  # an -X importtime line of torch or a torch.* module (not datasets' torch_formatter)
        return line.startswith("import time:") and line.rsplit("|", 1)[-1].strip().split(".")[0] == "torch"

    seen = []
    for line in process.stderr:
        seen.append(line)
        if torch_module(line):
            process.send_signal(signal.SIGINT)
            break
    _, rest = process.communicate(timeout=240)
    messages = [line for line in seen + rest.splitlines(keepends=True) if not line.startswith("import time:")]
    assert any(torch_module(line) for line in seen), "torch was never imported"
    assert process.returncode == 130, "".join(messages)
    assert "interrupted outside training; nothing was written" in "".join(messages)
    assert not any("Traceback" in line for line in messages)
    assert not (tmp_path / "r").exists()


# --- messages instead of tracebacks -------------------------------------------------------------

@pytest.mark.parametrize("args, words", [
    (["train", "--env", "ClimbingGame-v0", "--policy", "lm", "--model", "/nonexistent"], "--model /nonexistent: no such folder"),
    (["plot", "runs/typo"], "no such run folder: runs/typo"),
    (["train", "--env", "ClimbingGame-v0", "--actions", ""], "--actions '': give a comma-separated menu of non-empty answers"),
    (["train", "--env", "ClimbingGame-v0", "--train-items", "0"], "--train-items must be an int >= 1"),
    (["train", "--env", "ClimbingGame-v0", "--resume", "--output_dir", "{tmp}"], "nothing to resume in {tmp}: it holds no checkpoint"),
    (["train", "--env", "cli_envs:make_sum_target", "--num_turns", "2"], "--num_turns 2: the factory of env cli_envs:make_sum_target does not take num_turns"),
], ids=["model", "plot", "actions", "train-items", "resume", "num_turns"])
def test_errors_are_one_line_with_exit_status_2(tmp_path, args, words):
    result = run([a.replace("{tmp}", str(tmp_path)) for a in args], cwd=tmp_path)
    words = words.replace("{tmp}", str(tmp_path))
    assert result.returncode == 2
    assert words in result.stderr and len(result.stderr.strip().splitlines()) == 1

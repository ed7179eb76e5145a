"""The llm-marl command: train, eval, list, plot, YAML configs and resume (tabular policies)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from llm_marl.cli import main

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def scratch_registry(monkeypatch):
    """Env ids registered by a test here (custom envs, docs examples) vanish afterwards."""
    import pettingzoo

    from llm_marl.envs import registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    before = set(getattr(pettingzoo, "parallel_registry", {}))
    yield
    for env_id in set(getattr(pettingzoo, "parallel_registry", {})) - before:
        del pettingzoo.parallel_registry[env_id]

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
    assert (out / "final" / "row" / "policy.pt").exists() and (out / "final" / "column" / "policy.pt").exists()


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


# --- messages instead of tracebacks (each returns 2 with one or two lines on stderr) -------------

MESSAGES = [
    (["train", "--env", "ClimbingGame-v0", "--actions", ""], "--actions '': give a comma-separated menu of non-empty answers"),
    (["train", "--env", "ClimbingGame-v0", "--actions", "a,,b"], "--actions 'a,,b': give a comma-separated menu"),
    (["train", "--env", "ClimbingGame-v0", "--train-items", "0"], "--train-items must be an int >= 1"),
    (["train", "--env", "ClimbingGame-v0", "--resume"], "--resume needs the run folder: give --output_dir RUN"),
    (["train", "--env", "ClimbingGame-v0", "--resume", "--output_dir", "{tmp}/empty"], "nothing to resume in {tmp}/empty: it holds no checkpoint"),
    (["train", "--env", "ClimbingGame-v0", "--overwrite", "--resume", "--output_dir", "{tmp}/x"], "--overwrite starts a new run and --resume continues one"),
    (["train", "--env", "Climbinggame-v0"], "unknown environment id 'Climbinggame-v0'; known: ClimbingGame-v0"),
    (["train", "--env", "ClimbingGame-v0", "--policy", "lm", "--model", "./no/such/model"], "--model ./no/such/model: no such folder"),
    (["train", "--env", "ClimbingGame-v0", "--advantage_normalization", "False!"], "--advantage_normalization: expected true or false, got 'False!'"),
    (["train", "--env", "ClimbingGame-v0", "--top_k", "1.5"], "--top_k: expected an int or none, got '1.5'"),
    (["train", "--env", "ClimbingGame-v0", "--num-turn", "1"], "unrecognized arguments: --num-turn 1"),
    (["train", "--env", "ClimbingGame-v0", "--import", "no_such_module_xyz"], "--import no_such_module_xyz: cannot import it"),
    (["eval", "--env", "ClimbingGame-v0", "--checkpoint", "{tmp}/nope"], "--checkpoint {tmp}/nope: no such checkpoint folder"),
    (["train", "--env", "ClimbingGame-v0", "--resume", "{tmp}/run/checkpoint-2"], "{tmp}/run/checkpoint-2: no such checkpoint folder"),
    (["plot", "{tmp}/typo"], "no such run folder: {tmp}/typo"),
]


@pytest.mark.parametrize("argv, message", MESSAGES, ids=[" ".join(a[2:5]) for a, _ in MESSAGES])
def test_usage_errors_are_short_messages(tmp_path, capsys, argv, message):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    (tmp_path / "empty").mkdir()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message.replace("{tmp}", str(tmp_path)) in err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 2


EARLY = [
    (["train", "--env", "ClimbingGame-v0", "--policy", "lm", "--model", "smollm2-135n"], "did you mean smollm2-135m?"),
    (["train", "--env", "ClimbingGame-v0", "--output_dir", "{tmp}/used"], "output folder {tmp}/used is not empty"),
    (["train", "--env", "ClimbingGame-v0", "--learner", "ppo"], "invalid choice: 'ppo'"),
    (["train", "--env", "ClimbingGame-v0", "--choice_answers"], "--choice_answers: language-model agents only (--policy lm)"),
    (["train", "--env", "ClimbingGame-v0", "--num_generations", "many"], "--num_generations: expected an int, got 'many'"),
    # these two build the env (a matrix game's one-row dataset: `datasets` loads), not the policies
    (["train", "--env", "ClimbingGame-v0", "--num_generations", "1"], "num_generations must be an int >= 2"),
    (["train", "--env", "cli_envs:make_sum_target", "--num_turns", "2"], "does not take num_turns"),
]
"""Usage errors besides :data:`MESSAGES` that the command finds before torch loads."""

_FRESH = """
import contextlib, io, json, sys
from llm_marl.cli import main
seen = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    seen.append([code, err.getvalue(), [m for m in ("torch", "transformers", "datasets") if m in sys.modules]])
print(json.dumps(seen))
"""


def test_usage_errors_come_before_torch_loads(tmp_path):
    """A bad flag is refused at once: each usage error of MESSAGES and EARLY, run one after
    another in one fresh interpreter, exits 2 with its message and leaves torch and transformers
    unimported (and `datasets` too, but for the two errors that need the env built)."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "notes.txt").write_text("a file of someone else's")
    cells = [([a.replace("{tmp}", str(tmp_path)) for a in argv], message.replace("{tmp}", str(tmp_path))) for argv, message in MESSAGES + EARLY]
    tests = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(tests), tests]), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _FRESH, json.dumps([argv for argv, _ in cells])],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    for i, ((argv, message), (code, err, heavy)) in enumerate(zip(cells, json.loads(done.stdout.splitlines()[-1]), strict=True)):
        assert code == 2 and message in err, (argv, err)
        allowed = {"datasets"} if i >= len(cells) - 2 else set()  # EARLY's last two
        assert not set(heavy) - allowed, f"llm-marl {' '.join(argv)} imported {heavy} before its error: {err}"
    assert sorted(os.listdir(tmp_path)) == ["empty", "used"]  # no run folder written (runs/... is the default)
    assert os.listdir(tmp_path / "empty") == [] and os.listdir(tmp_path / "used") == ["notes.txt"]


def test_num_turns_for_a_factory_without_it_is_an_error_not_a_silent_drop(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(os.path.dirname(__file__))
    assert main(["train", "--env", "cli_envs:make_sum_target", "--num_turns", "2", "--output_dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "--num_turns 2: the factory of env cli_envs:make_sum_target does not take num_turns" in err
    assert not (tmp_path / "r").exists()


def test_run_failure_exits_1_and_debug_shows_the_traceback(tmp_path, capsys):
    class Boom(Exception):
        pass

    from llm_marl.learners.reinforce.trainer import MAGRPOTrainer

    def fail(self, resume_from_checkpoint=None):
        raise Boom("the reward server is down")

    original = MAGRPOTrainer.train
    MAGRPOTrainer.train = fail
    try:
        argv = ["train", *CLIMB, "--eval_interval", "0", "--output_dir", str(tmp_path / "r")]
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.splitlines() == ["llm-marl: error: Boom: the reward server is down",
                                    "(run again with --debug for the traceback)"]
        with pytest.raises(Boom):
            main([*argv[:-1], str(tmp_path / "s"), "--debug"])
    finally:
        MAGRPOTrainer.train = original


def test_train_help_names_the_config_class_and_shows_field_docs(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--learner", "marloo", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "Config class: MARLOOConfig" in text
    assert "--num_generations INT, --num-generations INT K: samples per observation per agent (>= 2). (default: 4)" in text
    assert "Baseline: \"mean\" (MAGRPO), \"rloo\", \"max\" (MAReMax), \"raw\" (MAREINFORCE) or \"best\" (imitate each group's best answers). (default: 'rloo')" in text


def test_eval_of_a_saved_policy_uses_its_saved_sampling_settings(tmp_path, capsys):
    from llm_marl.policies.causal_lm import CausalLMPolicy
    from llm_marl.policies.tiny import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "tiny", pretrain_steps=1, batch_size=2, n_layer=1, n_embd=32)
    policy = CausalLMPolicy.from_pretrained(model_dir, temperature=0.3, top_p=0.8, top_k=7, max_new_tokens=5)
    for agent in ("row", "column"):  # a run's final/: a folder per agent, named as the agent
        policy.save_pretrained(tmp_path / "run" / "final" / agent)
    base = ["eval", "--env", "CoordinationGame-v0", "--policy", "lm", "--eval_num_samples", "1"]
    assert main([*base, "--model", str(tmp_path / "run" / "final" / "row")]) == 0
    out = capsys.readouterr().out
    assert "max_new_tokens=5, temperature=0.3, top_p=0.8, top_k=7; saved with the model" in out
    assert main([*base, "--model", str(tmp_path / "run" / "final"), "--temperature", "0.9"]) == 0
    out = capsys.readouterr().out
    assert f"row: model {tmp_path / 'run' / 'final' / 'row'} (max_new_tokens=5, temperature=0.9" in out
    assert f"column: model {tmp_path / 'run' / 'final' / 'column'}" in out
    os.rename(tmp_path / "run" / "final" / "row", tmp_path / "run" / "final" / "agent_0")  # a run saved before agents' names
    os.rename(tmp_path / "run" / "final" / "column", tmp_path / "run" / "final" / "agent_1")
    assert main([*base, "--model", str(tmp_path / "run" / "final"), "--temperature", "0.9"]) == 0
    out = capsys.readouterr().out
    assert f"row: model {tmp_path / 'run' / 'final' / 'agent_0'} (max_new_tokens=5, temperature=0.9" in out
    assert f"column: model {tmp_path / 'run' / 'final' / 'agent_1'}" in out


def test_an_entry_point_that_does_not_import_is_a_usage_error(capsys):
    assert main(["train", "--env", "no_such_pkg_xyz.tasks:Guess"]) == 2
    err = capsys.readouterr().err
    assert f"--env no_such_pkg_xyz.tasks:Guess: no module named 'no_such_pkg_xyz' in the current folder {os.getcwd()} or on the Python path" in err
    assert err.count("no_such_pkg_xyz.tasks:Guess") == 1  # named once, no 'X''s quoting


def test_an_env_module_in_the_current_folder_is_found_as_python_m_finds_it(tmp_path, monkeypatch, capsys):
    """Issue 35: `llm-marl train --env echo_task:Echo`, run from the folder that holds
    echo_task.py (the README's Echo snippet), trains without PYTHONPATH=."""
    import sys

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    [snippet] = [block for block in re.findall(r"^```python\n(.*?)^```", readme, flags=re.S | re.M) if "class Echo(" in block]
    (tmp_path / "echo_task.py").write_text(snippet)
    [command] = [line.strip() for line in readme.splitlines() if line.strip().startswith("llm-marl train --env echo_task:Echo")]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "echo_task", raising=False)
    argv = shlex.split(command)[1:] + ["--output_dir", str(tmp_path / "run"), "--max_steps", "2", "--progress_bar", "false"]
    assert main(argv) == 0, capsys.readouterr().err
    assert (tmp_path / "run" / "summary.json").is_file()


def test_a_resumed_runs_summary_has_before_after_both_batch_counts_and_the_prompts(tmp_path, capsys):
    """Issue 35: after a resume, "before" is the run's first evaluation (not '-'), the batches
    since the resume are counted beside the total, and the samples keep their prompts."""
    config = tmp_path / "run.yaml"
    config.write_text("env: CoordinationGame-v0\npolicy: tabular\nlearner: magrpo\nnum_turns: 1\n"
                      "num_train_epochs: 6\nsave_steps: 2\neval_interval: 0\nprogress_bar: false\n"
                      "early_termination_threshold: null\n")
    out = tmp_path / "run"
    assert main(["train", "--config", str(config), "--output_dir", str(out), "--max_steps", "4"]) == 0
    first = json.load(open(out / "summary.json"))
    capsys.readouterr()
    assert main(["train", "--config", str(config), "--output_dir", str(out), "--resume"]) == 0
    printed = capsys.readouterr().out
    resumed = json.load(open(out / "summary.json"))
    assert first["eval_before"] and resumed["eval_before"] == first["eval_before"]
    assert resumed["samples_before"] == first["samples_before"]
    assert resumed["batches"] == 6 and resumed["resumed_from_batch"] == 4 and resumed["batches_since_resume"] == 2
    assert resumed["sample_prompts"] == first["sample_prompts"] and resumed["sample_prompts"]
    assert "trained 6 batches in all (2 since the resume from batch 4)" in printed
    assert f"eval item 0: {first['sample_prompts'][0]!r}" in printed
    table = [line for line in printed.splitlines() if line.startswith("eval/turn_1/reward_mean")]
    assert table and " - " not in table[0], table
    assert "  before " in printed and "  after " in printed


def test_a_tabular_run_from_the_command_trains_at_a_tables_learning_rate(tmp_path):
    """``--policy tabular`` without a learning rate trains at TABULAR_RUN's 0.1: at the configs'
    5e-6 (a language model's rate) both tables of ``--env TinyHanabi-A-v0 --actions 0,1,2`` stayed
    uniform over 36,872 steps (entropy 1.098; log 3 = 1.099). A rate given is kept."""
    from llm_marl.cli import build_trainer

    options = {"env": "ClimbingGame-v0", "policy": "tabular", "num_turns": 1, "progress_bar": False, "eval_interval": 0}
    trainer = build_trainer({**options, "max_steps": 30, "output_dir": str(tmp_path / "a")})
    assert trainer.args.agent_learning_rate == 0.1
    observation = trainer.env.reset(options={"index": 0})[0][trainer.agents[0]]
    before = trainer.policies[trainer.agents[0]].probabilities(observation)
    trainer.train()
    after = trainer.policies[trainer.agents[0]].probabilities(observation)
    assert torch.allclose(before, torch.full_like(before, 1 / len(before)))
    # an AdamW step moves each logit by at most about the rate: at 5e-6, 30 steps leave every probability within 1e-4 of 1/3
    assert (after - before).abs().max() > 0.05
    kept = build_trainer({**options, "agent_learning_rate": 0.3, "learner": "iac", "critic_learning_rate": 0.2, "output_dir": str(tmp_path / "b")})
    assert (kept.args.agent_learning_rate, kept.args.critic_learning_rate) == (0.3, 0.2)
    assert build_trainer({**options, "learner": "iac", "output_dir": str(tmp_path / "c")}).args.critic_learning_rate == 0.1

"""Checkpoints and resume, determinism, and errors that lose nothing (tabular policies)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from llm_marl.envs.dialogue import DialogueEnv
from llm_marl.learners import MAGRPOConfig, MAGRPOTrainer, checkpoint
from llm_marl.policies.tabular import TabularPolicy
from llm_marl.tasks.base import TaskError
from toy_tasks import MENU, ColourMatch

torch.set_num_threads(1)


def make_trainer(output_dir=None, task=None, **overrides):
    settings = dict(
        num_turns=2,
        num_generations=3,
        num_train_epochs=3,
        agent_learning_rate=0.1,
        rollout_buffer_size=3,
        train_batch_size=2,
        early_termination_threshold=None,
        eval_interval=2,
        eval_num_samples=2,
        logging_steps=1,
        progress_bar=False,
        save_steps=2,
        save_total_limit=None,
        output_dir=None if output_dir is None else str(output_dir),
        seed=7,
    )
    settings.update(overrides)
    env = DialogueEnv(task or ColourMatch())
    return MAGRPOTrainer(env=env, policies=[TabularPolicy(MENU), TabularPolicy(MENU)], args=MAGRPOConfig(**settings))


def weights(trainer):
    return {a: {k: v.clone() for k, v in p.state_dict().items() if isinstance(v, torch.Tensor)} for a, p in trainer.policies.items()}


def same_weights(a, b):
    return all(torch.equal(a[agent][k], b[agent][k]) for agent in a for k in a[agent])


def metrics_lines(run_dir):
    """Every logged metric except wall-clock throughput, which no two runs share."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if not k.endswith("per_second")} for line in f]


def test_stop_resume_equals_uninterrupted(tmp_path):
    full = make_trainer(tmp_path / "full")
    full.train()

    first = make_trainer(tmp_path / "split", max_steps=7)
    first.train()
    assert 7 <= first.state.global_step < full.state.global_step
    resumed = make_trainer(tmp_path / "split")
    resumed.train(resume_from_checkpoint=True)

    assert resumed.state.global_step == full.state.global_step
    assert resumed.state.batch_step == full.state.batch_step
    assert same_weights(weights(full), weights(resumed))
    assert metrics_lines(tmp_path / "full") == metrics_lines(tmp_path / "split")


def test_resume_from_a_checkpoint_with_filled_buffers_equals_uninterrupted(tmp_path):
    # The newest checkpoint of a run stopped by max_steps has empty buffers; an earlier one holds
    # samples not yet trained on, which the resumed run must train on as the uninterrupted run did.
    full = make_trainer(tmp_path / "full")
    full.train()
    make_trainer(tmp_path / "split", max_steps=7).train()
    middle = str(tmp_path / "split" / "checkpoint-4")
    saved = torch.load(os.path.join(middle, "buffers.pt"), weights_only=False)["buffers"]
    assert all(len(samples) > 0 for samples in saved.values())
    resumed = make_trainer(tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=middle)
    assert resumed.state.global_step == full.state.global_step
    assert same_weights(weights(full), weights(resumed))


def test_checkpoint_holds_everything_needed(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=3)
    trainer.train()
    path = trainer.state.last_checkpoint
    names = sorted(os.listdir(path))
    assert names == ["agent_0", "agent_1", "buffers.pt", "manifest.json", "rng.pt", "trainer_state.json"]
    assert sorted(os.listdir(os.path.join(path, "agent_0"))) == ["optimizer.pt", "policy.pt"]
    state = json.load(open(os.path.join(path, "trainer_state.json")))["state"]
    assert state["global_step"] == trainer.state.global_step
    assert state["batch_in_epoch"] == trainer.state.batch_in_epoch


def test_save_total_limit_keeps_newest(tmp_path):
    trainer = make_trainer(tmp_path, save_steps=1, save_total_limit=2)
    trainer.train()
    kept = checkpoint.list_checkpoints(str(tmp_path))
    assert len(kept) == 2
    assert kept[-1].endswith(f"checkpoint-{trainer.state.global_step}")


def test_truncated_checkpoint_is_detected_and_previous_used(tmp_path):
    trainer = make_trainer(tmp_path, save_steps=1, max_steps=4)
    trainer.train()
    paths = checkpoint.list_checkpoints(str(tmp_path))
    newest, previous = paths[-1], paths[-2]
    policy_file = os.path.join(newest, "agent_0", "policy.pt")
    with open(policy_file, "r+b") as f:
        f.truncate(os.path.getsize(policy_file) // 2)
    with pytest.raises(checkpoint.CheckpointError, match="truncated or corrupted"):
        checkpoint.verify(newest)
    with pytest.warns(UserWarning, match="skipping unusable checkpoint"):
        assert checkpoint.resolve(True, str(tmp_path)) == previous
    # A half-written folder (no manifest) is not a checkpoint either.
    os.remove(os.path.join(previous, "manifest.json"))
    with pytest.raises(checkpoint.CheckpointError, match="not completely written"):
        checkpoint.verify(previous)


def test_a_flipped_byte_of_the_same_size_is_detected_by_its_sha256(tmp_path):
    trainer = make_trainer(tmp_path, save_steps=1, max_steps=4)
    trainer.train()
    paths = checkpoint.list_checkpoints(str(tmp_path))
    newest, previous = paths[-1], paths[-2]
    checkpoint.verify(newest)
    policy_file = os.path.join(newest, "agent_1", "policy.pt")
    size = os.path.getsize(policy_file)
    with open(policy_file, "r+b") as f:
        f.seek(size // 2)
        byte = f.read(1)
        f.seek(size // 2)
        f.write(bytes([byte[0] ^ 0x01]))
    assert os.path.getsize(policy_file) == size
    with pytest.raises(checkpoint.CheckpointError, match=r"agent_1/policy.pt is truncated or corrupted"):
        checkpoint.verify(newest)
    with pytest.warns(UserWarning, match="skipping unusable checkpoint"):
        assert checkpoint.resolve(True, str(tmp_path)) == previous


def test_temporary_folder_never_looks_like_a_checkpoint(tmp_path):
    os.makedirs(tmp_path / ".tmp-checkpoint-9-123")
    assert checkpoint.list_checkpoints(str(tmp_path)) == []
    with pytest.raises(checkpoint.CheckpointError, match="nothing to resume"):
        checkpoint.resolve(True, str(tmp_path))


KILL_SCRIPT = r"""
import sys, time, torch
sys.path.insert(0, {tests!r})
torch.set_num_threads(1)
from test_reliability import make_trainer
trainer = make_trainer({out!r}, save_steps=1, num_train_epochs=8)
original = trainer._train_batch
def slow(indices):
    original(indices)
    time.sleep(0.3)
trainer._train_batch = slow
trainer.train()
"""


def test_sigkill_mid_training_resumes_from_last_checkpoint(tmp_path):
    out = tmp_path / "killed"
    script = KILL_SCRIPT.format(tests=os.path.dirname(__file__), out=str(out))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and len(checkpoint.list_checkpoints(str(out))) < 3:
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    killed_at = checkpoint.list_checkpoints(str(out))
    assert killed_at, "no checkpoint was written before the kill"

    resumed = make_trainer(out, save_steps=1, num_train_epochs=8)
    resumed.train(resume_from_checkpoint=True)
    full = make_trainer(tmp_path / "full", save_steps=1, num_train_epochs=8)
    full.train()
    assert same_weights(weights(full), weights(resumed))
    assert metrics_lines(tmp_path / "full") == metrics_lines(out)


def test_seeded_runs_identical_and_seeds_differ():
    a, b, c = make_trainer(), make_trainer(), make_trainer(seed=8)
    for trainer in (a, b, c):
        trainer.train()
    assert same_weights(weights(a), weights(b))
    strip = lambda history: [(step, {k: v for k, v in m.items() if not k.endswith("per_second")}) for step, m in history]
    assert strip(a.logger.history) == strip(b.logger.history)
    assert not same_weights(weights(a), weights(c))


def test_failing_reward_fails_fast_and_leaves_state_unchanged():
    trainer = make_trainer(task=ColourMatch(fail_on=2), eval_interval=0)
    before_weights = weights(trainer)
    with pytest.raises(TaskError, match=r"task ColourMatch, item 2, turn 0: reward raised RuntimeError: reward backend unavailable"):
        trainer.train()
    # Items 0 and 1 trained; the failing batch changed nothing: buffers hold what they held.
    assert trainer.state.batch_in_epoch == 2
    held = {a: len(b) for a, b in trainer.buffers.items()}
    stepped = weights(trainer)
    with pytest.raises(TaskError):
        trainer._train_batch([2])
    assert {a: len(b) for a, b in trainer.buffers.items()} == held
    assert same_weights(stepped, weights(trainer))
    assert not same_weights(before_weights, stepped)


def test_skip_policy_drops_item_counts_and_logs_it(tmp_path, capsys):
    trainer = make_trainer(tmp_path, task=ColourMatch(fail_on=2), reward_error_policy="skip", eval_interval=0)
    trainer.train()
    assert trainer.state.skipped_items == 3  # one per epoch
    assert "skipped item 2" in capsys.readouterr().out
    logged = [m["train/skipped_items"] for m in metrics_lines(tmp_path) if "train/skipped_items" in m]
    assert logged[-1] == 3


def test_nan_reward_from_task_is_an_error():
    class NaNTask(ColourMatch):
        def reward(self, item, actions, history):
            return float("nan")

    trainer = make_trainer(task=NaNTask(), eval_interval=0)
    with pytest.raises(TaskError, match="task NaNTask, item 0, turn 0, joint answer 0: reward is nan"):
        trainer.train()


def test_nan_loss_stops_with_agent_step_and_last_checkpoint(tmp_path):
    trainer = make_trainer(tmp_path, eval_interval=0, save_steps=1)
    trainer.args.max_steps = 2
    trainer.train()
    last = trainer.state.last_checkpoint
    trainer.args.max_steps = None
    policy = trainer.policies["right"]
    original = policy.log_probs
    policy.log_probs = lambda obs, completions, reduction="sum": original(obs, completions, reduction) * float("nan")
    with pytest.raises(FloatingPointError, match=rf"agent 'right', optimizer step 3, .*last good checkpoint: {last}"):
        trainer.train(resume_from_checkpoint=False)


def test_failing_eval_hook_is_named():
    def logger(**kwargs):
        raise KeyError("score")

    trainer = make_trainer()
    trainer.eval_logger, trainer.eval_aggregator = logger, lambda metrics, num_turns: {}
    with pytest.raises(RuntimeError, match="eval_logger raised KeyError"):
        trainer.evaluate()


def test_config_that_does_not_match_env():
    env = DialogueEnv(ColourMatch())
    with pytest.raises(ValueError, match="num_agents is 3 but the env has 2 agents"):
        MAGRPOTrainer(env=env, policies=[TabularPolicy(MENU)] * 3, args=MAGRPOConfig(num_agents=3))
    with pytest.raises(ValueError, match=r"policies keys \['left', 'middle'\] do not match"):
        MAGRPOTrainer(env=env, policies={"left": TabularPolicy(MENU), "middle": TabularPolicy(MENU)}, args=MAGRPOConfig())


def test_empty_dataset_is_named():
    with pytest.raises(ValueError, match="split 'train' has no rows"):
        DialogueEnv(ColourMatch(num_items=0))


def test_resume_restores_the_envs_item_generators(tmp_path):
    # a new env draws its item generator from fresh entropy; the resumed run continues the saved one
    first = make_trainer(tmp_path, max_steps=3)
    first.train()
    drawn = {name: getattr(first, name)._np_random.bit_generator.state for name in ("env", "eval_env")}
    resumed = make_trainer(tmp_path, max_steps=3)
    assert resumed.env._np_random.bit_generator.state != drawn["env"]
    resumed.train(resume_from_checkpoint=True)
    assert {name: getattr(resumed, name)._np_random.bit_generator.state for name in ("env", "eval_env")} == drawn


def test_a_batch_cut_by_max_steps_and_resumed_logs_every_key_of_its_row(tmp_path):
    # Tiny Hanabi: player_0's update ends at step 1, player_1's update of the same batch is cut
    # before its first step; resumed, those restored answers are the run's own again, so the row
    # has train/player_1/sampler_gap (and sampler_staleness) as the uninterrupted run's does
    from llm_marl import cli

    base = ["train", "--env", "TinyHanabi-A-v0", "--policy", "tabular", "--actions", "0,1,2", "--num_generations", "2",
            "--items_per_step", "2", "--rollout_buffer_size", "2", "--train_batch_size", "1", "--train_items", "4",
            "--num_train_epochs", "1", "--logging_steps", "1", "--threads", "1", "--seed", "0", "--eval_interval", "0"]
    assert cli.main(base + ["--output_dir", str(tmp_path / "full")]) == 0
    assert cli.main(base + ["--output_dir", str(tmp_path / "split"), "--max_steps", "1"]) == 0
    assert cli.main(base + ["--output_dir", str(tmp_path / "split"), "--resume"]) == 0
    full, split = metrics_lines(tmp_path / "full"), metrics_lines(tmp_path / "split")
    assert "train/player_1/sampler_gap" in full[0] and "train/player_1/sampler_staleness" in full[0]
    assert split == full

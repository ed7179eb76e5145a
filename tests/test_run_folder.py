"""Run folders in Python: the trainer refuses a folder holding another run, moves it aside on
overwrite_output_dir, resumes only its own run, never lets a checkpoint silently replace another
run's, and stops on SIGINT/SIGTERM with a checkpoint."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import warnings

import pytest

from llm_marl import MAGRPOConfig, MAGRPOTrainer, TabularPolicy, make
from llm_marl.runs import checkpoint
from llm_marl.runs.interrupt import TrainingInterrupted
from llm_marl.runs.run_folder import RunFolderError


def trainer(out, **overrides):
    settings = dict(num_turns=1, num_train_epochs=3, agent_learning_rate=0.3, eval_interval=0, progress_bar=False,
                    early_termination_threshold=None, output_dir=str(out))
    settings.update(overrides)
    menu = ["alpha", "beta", "gamma"]
    return MAGRPOTrainer(env=make("ClimbingGame-v0"), policies=[TabularPolicy(menu), TabularPolicy(menu)],
                         args=MAGRPOConfig(**settings))


def digest(folder):
    return {os.path.relpath(os.path.join(root, name), folder): hashlib.sha256(open(os.path.join(root, name), "rb").read()).hexdigest()
            for root, _, names in os.walk(folder) for name in names}


def test_a_second_run_is_refused_and_overwrite_moves_the_first_aside(tmp_path):
    out = tmp_path / "run"
    first = trainer(out)
    first.train()
    before = digest(out)
    with pytest.raises(RunFolderError, match=rf"output folder {out} is not empty \(it holds run {first.run_id}"):
        trainer(out).train()
    assert digest(out) == before
    first.train()  # the same trainer training again continues its own run: no refusal
    before = digest(out)
    second = trainer(out, overwrite_output_dir=True)
    second.train()
    [aside] = [p for p in tmp_path.iterdir() if p.name.startswith("run.replaced-")]
    assert digest(aside) == before and second.run_id != first.run_id
    assert json.load(open(out / "run.json"))["run_id"] == second.run_id


def test_resume_checks_the_config_and_picks_the_run_s_own_newest_checkpoint(tmp_path):
    out, other = tmp_path / "run", tmp_path / "other"
    trainer(out, save_steps=1, save_total_limit=None).train()
    trainer(other, num_train_epochs=5, seed=3).train()
    os.rename(other / "checkpoint-5", out / "checkpoint-5")  # a higher step, from another run
    with pytest.raises(RunFolderError, match=r"this config differs .*agent_learning_rate: 0.3 -> 0.2"):
        trainer(out, agent_learning_rate=0.2).train(resume_from_checkpoint=True)
    resumed = trainer(out, num_train_epochs=4)
    own = json.load(open(out / "run.json"))["run_id"]
    assert checkpoint.resolve(True, str(out), own) == str(out / "checkpoint-3")
    state = resumed.train(resume_from_checkpoint=True)
    assert state.global_step == 4  # 3 of its own + 1 (checkpoint-5 would have given 5)
    assert (out / "checkpoint-5").exists()


def test_resume_checks_the_env_and_the_policies_too(tmp_path):
    out = tmp_path / "run"
    trainer(out).train()
    menu = ["alpha", "beta", "gamma"]
    other_env = MAGRPOTrainer(env=make("PenaltyGame-v0"), policies=[TabularPolicy(menu), TabularPolicy(menu)],
                              args=trainer(out).args)
    with pytest.raises(RunFolderError, match=r"another env \(env: 'ClimbingGame_v0' -> 'PenaltyGame_v0'\)"):
        other_env.train(resume_from_checkpoint=True)
    assert trainer(out, num_train_epochs=4).train(resume_from_checkpoint=True).global_step == 4  # the same launch resumes


def test_a_checkpoint_of_another_run_is_moved_aside_not_replaced(tmp_path):
    out = tmp_path / "run"
    trainer(out).train()
    foreign = digest(out / "checkpoint-3")
    intruder = trainer(tmp_path / "elsewhere")
    intruder.train()
    intruder.args.output_dir = str(out)
    with pytest.warns(UserWarning, match=r"checkpoint-3 belonged to another run; moved it aside"):
        checkpoint.save(intruder)
    [aside] = [p for p in out.iterdir() if p.name.startswith("checkpoint-3.replaced-")]
    assert digest(aside) == foreign


def negated_rewards(run):
    """Make ``run``'s task pay the opposite rewards (a judge or test that answers differently the
    second time), so a resumed run's later checkpoints hold another state than the first time."""
    original = run.env.task.rewards

    def rewards(item, joint_actions, history):
        return [(-r[0], r[1]) if isinstance(r, tuple) else -r for r in original(item, joint_actions, history)]

    run.env.task.rewards = rewards


def test_resuming_an_older_checkpoint_moves_the_run_s_later_one_aside_not_silently_replaced(tmp_path):
    out = tmp_path / "run"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # checkpoint-3 is saved twice (periodic, then closing): no warning
        trainer(out, save_steps=1, save_total_limit=None).train()
    later = digest(out / "checkpoint-3")
    resumed = trainer(out, save_steps=1, save_total_limit=None)
    negated_rewards(resumed)  # steps 2 and 3 now go differently: checkpoint-3 is another state
    with pytest.warns(UserWarning, match=r"checkpoint-3 belonged to this run before the checkpoint it resumed from; moved it aside"):
        resumed.train(resume_from_checkpoint=str(out / "checkpoint-1"))
    [aside] = [p for p in out.iterdir() if p.name.startswith("checkpoint-3.replaced-")]
    assert digest(aside) == later and (out / "checkpoint-3" / "manifest.json").exists()
    assert digest(out / "checkpoint-3")["agent_0/policy.pt"] != later["agent_0/policy.pt"]


def test_resuming_a_finished_run_re_saves_its_last_checkpoint_without_a_copy(tmp_path):
    """A run that finished training but was stopped before it was done (e.g. during the CLI's
    closing evaluation) resumes: nothing is left to train, so it writes checkpoint-3 again with
    the same state. That is not a conflict: no checkpoint-3.replaced-* copy, no warning."""
    out = tmp_path / "run"
    trainer(out).train()
    first = digest(out / "checkpoint-3")
    resumed = trainer(out)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        state = resumed.train(resume_from_checkpoint=True)
    assert state.global_step == 3
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(("checkpoint-", "."))) == ["checkpoint-3"]
    again = digest(out / "checkpoint-3")
    assert {k for k in first if first[k] != again[k]} <= {"trainer_state.json", "manifest.json"}  # only when it was written
    checkpoint.verify(str(out / "checkpoint-3"))
    # resumed from an older checkpoint, a run that trains steps 2 and 3 the same way again is no conflict either
    steps = tmp_path / "steps"
    trainer(steps, save_steps=1, save_total_limit=None).train()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer(steps, save_steps=1, save_total_limit=None).train(resume_from_checkpoint=str(steps / "checkpoint-1"))
    assert sorted(p.name for p in steps.iterdir() if p.name.startswith(("checkpoint-", "."))) == [f"checkpoint-{i}" for i in (1, 2, 3)]


@pytest.fixture
def python_sigint():
    """SIGINT as a plain Python process has it (KeyboardInterrupt), whatever the suite inherited:
    started in the background (``nohup ... &``) it arrives ignored, and training keeps it so."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_after_the_batch_with_a_checkpoint(tmp_path, signum, code, python_sigint):
    run = trainer(tmp_path / "run", num_train_epochs=6)
    original = run.env.task.rewards
    calls = []

    def rewards(item, joint_actions, history):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signum)
        return original(item, joint_actions, history)

    run.env.task.rewards = rewards
    with pytest.raises(TrainingInterrupted) as stop:
        run.train()
    assert stop.value.exit_code == code and stop.value.checkpoint == str(tmp_path / "run" / "checkpoint-2")
    assert run.state.batch_step == 2 and len(calls) == 2
    assert signal.getsignal(signum) is not None and signal.getsignal(signum) != run  # handlers restored
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_run_ended_by_max_steps_logs_its_last_batches(tmp_path):
    """logging_steps averages metrics over batches; a run that max_steps ends mid-epoch, between
    two logging points, still logs what it trained on since the last one (nothing is dropped)."""
    from test_atomic_update import make_trainer

    run = make_trainer(logging_steps=50, max_steps=1, output_dir=str(tmp_path / "run"))  # 4 items, a step per 2
    run.train()
    assert run.state.batch_step == 2 and run.state.epoch == 0  # stopped mid-epoch
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in rows if "train/turn_1/reward_mean" in r] == [1]  # batches 0-1, at batch 1

"""No unasked gigabytes (issue 24): a trainer built from CoMLRL's keywords writes model weights
and optimizer states only when the script asks — ``save_model(dir)``, or ``save_steps`` > 0 —
while its logs, metrics and rollouts still go to the run folder. The env-native constructor with
an ``output_dir`` and the CLI keep their resumable checkpoint at the end (and on a signal);
``save_final_checkpoint`` says so explicitly either way."""

from __future__ import annotations

import json
import os
import signal
import warnings
from pathlib import Path

import datasets
import pytest
import torch

from llm_marl import MAGRPOConfig as NativeConfig
from llm_marl import MAGRPOTrainer as NativeTrainer
from llm_marl import TabularPolicy, make
from llm_marl.comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from llm_marl.runs.interrupt import TrainingInterrupted

ROWS = [{"prompt": "def add(a, b):"}, {"prompt": "def neg(x):"}]
WEIGHT_SUFFIXES = (".pt", ".pth", ".safetensors", ".bin", ".ckpt")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from llm_marl.policies.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", pretrain_steps=0))


@pytest.fixture
def work(tmp_path, monkeypatch):
    """The script's working directory (default run folders land here), apart from the model's."""
    folder = tmp_path / "work"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


@pytest.fixture
def writes(monkeypatch):
    """Every weight writer the library could reach: torch.save, safetensors, save_pretrained."""
    import safetensors.torch
    import transformers

    calls: list[str] = []
    real_save, real_file, real_pretrained = torch.save, safetensors.torch.save_file, transformers.PreTrainedModel.save_pretrained

    def save(obj, f, *a, **k):
        calls.append(f"torch.save {f}")
        return real_save(obj, f, *a, **k)

    def save_file(tensors, filename, *a, **k):
        calls.append(f"safetensors {filename}")
        return real_file(tensors, filename, *a, **k)

    def save_pretrained(self, directory, *a, **k):
        calls.append(f"save_pretrained {directory}")
        return real_pretrained(self, directory, *a, **k)

    monkeypatch.setattr(torch, "save", save)
    monkeypatch.setattr(safetensors.torch, "save_file", save_file)
    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", save_pretrained)
    return calls


def weight_files(folder) -> list[str]:
    """Weight, optimizer and checkpoint files anywhere under ``folder``."""
    found = []
    for root, dirs, files in os.walk(folder):
        for name in files + dirs:
            if name.endswith(WEIGHT_SUFFIXES) or "optimizer" in name or name.startswith(("checkpoint-", ".tmp-checkpoint")):
                found.append(os.path.relpath(os.path.join(root, name), folder))
    return sorted(found)


def comlrl_trainer(tiny, **overrides):
    settings = dict(num_turns=1, num_train_epochs=1, num_generations=2, max_new_tokens=3, temperature=1.0, top_p=1.0,
                    top_k=None, rollout_buffer_size=2, eval_interval=0, progress_bar=False, rollout_log_steps=1,
                    early_termination_threshold=None, agent_learning_rate=1e-2)
    settings.update(overrides)
    return MAGRPOTrainer(agent_model=tiny, reward_func=lambda a, b: [float(len(a[0]) - len(b[0]))],
                         train_dataset=datasets.Dataset.from_list(ROWS), args=MAGRPOConfig(**settings))


def test_a_comlrl_style_run_writes_no_weights_until_save_model(tiny, work, writes, capsys):
    trainer = comlrl_trainer(tiny)
    run = Path(trainer.args.output_dir)
    assert "no weights unless save_model() or save_steps" in capsys.readouterr().out
    trainer.train()
    assert trainer.state.global_step >= 1
    # the record is there: logs, metrics, rollouts; no weights or optimizer states, here or anywhere
    assert {"logs", "metrics.jsonl", "rollouts", "run.json"} <= set(os.listdir(run))
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert weight_files(work) == [] and writes == []
    assert trainer.state.last_checkpoint is None

    trainer.save_model(str(work / "saved"))  # asked for: loadable weights, equal to the trained ones
    from transformers import AutoModelForCausalLM

    for i, agent in enumerate(trainer.agent_ids):
        loaded = AutoModelForCausalLM.from_pretrained(work / "saved" / f"agent_{i}").state_dict()
        mine = trainer.policies[agent].model.state_dict()
        name = next(n for n in mine if n.endswith("c_attn.weight"))
        assert torch.equal(loaded[name], mine[name])
    assert {path.split(os.sep)[0] for path in weight_files(work)} == {"saved"}


def test_save_steps_still_writes_checkpoints(tiny, work):
    trainer = comlrl_trainer(tiny, save_steps=1, save_total_limit=None)
    trainer.train()
    run = Path(trainer.args.output_dir)
    steps = sorted(int(p.name.split("-")[1]) for p in run.iterdir() if p.name.startswith("checkpoint-"))
    assert steps == list(range(1, trainer.state.global_step + 1)) and steps
    last = run / f"checkpoint-{steps[-1]}"
    assert (last / "agent_0" / "policy.pt").exists() and (last / "agent_0" / "optimizer.pt").exists()
    assert trainer.state.last_checkpoint == str(last)


def test_checkpoint_dir_in_train_asks_for_the_closing_checkpoint(tiny, work):
    trainer = comlrl_trainer(tiny)
    trainer.train(checkpoint_dir=trainer.args.output_dir)
    assert (Path(trainer.args.output_dir) / f"checkpoint-{trainer.state.global_step}" / "manifest.json").exists()


def test_a_drop_in_run_may_ask_for_the_resumable_closing_checkpoint_and_resume_it_without_a_copy(tiny, work):
    trainer = comlrl_trainer(tiny, save_final_checkpoint=True, output_dir=str(work / "run"))
    trainer.train()
    assert [p.name for p in (work / "run").iterdir() if p.name.startswith("checkpoint-")] == ["checkpoint-1"]
    # stopped after training (say, in a closing evaluation) and resumed: the same state, saved again
    # — language-model weights and AdamW moments byte for byte — so no copy is moved aside
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        comlrl_trainer(tiny, save_final_checkpoint=True, output_dir=str(work / "run")).train(resume_from_checkpoint=True)
    assert sorted(p.name for p in (work / "run").iterdir() if "checkpoint" in p.name) == ["checkpoint-1"]


def native(out, **overrides):
    settings = dict(num_turns=1, num_train_epochs=3, agent_learning_rate=0.3, eval_interval=0, progress_bar=False,
                    early_termination_threshold=None, output_dir=str(out))
    settings.update(overrides)
    menu = ["alpha", "beta", "gamma"]
    return NativeTrainer(env=make("ClimbingGame-v0"), policies=[TabularPolicy(menu), TabularPolicy(menu)],
                         args=NativeConfig(**settings))


def test_the_env_native_constructor_keeps_its_closing_checkpoint_unless_told_not_to(tmp_path):
    assert NativeConfig().save_final_checkpoint is None
    native(tmp_path / "kept").train()
    assert (tmp_path / "kept" / "checkpoint-3" / "agent_0" / "optimizer.pt").exists()
    native(tmp_path / "none", save_final_checkpoint=False).train()
    assert weight_files(tmp_path / "none") == [] and (tmp_path / "none" / "metrics.jsonl").exists()


@pytest.mark.parametrize("final, checkpointed", [(None, True), (False, False)])
def test_a_signal_checkpoints_only_where_the_end_would(tmp_path, capsys, final, checkpointed):
    run = native(tmp_path / "run", num_train_epochs=6, save_final_checkpoint=final)
    original = run.env.task.rewards

    def rewards(item, joint_actions, history):
        os.kill(os.getpid(), signal.SIGINT)
        return original(item, joint_actions, history)

    run.env.task.rewards = rewards
    with pytest.raises(TrainingInterrupted) as stop:
        run.train()
    assert (stop.value.checkpoint == str(tmp_path / "run" / "checkpoint-1")) is checkpointed
    assert bool(weight_files(tmp_path / "run")) is checkpointed
    notice = capsys.readouterr().err  # the Ctrl-C notice promises a checkpoint only where one is written
    assert ("and writing a checkpoint" in notice) is checkpointed and ("writes no checkpoint" in notice) is not checkpointed


def test_the_cli_keeps_resumable_checkpoints(tmp_path):
    from llm_marl.cli import main

    out = tmp_path / "cli"
    assert main(["train", "--env", "ClimbingGame-v0", "--policy", "tabular", "--num_turns", "1", "--num_train_epochs", "2",
                 "--eval_interval", "0", "--eval_num_samples", "1", "--progress_bar", "false", "--output_dir", str(out)]) == 0
    assert (out / "checkpoint-2" / "agent_0" / "optimizer.pt").exists()

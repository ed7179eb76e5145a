"""A CoMLRL companion-repository script migrates with the README's one line and trains.

``tests/comlrl_script/`` holds a ``train_magrpo.py`` + ``config.yaml`` written for CoMLRL 1.4.x
(``from comlrl...`` imports, RewardProcessors scale-then-shift, formatters, a two-turn external
transition, an eval logger and aggregator of the 1.4.2 form, ``wandb_config``, one entry in
``agent_devices``, ``dataset_type=``, no ``output_dir``). The test copies it, runs the sed line
taken verbatim from the README, checks that only import lines changed, then runs the script on
tiny local models with ``WANDB_MODE=offline`` and reads back what the run left: the default run
directory (TensorBoard logs, metrics.jsonl; no weights: only save_model writes them), the W&B
offline run (the same metrics at the same steps, and the run settings from ``wandb_config``) and
the saved models.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from wandb_records import offline_run  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SCRIPT_DIR = Path(__file__).parent / "comlrl_script"

pytest.importorskip("wandb")


def readme_sed_line() -> str:
    lines = [line for line in (REPO / "README.md").read_text().splitlines() if "llm_marl.comlrl" in line and "sed -i" in line]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from llm_marl.policies.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", pretrain_steps=0))


@pytest.fixture(scope="module")
def migrated_run(tiny_model, tmp_path_factory):
    work = tmp_path_factory.mktemp("companion") / "repo"
    shutil.copytree(SCRIPT_DIR, work)
    original = (work / "train_magrpo.py").read_text().splitlines()
    subprocess.run(["bash", "-c", readme_sed_line()], cwd=work, check=True)
    migrated = (work / "train_magrpo.py").read_text().splitlines()
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
    }
    env.pop("WANDB_SERVICE", None)  # set by an in-process W&B run of another test: the script starts its own
    save_path = work / "final_model"
    proc = subprocess.run(
        [sys.executable, "train_magrpo.py", "--config", "config.yaml", "--override",
         f"model.name={tiny_model}", f"output.save_path={save_path}"],
        cwd=work, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return {"work": work, "original": original, "migrated": migrated, "proc": proc, "save_path": save_path}


def test_the_sed_line_rewrites_only_the_imports(migrated_run):
    original, migrated = migrated_run["original"], migrated_run["migrated"]
    assert len(original) == len(migrated)
    changed = [(a, b) for a, b in zip(original, migrated) if a != b]
    assert changed == [
        ("from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer",
         "from llm_marl.comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer"),
        ("from comlrl.utils.reward_processor import RewardProcessors",
         "from llm_marl.comlrl.utils.reward_processor import RewardProcessors"),
    ]
    assert not any(re.match(r"\s*(from|import) comlrl\b", line) for line in migrated)


def test_dataset_type_is_accepted_with_a_deprecation_warning(migrated_run):
    stderr = migrated_run["proc"].stderr
    assert "DeprecationWarning: dataset_type= was accepted by CoMLRL 1.4.0-1.4.2" in stderr


def run_dir(migrated_run) -> Path:
    match = re.search(r"\[llm_marl\] no output_dir given: this run is recorded in (\S+) ", migrated_run["proc"].stdout)
    assert match, migrated_run["proc"].stdout[-2000:]
    path = migrated_run["work"] / match.group(1)
    assert re.fullmatch(r"mt_magrpo_coophumaneval_tiny-\d{8}-\d{6}", path.name)  # the W&B run's name
    assert path.parent == migrated_run["work"] / "runs"
    return path


def metrics_jsonl(migrated_run) -> list[dict]:
    lines = (run_dir(migrated_run) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_the_default_run_directory_holds_tensorboard_logs_and_metrics_but_no_unasked_weights(migrated_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    directory = run_dir(migrated_run)
    rows = metrics_jsonl(migrated_run)
    # 2 train items x 2 epochs = 4 batches; eval before batch 0 of each epoch (eval_interval 2)
    train_steps = sorted({r["step"] for r in rows if "train/turn_1/reward_mean" in r})
    eval_rows = [r for r in rows if "eval/turn_1/reward_mean" in r]
    assert train_steps == [0, 1, 2, 3]
    assert [r["step"] for r in eval_rows] == [0, 2]
    # the 1.4.2-form eval logger and the aggregator ran: its keys, logged under eval/
    for r in eval_rows:
        assert {"eval/turn_1/aux_words_mean", "eval/turn_2/main_calls_aux_mean", "eval/items_with_tests"} <= set(r)
        assert r["eval/items_with_tests"] == 1.0  # of the 2 eval items, one has tests (test_cases passed through)
    # turn 2 exists: the external transition ran
    assert all("train/turn_2/reward_mean" in r for r in rows if "train/turn_1/reward_mean" in r)
    # the reward processor (x2 then -4) was applied: level rewards lie in [0, 3], processed in [-4, 2]
    rewards = [r["train/turn_1/reward_mean"] for r in rows if "train/turn_1/reward_mean" in r]
    assert all(-4.0 <= value <= 2.0 for value in rewards) and min(rewards) < 0

    events = EventAccumulator(str(directory / "logs"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/turn_1/reward_mean", "train/agent_0/loss", "eval/turn_1/aux_words_mean"} <= tags
    logged = {e.step: e.value for e in events.Scalars("train/turn_1/reward_mean")}
    jsonl = {r["step"]: r["train/turn_1/reward_mean"] for r in rows if "train/turn_1/reward_mean" in r}
    assert logged.keys() == jsonl.keys()
    assert all(logged[s] == pytest.approx(jsonl[s], rel=1e-6) for s in jsonl)

    # CoMLRL writes weights only when the script asks (this one calls save_model: see the saved-models test)
    assert not [p for p in directory.rglob("*") if p.name.startswith("checkpoint-") or p.suffix in (".pt", ".safetensors", ".bin")]


def test_the_wandb_offline_run_has_the_same_metrics_and_the_configured_settings(migrated_run):
    run = offline_run(str(migrated_run["work"] / "wandb"))
    assert run["project"] == "comlrl-migration"
    assert run["entity"] == "openmlrl-test"
    assert run["name"] == "mt_magrpo_coophumaneval_tiny"
    assert run["tags"] == ["magrpo", "coophumaneval", "turns_2"]
    config = run["config"]
    assert config["dataset_type"] == "coophumaneval"
    assert config["dataset"] == {"type": "coophumaneval"}  # config_sections
    assert config["trainer"]["agent_devices"] == ["cpu"]
    assert config["num_turns"] == 2 and config["weight_decay"] == 0.01 and config["agent_devices"] == ["cpu", "cpu"]
    assert config["output_dir"] == str(run_dir(migrated_run).relative_to(migrated_run["work"]))

    # every metric of metrics.jsonl, at the same step, with the same value
    by_step: dict[int, dict] = {}
    for row in run["history"]:
        by_step.setdefault(row["_step"], {}).update({k: v for k, v in row.items() if not k.startswith("_")})
    expected: dict[int, dict] = {}
    for row in metrics_jsonl(migrated_run):
        expected.setdefault(row["step"], {}).update({k: v for k, v in row.items() if k != "step"})
    assert by_step.keys() == expected.keys()
    for step, metrics in expected.items():
        assert by_step[step].keys() == metrics.keys(), step
        for name, value in metrics.items():
            assert by_step[step][name] == pytest.approx(value, rel=1e-9, abs=1e-12), (step, name)


def test_the_saved_models_load_and_were_trained(migrated_run, tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    save_path = migrated_run["save_path"]
    assert sorted(os.listdir(save_path)) == ["agent_0", "agent_1"]
    initial = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    for agent in ("agent_0", "agent_1"):
        model = AutoModelForCausalLM.from_pretrained(save_path / agent)
        AutoTokenizer.from_pretrained(save_path / agent)
        weights = model.state_dict()
        assert weights.keys() == initial.keys()
        assert any(not torch.equal(weights[name], initial[name]) for name in initial), f"{agent} was not trained"

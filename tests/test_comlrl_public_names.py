"""Every public name of CoMLRL 1.4.3 resolves under ``llm_marl.comlrl``, and the helpers that work
on llm_marl's runs do.

``tests/comlrl_suite/public_names.json`` was extracted from the ``comlrl==1.4.3`` sdist (the
``__all__`` of each package, and each module path and name its tests and docs import;
``tests/comlrl_suite/suite.py``'s ``public_names``), not imported from CoMLRL.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import pytest
import torch

NAMES = json.loads((Path(__file__).parent / "comlrl_suite" / "public_names.json").read_text())


def ours(module: str):
    return importlib.import_module("llm_marl." + module)


@pytest.mark.parametrize("module", sorted(k for k in NAMES if k.startswith("comlrl")))
def test_every_all_name_resolves_and_is_in_our_all(module):
    mod = ours(module)
    missing = [name for name in NAMES[module] if not hasattr(mod, name)]
    assert not missing, f"llm_marl.{module} lacks {missing}"
    assert set(NAMES[module]) <= set(mod.__all__), f"llm_marl.{module}.__all__ lacks {sorted(set(NAMES[module]) - set(mod.__all__))}"


def test_every_imported_module_and_name_resolves():
    missing = []
    for module in NAMES["modules"]:
        mod = ours(module)
        missing += [f"{module}.{name}" for name in NAMES["imported"].get(module, []) if not hasattr(mod, name)]
    assert not missing


def test_version_is_the_served_comlrl_release():
    import llm_marl.comlrl as comlrl

    assert comlrl.__version__ == "1.4.3"


# --- checkpoints --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny CoMLRL-style MAGRPO run that writes checkpoint-1 (save_steps=1)."""
    from llm_marl.comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
    from llm_marl.policies.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("run")
    model = str(build_tiny_model(root / "m", pretrain_steps=0))
    args = MAGRPOConfig(num_turns=1, num_train_epochs=1, num_generations=2, max_new_tokens=2, rollout_buffer_size=2, eval_interval=0,
                        progress_bar=False, output_dir=str(root / "out"), save_steps=1, save_final_checkpoint=False)
    trainer = MAGRPOTrainer(agent_model=model, reward_func=lambda a, b: [1.0] * len(a), train_dataset=[{"prompt": "hi"}, {"prompt": "yo"}], args=args)
    trainer.train()
    return root / "out" / "checkpoint-1"


def test_read_checkpoint_metadata_reads_an_llm_marl_checkpoint(checkpoint):
    from llm_marl.comlrl.utils import read_checkpoint_metadata
    from llm_marl.comlrl.utils.checkpoint import STATE_FILENAME

    run = json.loads((checkpoint.parent / "run.json").read_text())
    expected = {"version": 1, "trainer_class": "MAGRPOTrainer", "sequence": 1, "run_id": run["run_id"], "wandb": None}
    assert read_checkpoint_metadata(checkpoint) == expected
    assert read_checkpoint_metadata(str(checkpoint / STATE_FILENAME)) == expected


def test_read_checkpoint_metadata_refuses_a_damaged_or_foreign_checkpoint(checkpoint, tmp_path):
    import shutil

    from llm_marl.comlrl.utils import read_checkpoint_metadata
    from llm_marl.runs.checkpoint import CheckpointError

    damaged = tmp_path / "checkpoint-1"
    shutil.copytree(checkpoint, damaged)
    with open(damaged / "rng.pt", "ab") as f:
        f.write(b"x")
    with pytest.raises(CheckpointError, match="rng.pt is truncated or corrupted"):
        read_checkpoint_metadata(damaged)
    foreign = tmp_path / "comlrl-checkpoint"
    foreign.mkdir()
    (foreign / "training_state.pt").write_bytes(b"")
    with pytest.raises(ValueError, match="is a CoMLRL checkpoint .*resume_from_checkpoint"):
        read_checkpoint_metadata(foreign)
    with pytest.raises(ValueError, match="not a checkpoint folder"):
        read_checkpoint_metadata(tmp_path)


@pytest.mark.parametrize("call", [
    lambda m: m.capture_trainer_state(object()),
    lambda m: m.restore_trainer_state(object(), {}),
    lambda m: m.TrainingCheckpointMixin().save_checkpoint("x"),
    lambda m: m.TrainingCheckpointMixin().load_checkpoint("x"),
])
def test_comlrl_checkpoint_internals_raise_one_line_naming_the_llm_marl_way(call):
    from llm_marl.comlrl.utils import checkpoint as module

    with pytest.raises(NotImplementedError) as err:
        call(module)
    message = str(err.value)
    assert "\n" not in message and "save_steps" in message and "resume_from_checkpoint" in message


@pytest.mark.parametrize("name", ["save_preference_assets", "load_preference_assets", "validate_preference_assets",
                                  "prune_preference_asset_pool", "train_iterations_checkpointed"])
def test_preference_checkpointing_raises_one_line_naming_the_llm_marl_way(name):
    import inspect

    from llm_marl.comlrl.trainers.preference import checkpointing

    function = getattr(checkpointing, name)
    required = {p.name: None for p in inspect.signature(function).parameters.values()
                if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    with pytest.raises(NotImplementedError, match=f"^{name} is CoMLRL's .*resume_from_checkpoint") as err:
        function(**required)
    assert "\n" not in str(err.value)


def test_rng_state_round_trips():
    from llm_marl.comlrl.utils.checkpoint import capture_rng_state, restore_rng_state

    state = capture_rng_state()
    first = torch.rand(3)
    restore_rng_state(state)
    assert torch.equal(torch.rand(3), first)


# --- helpers that compute -----------------------------------------------------------------------


def tiny_lm(seed):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(vocab_size=11, n_positions=16, n_embd=8, n_layer=1, n_head=1))


def test_reference_kl_for_sequence_is_k3_over_the_response_tokens():
    from llm_marl.comlrl.utils import reference_kl_for_sequence

    policy, reference = tiny_lm(0).eval(), tiny_lm(1).eval()
    sequences = torch.tensor([[1, 2, 3, 4, 5, 6]])
    mask = torch.ones_like(sequences)
    assert reference_kl_for_sequence(policy, policy, sequences, mask, 3, 3).item() == 0.0
    # by hand: tokens 4, 5, 6 given their prefixes, delta = log q - log p, sum of exp(delta) - delta - 1
    with torch.no_grad():
        p = policy(sequences).logits.log_softmax(-1)[0, 2:5].gather(1, sequences[0, 3:6, None]).squeeze(1)
        q = reference(sequences).logits.log_softmax(-1)[0, 2:5].gather(1, sequences[0, 3:6, None]).squeeze(1)
    delta = q - p
    expected = (delta.exp() - delta - 1).sum()
    policy.train()
    actual = reference_kl_for_sequence(policy, reference, sequences, mask, 3, 3)
    assert actual.shape == (1,) and actual.item() > 0
    torch.testing.assert_close(actual[0], expected)
    assert policy.training and not reference.training  # modes put back


def test_device_scheduler_and_model_sources():
    from llm_marl.comlrl.schedulers import DeviceScheduler
    from llm_marl.comlrl.utils import resolve_model_sources

    cpu = torch.device("cpu")
    assert DeviceScheduler.resolve_devices(["cpu"], 3) == [cpu] * 3
    assert DeviceScheduler.resolve_devices("cpu", 2) == [cpu, cpu]
    with pytest.raises(ValueError, match="agent_devices length \\(2\\) must be 1 or 3"):
        DeviceScheduler.resolve_devices(["cpu", "cpu"], 3, kind="agent_devices")
    assert resolve_model_sources(kind="agents", model="m", models=None, expected_count=2) == (["m", "m"], "m")
    with pytest.raises(ValueError, match="model and agents conflict"):
        resolve_model_sources(kind="agents", model="m", models=["m", "n"], expected_count=2)


def test_output_path_and_wandb_kwargs(tmp_path):
    from llm_marl.comlrl.trainers.preference.output_paths import resolve_output_path
    from llm_marl.comlrl.utils.wandb_utils import wandb_init_kwargs

    assert resolve_output_path("replay", cached="keep/as/is") == "keep/as/is"
    assert resolve_output_path("replay", wandb_config={"config_sections": {"output": {"base_dir": str(tmp_path)}}}) == str(tmp_path / "replay")
    assert resolve_output_path("replay") is None
    run_config = {"n": 1}
    kwargs = wandb_init_kwargs({"project": "p", "dir": str(tmp_path / "w"), "config_sections": {"dataset": {"name": "d"}}}, run_config)
    assert kwargs == {"project": "p", "entity": None, "name": None, "config": run_config, "dir": str(tmp_path / "w")}
    assert run_config == {"n": 1, "dataset": {"name": "d"}, "dataset_name": "d"} and os.path.isdir(tmp_path / "w")

"""CoMLRL's ``comlrl.utils.checkpoint``, on llm_marl's checkpoints.

llm_marl checkpoints differently from CoMLRL (docs/runs.md, *Checkpoints and resume*): a trainer
writes ``output_dir/checkpoint-{step}`` every ``save_steps`` optimizer steps (and at the end with
``save_final_checkpoint``), and ``train(resume_from_checkpoint=...)`` continues from one. What
works here on those checkpoints:

- :func:`read_checkpoint_metadata` (CoMLRL's user guide reads the W&B identity with it before
  building a trainer): ``version``, ``trainer_class``, ``sequence`` (the optimizer step of the
  checkpoint), ``run_id`` and ``wandb`` of an llm_marl checkpoint folder;
- :func:`capture_rng_state` / :func:`restore_rng_state`: Python's, NumPy's and torch's generators.

CoMLRL's snapshot of an arbitrary trainer object (:func:`capture_trainer_state`,
:func:`restore_trainer_state`) and its checkpoint mixin's ``save_checkpoint`` /
``load_checkpoint`` raise a one-line error that names the llm_marl way.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from llm_marl.runs import rng as _rng

CHECKPOINT_VERSION = 1
"""The layout version :func:`read_checkpoint_metadata` reports for llm_marl's checkpoint folders."""
STATE_FILENAME = "trainer_state.json"
"""The file of an llm_marl checkpoint folder that holds its state (CoMLRL's is ``training_state.pt``)."""

_LLM_MARL_WAY = ("llm_marl checkpoints with the trainer's own save_steps / save_final_checkpoint "
                 "(output_dir/checkpoint-N) and resumes with train(resume_from_checkpoint=...)")


def read_checkpoint_metadata(checkpoint: str | os.PathLike[str]) -> dict[str, Any]:
    """``version``, ``trainer_class``, ``sequence``, ``run_id`` and ``wandb`` of an llm_marl checkpoint.

    ``checkpoint`` is a checkpoint folder or its ``trainer_state.json``. The folder is verified
    against its manifest first (an incomplete one raises
    :class:`llm_marl.runs.checkpoint.CheckpointError`). ``sequence`` is the checkpoint's optimizer
    step (its folder's number); ``trainer_class`` is the trainer named by the run's config class
    (``MAGRPOConfig`` -> ``MAGRPOTrainer``; ``None`` without the run folder's ``run.json``);
    ``wandb`` is ``None``: llm_marl checkpoints do not record a W&B run, so a resumed script keeps
    its own ``wandb_config``. A CoMLRL checkpoint raises ``ValueError``.
    """
    from llm_marl.runs import checkpoint as _checkpoint

    path = Path(checkpoint).expanduser()
    if path.name in (STATE_FILENAME, "training_state.pt"):
        path = path.parent
    if (path / "training_state.pt").exists() and not (path / STATE_FILENAME).exists():
        raise ValueError(f"{path} is a CoMLRL checkpoint (training_state.pt); {_LLM_MARL_WAY}, and reads only its own")
    if not (path / STATE_FILENAME).is_file():
        raise ValueError(f"{path} is not a checkpoint folder: no {STATE_FILENAME} (written by save_steps / save_final_checkpoint)")
    _checkpoint.verify(str(path))
    saved = json.loads((path / STATE_FILENAME).read_text())
    config_class = _run_config_class(path.parent)
    return {
        "version": CHECKPOINT_VERSION,
        "trainer_class": config_class[: -len("Config")] + "Trainer" if config_class and config_class.endswith("Config") else None,
        "sequence": int(saved["state"]["global_step"]),
        "run_id": (saved.get("run") or {}).get("run_id"),
        "wandb": None,
    }


def _run_config_class(run_folder: Path) -> str | None:
    try:
        return json.loads((run_folder / "run.json").read_text()).get("config_class")
    except (OSError, ValueError):
        return None


def capture_rng_state() -> dict[str, Any]:
    """Python's, NumPy's and torch's (and CUDA's) generator states."""
    return _rng.rng_state({})


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back what :func:`capture_rng_state` captured."""
    _rng.restore_rng({}, {"cuda": None, "policies": {}, **state})


def capture_trainer_state(trainer: Any) -> Any:
    """Not served: raises ``NotImplementedError`` naming llm_marl's checkpoints."""
    raise NotImplementedError(f"capture_trainer_state is CoMLRL's in-memory trainer snapshot; {_LLM_MARL_WAY}")


def restore_trainer_state(trainer: Any, state: Any, checkpoint_dir: Any = None, restore_rng: bool = True) -> None:
    """Not served: raises ``NotImplementedError`` naming llm_marl's checkpoints."""
    raise NotImplementedError(f"restore_trainer_state is CoMLRL's in-memory trainer restore; {_LLM_MARL_WAY}")


# CoMLRL-private helpers that CoMLRL's own test modules import: present so that those modules
# import under llm_marl.comlrl (the rest of their tests then run); each raises when called.
def _encode(value: Any, *, copy_tensors: bool = True) -> Any:
    raise NotImplementedError(f"_encode is CoMLRL's private checkpoint encoding; {_LLM_MARL_WAY}")


def _decode(value: Any) -> Any:
    raise NotImplementedError(f"_decode is CoMLRL's private checkpoint decoding; {_LLM_MARL_WAY}")


def _model_metadata(model: Any, config_override: Any = None) -> Any:
    raise NotImplementedError(f"_model_metadata is CoMLRL's private checkpoint metadata; {_LLM_MARL_WAY}")


class TrainingCheckpointMixin:
    """CoMLRL's checkpoint mixin. Its methods raise ``NotImplementedError`` naming llm_marl's
    checkpoints; llm_marl's trainers do not use it."""

    def save_checkpoint(self, output_dir: Any) -> None:
        raise NotImplementedError(f"save_checkpoint is CoMLRL's checkpoint mixin; {_LLM_MARL_WAY}")

    def load_checkpoint(self, checkpoint: Any) -> None:
        raise NotImplementedError(f"load_checkpoint is CoMLRL's checkpoint mixin; {_LLM_MARL_WAY}")


__all__ = [
    "CHECKPOINT_VERSION",
    "STATE_FILENAME",
    "TrainingCheckpointMixin",
    "capture_rng_state",
    "capture_trainer_state",
    "read_checkpoint_metadata",
    "restore_rng_state",
    "restore_trainer_state",
]

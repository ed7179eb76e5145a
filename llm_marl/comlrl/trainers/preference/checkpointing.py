"""CoMLRL's ``comlrl.trainers.preference.checkpointing``: checkpoints of the iterative preference
learners' extra assets (reward models, replay shards).

llm_marl checkpoints its preference trainers with the same ``save_steps`` /
``train(resume_from_checkpoint=...)`` as every trainer (docs/runs.md, *Checkpoints and resume*);
the assets are part of that checkpoint. Each function here raises a one-line
``NotImplementedError`` that says so.
"""

from __future__ import annotations

from typing import Any

_WAY = ("llm_marl checkpoints preference trainers, assets included, with the trainer's save_steps "
        "and resumes with train(resume_from_checkpoint=...)")


def _not_served(name: str) -> NotImplementedError:
    return NotImplementedError(f"{name} is CoMLRL's preference-checkpoint internals; {_WAY}")


def save_preference_assets(trainer: Any, checkpoint_dir: Any) -> Any:
    """Not served (see the module docstring)."""
    raise _not_served("save_preference_assets")


def validate_preference_assets(trainer: Any, checkpoint_dir: Any, manifest: Any) -> None:
    """Not served (see the module docstring)."""
    raise _not_served("validate_preference_assets")


def load_preference_assets(trainer: Any, checkpoint_dir: Any, manifest: Any) -> None:
    """Not served (see the module docstring)."""
    raise _not_served("load_preference_assets")


def prune_preference_asset_pool(checkpoint_root: Any) -> None:
    """Not served (see the module docstring)."""
    raise _not_served("prune_preference_asset_pool")


def train_iterations_checkpointed(trainer: Any, *, reward_model: Any, **kwargs: Any) -> None:
    """Not served: call ``trainer.train()`` (see the module docstring)."""
    raise _not_served("train_iterations_checkpointed")


def validate_preference_progress(trainer: Any, state: Any, kind: Any) -> None:
    """Not served (see the module docstring)."""
    raise _not_served("validate_preference_progress")


def validate_preference_extra_state(state: Any) -> None:
    """Not served (see the module docstring)."""
    raise _not_served("validate_preference_extra_state")


def preference_extra_state(trainer: Any) -> Any:
    """Not served (see the module docstring)."""
    raise _not_served("preference_extra_state")


def restore_preference_extra_state(trainer: Any, state: Any, checkpoint_dir: Any) -> None:
    """Not served (see the module docstring)."""
    raise _not_served("restore_preference_extra_state")


# CoMLRL-private helpers that CoMLRL's own test modules import: present so that those modules
# import under llm_marl.comlrl; each raises when called.
def _resume_output_path(trainer: Any, directory: Any, cache_attribute: Any, config_attribute: Any = None) -> Any:
    raise _not_served("_resume_output_path")


def _preference_resume_destinations(trainer: Any, checkpoint_dir: Any) -> Any:
    raise _not_served("_preference_resume_destinations")


__all__ = ["load_preference_assets", "preference_extra_state", "prune_preference_asset_pool", "restore_preference_extra_state",
           "save_preference_assets", "train_iterations_checkpointed", "validate_preference_assets",
           "validate_preference_extra_state", "validate_preference_progress"]

"""CoMLRL's ``comlrl.utils.wandb_utils``: ``wandb.init`` keywords from a launcher's ``wandb_config``.

llm_marl's trainers build their W&B run from ``wandb_config`` themselves
(:func:`llm_marl.runs.logging.wandb_init_kwargs`, which also takes ``mode``, ``group``, ...);
these are CoMLRL's functions for scripts that call them directly.
"""

from __future__ import annotations

import os
from typing import Any


def wandb_init_kwargs(wandb_config: Any, run_config: dict[str, Any]) -> dict[str, Any]:
    """``project``, ``entity``, ``name`` (or ``run_name``), ``config`` (``run_config`` itself, updated in
    place with every ``config_sections`` entry and the dataset section's ``name``/``type`` as
    ``dataset_name``/``dataset_type``), and ``dir`` (created), ``tags`` (a list), ``id``,
    ``resume`` when given."""
    sections = wandb_config.get("config_sections") if isinstance(wandb_config, dict) else None
    if isinstance(sections, dict):
        run_config.update(sections)
        dataset = sections.get("dataset")
        if isinstance(dataset, dict):
            for key in ("name", "type"):
                if dataset.get(key):
                    run_config[f"dataset_{key}"] = dataset[key]
    kwargs: dict[str, Any] = {
        "project": wandb_config.get("project"),
        "entity": wandb_config.get("entity"),
        "name": wandb_config.get("name") or wandb_config.get("run_name"),
        "config": run_config,
    }
    if wandb_config.get("dir") is not None:
        os.makedirs(wandb_config["dir"], exist_ok=True)
        kwargs["dir"] = wandb_config["dir"]
    if isinstance(wandb_config.get("tags"), list):
        kwargs["tags"] = wandb_config["tags"]
    kwargs.update({key: wandb_config[key] for key in ("id", "resume") if key in wandb_config})
    return kwargs


def verbose_from_wandb_config(wandb_config: Any) -> bool:
    """``config_sections.output.verbose`` (True when absent)."""
    sections = wandb_config.get("config_sections", {}) if isinstance(wandb_config, dict) else {}
    output = sections.get("output", {}) if isinstance(sections, dict) else {}
    return bool(output["verbose"]) if isinstance(output, dict) and "verbose" in output else True


__all__ = ["verbose_from_wandb_config", "wandb_init_kwargs"]

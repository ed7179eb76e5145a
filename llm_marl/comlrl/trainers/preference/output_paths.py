"""CoMLRL's ``comlrl.trainers.preference.output_paths``: where a preference trainer's ``directory``
(e.g. its reward-model or replay folder) goes, without creating anything.

llm_marl's preference trainers write under their run's ``output_dir`` (docs/preference.md);
this is CoMLRL's rule for scripts that call it directly.
"""

from __future__ import annotations

import os
from typing import Any, Optional


def _base_from_wandb_config(wandb_config: Any) -> Optional[str]:
    if not isinstance(wandb_config, dict):
        return None
    if wandb_config.get("output_dir"):
        return wandb_config["output_dir"]
    sections = wandb_config.get("config_sections") or {}
    output = sections.get("output") if isinstance(sections, dict) else None
    base = output.get("base_dir") if isinstance(output, dict) else None
    return base or wandb_config.get("dir")


def resolve_output_path(directory: str, *, cached: Any = None, configured: Any = None, wandb_config: Any = None,
                        default_base: Any = None) -> Optional[str]:
    """``cached`` as it is; else ``configured``; else ``directory`` under ``wandb_config``'s
    ``output_dir`` (or ``config_sections.output.base_dir``, or ``dir``); else under ``default_base``;
    else ``None``. A new path is made absolute (``~`` is not expanded)."""
    if cached:
        return cached
    path = configured
    if not path:
        base = _base_from_wandb_config(wandb_config) or default_base
        path = os.path.join(str(base), directory) if base else None
    return os.path.abspath(str(path)) if path else None


__all__ = ["resolve_output_path"]

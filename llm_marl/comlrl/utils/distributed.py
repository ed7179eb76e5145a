"""CoMLRL's ``comlrl.utils.distributed``: the single-process context and model unwrapping.

llm_marl runs multi-process training with ``llm-marl train --nproc`` (docs/distributed.md);
these helpers describe the one process a CoMLRL-style script runs in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch


@dataclass(frozen=True)
class DistributedContext:
    """Where this process runs."""

    is_main: bool
    """Whether this process writes logs and checkpoints."""
    device: torch.device
    """The process's device."""


def local_context(device: Optional[torch.device] = None) -> DistributedContext:
    """The context of a single process on ``device`` (CUDA when available, else CPU)."""
    if device is None:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return DistributedContext(is_main=True, device=device)


def unwrap_model(model: Any) -> Any:
    """The model inside a DDP/FSDP-style wrapper (its ``.module``), or ``model`` itself."""
    return getattr(model, "module", model)


__all__ = ["DistributedContext", "local_context", "unwrap_model"]

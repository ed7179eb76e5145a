"""A run cut short and resumed, next to the same run uninterrupted: the exact-resume tests' pair."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch


def uninterrupted_and_resumed(
    make: Callable[..., Any],
    root: Path,
    max_steps: int = 2,
    seed: int | None = None,
    on_stopped: Callable[[Any], None] | None = None,
) -> tuple[Any, Any]:
    """``make(output_dir, **overrides)`` builds a trainer that saves a checkpoint every step.
    Trains ``make(root / "full")`` to the end, and ``make(root / "split", max_steps=max_steps)``,
    which stops early (``on_stopped(trainer)`` then checks it); then resumes a fresh
    ``make(root / "split")`` from its checkpoint. With ``seed``, torch's global generator is seeded
    before each of the two runs starts. Returns (the uninterrupted trainer, the resumed one), after
    asserting that the cut came at or after ``max_steps`` and before the end, and that the resumed
    run ended at the same optimizer step."""
    if seed is not None:
        torch.manual_seed(seed)
    full = make(root / "full")
    full.train()
    if seed is not None:
        torch.manual_seed(seed)
    first = make(root / "split", max_steps=max_steps)
    first.train()
    assert max_steps <= first.state.global_step < full.state.global_step
    if on_stopped is not None:
        on_stopped(first)
    resumed = make(root / "split")
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == full.state.global_step
    return full, resumed

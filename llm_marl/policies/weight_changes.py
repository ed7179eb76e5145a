"""Who changed which weights: the notices every sampling copy reads before it is used.

A copy of weights made for sampling (the bf16 shadow of
:class:`~llm_marl.policies.lm_runner.LowPrecisionShadow`, a team's adapters in it, the packs of
:mod:`~llm_marl.policies.packed_weights`) must be current after every change of the weights it
copies. torch's per-tensor ``_version`` counter is not enough: ``AdamW(fused=True)`` (the
trainers' default optimizer) writes its parameters in place without bumping it, and a write
through ``p.data`` (``dist.broadcast(p.data)``) bumps a different counter. So the code that
changes weights says so, and a copy compares an epoch number per weight:

- every ``torch.optim.Optimizer`` step, whatever the optimizer (torch's public global hook
  :func:`torch.optim.optimizer.register_optimizer_step_post_hook`, installed on import), marks
  the parameters of its ``param_groups`` as changed;
- the trainers mark their optimizers' parameters after each step, and loading (policies'
  ``load_state_dict``, checkpoints) and broadcasting (:mod:`~llm_marl.runs.distributed`) call
  :func:`weights_changed` for what they wrote;
- code that writes weights any other way (``p.data.copy_``, a custom kernel) calls
  :func:`weights_changed` (with the tensors, or with nothing: every weight counts as changed).

A copy notes :func:`epoch` when it refreshes and later re-copies each weight whose
:func:`last_change` is newer, or whose ``_version`` or storage moved (kept as a second, cheap
check). A marking costs a dict write per tensor; a false alarm (an id reused after a tensor was
freed) only costs one extra copy.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable

import torch

__all__ = ["epoch", "last_change", "weights_changed", "weights_epoch"]

_COUNTER = itertools.count(1)
_NOW = 0
_EVERYTHING = 0
"""The epoch of the last notice that every weight changed."""
_CHANGED: dict[int, int] = {}
"""``id(tensor)`` -> epoch of its last change notice."""


def epoch() -> int:
    """The current epoch: a copy refreshed now is current until a later notice."""
    return _NOW


def weights_changed(tensors: Iterable[torch.Tensor] | None = None) -> int:
    """Note that ``tensors`` (None: every weight) changed now; returns the new epoch."""
    global _NOW, _EVERYTHING
    _NOW = next(_COUNTER)
    if tensors is None:
        _EVERYTHING = _NOW
    else:
        for tensor in tensors:
            _CHANGED[id(tensor)] = _NOW
    return _NOW


def weights_follow(tensors: Iterable[torch.Tensor], sources: Iterable[torch.Tensor]) -> None:
    """Note that ``tensors`` now hold the weights of ``sources`` (an FSDP unshard writes the full
    tensors from the shards the optimizer stepped): their last change is at least that of
    ``sources``, and no new epoch begins (answers drawn since the sources last changed stay
    drawn by the weights ``tensors`` hold)."""
    since = weights_epoch(sources)
    for tensor in tensors:
        _CHANGED[id(tensor)] = max(_CHANGED.get(id(tensor), 0), since)


def last_change(tensor: torch.Tensor) -> int:
    """The epoch of the newest notice covering ``tensor`` (0: none since the process started)."""
    return max(_CHANGED.get(id(tensor), 0), _EVERYTHING)


def weights_epoch(tensors: Iterable[torch.Tensor]) -> int:
    """The epoch of the newest notice covering any of ``tensors``: which weights they hold. A
    sampler records it with every answer (:class:`~llm_marl.policies.base.SamplerRecord`), so
    the trainer can count the optimizer steps between the sampler's weights and its own."""
    return max((last_change(t) for t in tensors), default=_EVERYTHING)


def optimizer_parameters(optimizer: Any) -> list[torch.Tensor]:
    """The parameters of an optimizer's ``param_groups``."""
    return [p for group in getattr(optimizer, "param_groups", ()) for p in group.get("params", ())]


def _after_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    weights_changed(optimizer_parameters(optimizer))


def _install() -> None:
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook
    except ImportError:  # pragma: no cover - torch < 2.0: the trainers' own notices still apply
        return
    register_optimizer_step_post_hook(_after_optimizer_step)


_install()

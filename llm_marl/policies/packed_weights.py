"""fp32 linear layers with pre-packed weights for decoding on a CPU.

A decode step multiplies every weight matrix of the model by a skinny ``[rows, in]`` input (one
new token per row). MKL's ``sgemm`` re-packs the weight operand on every such call, so at 4-64
rows an fp32 step costs 1.5-2.3x the time of reading the weights once. :class:`PackedLinears`
packs each weight once per sampling call (``torch.ops.mkl._mkl_reorder_linear_weight``, for the
call's row count) and runs the step's linears as ``torch.ops.mkl._mkl_linear`` on the packed
copy: 1.2-1.9x faster linears at 4-64 rows, on the SmolLM2-135M shape and a Qwen-0.5B-like
one (``benchmarks/README.md``, *Packed weights*).

Invariants:

- Results equal ``F.linear``'s up to the order of the floating-point sums (max abs difference
  ~4e-5 on outputs of magnitude ~25): the same fp32 arithmetic, no lower precision.
- A packed weight serves only inputs with exactly the row count it was packed for; any other
  input (a prompt's prefill, a chunk of another size) runs ``F.linear`` on the weight itself.
- A weight changed since it was packed (an optimizer step, ``load_state_dict``: its
  ``_version`` or storage changed) is packed again before use: a pack is never stale.
- Packs of trainable weights are dropped when the sampling call ends (they would be stale after
  the next optimizer step anyway), so a full model's training peak is unchanged; packs of frozen
  weights (a LoRA team's base) are kept for the next call with the same row count. Memory while
  held: about the packed weights' fp32 size.
- Applies only where it can: weights in fp32 on the CPU, a torch built with MKL, layers at least
  :data:`MIN_SIDE` wide on both sides (not a LoRA adapter's rank-r matrices), more than one row,
  and calls long enough to repay the packing (:data:`MIN_STEPS` new tokens; packing costs about
  4-14 steps' saving). Everywhere else :meth:`PackedLinears.active` changes nothing.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from typing import Any, Iterator

import torch
import torch.nn.functional as F

__all__ = ["MIN_SIDE", "MIN_STEPS", "PackedLinears", "packed_linears"]

MIN_SIDE = 64
"""Linear layers narrower than this on either side are not packed (no gain, e.g. LoRA's A/B)."""

MIN_STEPS = 12
"""Sampling calls with fewer new tokens than this are not packed (the packing would not pay)."""


def _mkl_ops() -> Any:
    ops = getattr(torch.ops, "mkl", None)
    try:
        return ops if ops is not None and hasattr(ops, "_mkl_linear") and torch.backends.mkl.is_available() else None
    except (AttributeError, RuntimeError):  # pragma: no cover - a torch without the MKL ops
        return None


def packed_linear(x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor, bias: Any, rows: int) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` through ``packed`` (``weight`` packed for ``rows`` rows)."""
    return torch.ops.mkl._mkl_linear(x, packed, weight, bias, rows)


class PackedLinears:
    """The packable ``torch.nn.Linear`` layers of one model and their packs (module docstring)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._packs: dict[int, tuple[int, tuple[int, int], torch.Tensor, int]] = {}
        self.packed_last = 0
        """Layers the last :meth:`active` call packed (again); 0 when it did not apply."""

    def layers(self) -> list[torch.nn.Linear]:
        """The packable layers: fp32 CPU ``torch.nn.Linear`` at least :data:`MIN_SIDE` wide."""
        return [
            m
            for m in self.model.modules()
            if isinstance(m, torch.nn.Linear)
            and min(m.in_features, m.out_features) >= MIN_SIDE
            and m.weight.dtype == torch.float32
            and m.weight.device.type == "cpu"
        ]

    def applies(self, rows: int, new_tokens: int) -> bool:
        """Whether :meth:`active` packs for a call of ``rows`` rows and ``new_tokens`` steps."""
        return rows >= 2 and new_tokens >= MIN_STEPS and _mkl_ops() is not None

    @contextmanager
    def active(self, rows: int, new_tokens: int) -> Iterator[None]:
        """Within the block, inputs of ``rows`` rows to the packable layers run on packed weights."""
        self.packed_last = 0
        if not self.applies(rows, new_tokens):
            yield
            return
        swapped = []
        try:
            for layer in self.layers():
                swapped.append((layer, layer.__dict__.get("forward")))
                layer.forward = _packed_forward(layer, self._pack(layer, rows), rows)
            yield
        finally:
            for layer, own in swapped:
                if own is None:
                    del layer.__dict__["forward"]
                else:
                    layer.forward = own
                if layer.weight.requires_grad:
                    self._packs.pop(id(layer), None)

    def _pack(self, layer: torch.nn.Linear, rows: int) -> torch.Tensor:
        weight = layer.weight
        stamp = (weight._version, weight.data_ptr())
        held = self._packs.get(id(layer))
        if held is not None and held[0] == rows and held[1] == stamp:
            return held[2]
        packed = torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), rows)
        self._packs[id(layer)] = (rows, stamp, packed, weight.numel() * weight.element_size())
        self.packed_last += 1
        return packed

    def held_weights(self) -> int:
        """Layers whose packs are held between calls (frozen weights only)."""
        return len(self._packs)

    def held_bytes(self) -> int:
        """The fp32 size of the weights whose packs are held: about the resident memory they
        take (MKL reserves a larger buffer per pack, most of it never touched)."""
        return sum(entry[3] for entry in self._packs.values())


def _packed_forward(layer: torch.nn.Linear, packed: torch.Tensor, rows: int) -> Any:
    weight, bias = layer.weight, layer.bias

    def forward(x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or (torch.is_grad_enabled() and weight.requires_grad):
            return F.linear(x, weight, bias)
        return packed_linear(x, packed, weight, bias, rows)

    return forward


_BY_MODEL: "weakref.WeakKeyDictionary[torch.nn.Module, PackedLinears]" = weakref.WeakKeyDictionary()


def packed_linears(model: torch.nn.Module) -> PackedLinears:
    """The :class:`PackedLinears` of ``model`` (one per model, made on first use)."""
    held = _BY_MODEL.get(model)
    if held is None:
        held = _BY_MODEL[model] = PackedLinears(model)
    return held

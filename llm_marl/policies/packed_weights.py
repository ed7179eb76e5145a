"""Linear layers with pre-packed weights for decoding on a CPU.

A decode step multiplies every weight matrix of the model by a skinny ``[rows, in]`` input (one
new token per row). The CPU GEMM kernels re-pack the weight operand into their blocked layout on
every such call, so a step costs well above the time of reading the weights once.
:class:`PackedLinears` packs each weight once and, while :meth:`PackedLinears.active` is
entered, runs the layers' few-row inputs on the packed copy: fp32 through MKL's packed sgemm
(``torch.ops.mkl._mkl_reorder_linear_weight`` / ``_mkl_linear``), bf16 through oneDNN
(``torch.ops.mkldnn._reorder_linear_weight`` / ``_linear_pointwise``). Measured on the
SmolLM2-135M shape (one thread, an AMD EPYC, ``benchmarks/packed_linears.py``): a step's linears
at 4 rows take 47 instead of 69 ms in fp32 and 27 instead of 39 ms in bf16; at 8 rows 57
instead of 93 and 27 instead of 42.

Invariants:

- The same arithmetic in the same dtype: bf16 results equal ``F.linear``'s bit for bit; fp32
  results differ only by summation order (max abs difference ~4e-5 on outputs of size ~25).
- Only the inputs a packed weight was made for take it: in fp32 those of exactly the call's row
  count (one decode step), in bf16 those of 1-256 rows. Other inputs (a long prompt's prefill)
  and every call with autograd recording run ``F.linear``.
- A pack is never stale: a weight with a change notice since it was packed
  (:mod:`~llm_marl.policies.weight_changes`: an optimizer step, a load, a broadcast, a refreshed
  bf16 copy) or whose ``_version`` or storage changed is packed again before use.
- Memory: a pack takes about its weight's size. Packs of weights that did not change since the
  previous call and do not require grad (a LoRA team's frozen base) are kept for the next call;
  all others are dropped when the call ends, so a full model's training peak is unchanged.
- It applies where it can: ``torch.nn.Linear`` layers on the CPU in fp32 or bf16, at least
  :data:`MIN_SIDE` wide on both sides (not a LoRA adapter's rank-r matrices), a torch built with
  MKL (fp32) or oneDNN (bf16) on a CPU whose oneDNN bf16 kernels run (bf16;
  :func:`llm_marl.cpu.bf16_support`: elsewhere bf16 layers run unpacked, with one line saying
  why), calls of 2+ rows (fp32) and of :data:`MIN_STEPS` new tokens or more (packing costs a few
  steps' saving). GPT-2's ``Conv1D`` layers are not ``nn.Linear`` and are left as they are.
- A call whose packing fails leaves the model as it was (no layer keeps a packed ``forward``)
  and raises the packing's own error.
"""

from __future__ import annotations

import ctypes
import weakref
from contextlib import contextmanager
from typing import Any, Iterator, NamedTuple

import torch
import torch.nn.functional as F

from llm_marl import cpu
from llm_marl.policies.weight_changes import last_change

__all__ = ["MIN_SIDE", "MIN_STEPS", "PackedLinears", "packed_linears"]

MIN_SIDE = 64
"""Linear layers narrower than this on either side are not packed (no gain, e.g. LoRA's A/B)."""

MIN_STEPS = 12
"""Sampling calls with fewer new tokens than this are not packed (the packing would not pay)."""


def _has(namespace: str, op: str) -> bool:
    try:
        return hasattr(getattr(torch.ops, namespace), op)
    except (AttributeError, RuntimeError):  # pragma: no cover - a torch built without it
        return False


class Kernel(NamedTuple):
    """How one dtype's weights are packed and run."""

    available: bool
    """Whether this torch has the kernel (the CPU may still refuse it: :func:`runs_here`)."""
    pack: Any
    """``pack(weight, rows) -> packed``."""
    run: Any
    """``run(x, packed, weight, bias, rows) -> F.linear(x, weight, bias)``."""
    rows: Any
    """``rows(input_rows, call_rows) -> bool``: whether an input takes the packed weight."""
    min_call_rows: int
    """Calls of fewer rows are not packed."""
    per_call_rows: bool
    """Whether a pack serves only the row count it was made for (else it is reused for any)."""


def _mkl_pack(weight: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), rows)


def _mkl_run(x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor, bias: Any, rows: int) -> torch.Tensor:
    return torch.ops.mkl._mkl_linear(x, packed, weight, bias, rows)


def _onednn_pack(weight: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), rows)


def _onednn_run(x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor, bias: Any, rows: int) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


KERNELS = {
    # MKL's packed sgemm serves exactly the row count it was packed for (any other falls back).
    torch.float32: Kernel(_has("mkl", "_mkl_linear") and torch.backends.mkl.is_available(), _mkl_pack, _mkl_run,
                          lambda rows, call_rows: rows == call_rows, 2, True),
    torch.bfloat16: Kernel(_has("mkldnn", "_linear_pointwise") and torch.backends.mkldnn.is_available(), _onednn_pack,
                           _onednn_run, lambda rows, call_rows: 1 <= rows <= 256, 1, False),
}
"""Per weight dtype, the packed kernel (see the module docstring)."""


def runs_here(dtype: torch.dtype) -> bool:
    """Whether ``dtype``'s packed kernel runs in this process: this torch has it and, for bf16,
    the CPU runs oneDNN's bf16 kernels (:func:`llm_marl.cpu.bf16_support`, asked at every call
    so that tests can fake its answer; where it says no, the first bf16 layer met says so once)."""
    kernel = KERNELS.get(dtype)
    if kernel is None or not kernel.available:
        return False
    if dtype == torch.bfloat16 and not cpu.bf16_support().runs:
        cpu.warn_bf16_fallback("a model runs")
        return False
    return True


def return_freed_memory() -> None:
    """Hand freed heap memory back to the OS (glibc's ``malloc_trim``; elsewhere nothing).

    Packs dropped at every sampling call are large blocks that glibc's allocator, having raised
    its mmap threshold, keeps in the heap: without this a full model's resident memory grew by
    about a pack's size per call (SmolLM2-135M, four sampling calls and updates: peak 3.0 GB
    without packing, 3.9 GB and growing with it, 3.4-3.5 GB with the trim)."""
    global _TRIM
    if _TRIM is None:
        try:
            _TRIM = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _TRIM = False
    if _TRIM:
        _TRIM(0)


_TRIM: Any = None


def packed_linear(x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor, bias: Any, rows: int) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` on ``packed``, the weight packed for calls of ``rows`` rows."""
    return KERNELS[weight.dtype].run(x, packed, weight, bias, rows)


class PackedLinears:
    """The packable ``torch.nn.Linear`` layers of one model and their packs (module docstring)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._packs: dict[int, tuple[tuple[int, int, int, int], torch.Tensor]] = {}
        self._stamps: dict[int, tuple[int, int, int, int]] = {}
        self._changed: set[int] = set()
        self.packed_last = 0
        """Layers the last :meth:`active` call packed (again); 0 when it did not apply."""

    def layers(self) -> list[torch.nn.Linear]:
        """The packable layers (see the module docstring)."""
        return [
            m
            for m in self.model.modules()
            if isinstance(m, torch.nn.Linear)
            and min(m.in_features, m.out_features) >= MIN_SIDE
            and m.weight.device.type == "cpu"
            and runs_here(m.weight.dtype)
        ]

    @contextmanager
    def active(self, rows: int, new_tokens: int) -> Iterator[None]:
        """Within the block, the packable layers' inputs run on weights packed for a sampling
        call of ``rows`` rows and ``new_tokens`` steps (those the module docstring says)."""
        self.packed_last = 0
        if new_tokens < MIN_STEPS:
            yield
            return
        swapped = []
        try:
            for layer in self.layers():
                if rows < KERNELS[layer.weight.dtype].min_call_rows:
                    continue
                forward = _packed_forward(layer, self._pack(layer, rows), rows)  # may raise: nothing swapped yet
                swapped.append((layer, "forward" in layer.__dict__, layer.__dict__.get("forward")))
                layer.forward = forward
            yield
        finally:
            dropped = 0
            for layer, had_own, own in swapped:
                if had_own:
                    layer.forward = own
                else:
                    layer.__dict__.pop("forward", None)
                if layer.weight.requires_grad or id(layer) in self._changed:
                    dropped += self._packs.pop(id(layer), None) is not None
            self._changed.clear()
            if dropped:
                return_freed_memory()

    def _pack(self, layer: torch.nn.Linear, rows: int) -> torch.Tensor:
        weight = layer.weight
        stamp = (last_change(weight), weight._version, weight.data_ptr(), rows if KERNELS[weight.dtype].per_call_rows else 0)
        held = self._packs.get(id(layer))
        if held is not None and held[0] == stamp:
            return held[1]
        if self._stamps.get(id(layer), stamp)[:3] != stamp[:3]:
            self._changed.add(id(layer))  # it changes between calls: not worth holding
        packed = KERNELS[weight.dtype].pack(weight, rows)
        self._packs[id(layer)] = (stamp, packed)
        self._stamps[id(layer)] = stamp
        self.packed_last += 1
        return packed

    def held_weights(self) -> int:
        """Layers whose packs are held between calls."""
        return len(self._packs)


def _packed_forward(layer: torch.nn.Linear, packed: torch.Tensor, call_rows: int) -> Any:
    weight, bias = layer.weight, layer.bias
    takes = KERNELS[weight.dtype].rows

    def forward(x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.numel() else 0
        if not takes(rows, call_rows) or x.dtype != weight.dtype or (torch.is_grad_enabled() and weight.requires_grad):
            return F.linear(x, weight, bias)
        return packed_linear(x, packed, weight, bias, call_rows)

    return forward


_BY_MODEL: "weakref.WeakKeyDictionary[torch.nn.Module, PackedLinears]" = weakref.WeakKeyDictionary()


def packed_linears(model: torch.nn.Module) -> PackedLinears:
    """The :class:`PackedLinears` of ``model`` (one per model, made on first use)."""
    held = _BY_MODEL.get(model)
    if held is None:
        held = _BY_MODEL[model] = PackedLinears(model)
    return held

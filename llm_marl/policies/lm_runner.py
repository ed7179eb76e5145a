"""The seam between a causal language model and the units that sample from it and score it.

:class:`ModelRunner` is everything :mod:`~llm_marl.policies.sampling` and
:mod:`~llm_marl.policies.scoring` need from a model: one ``forward(inputs, routes)`` call and a
few facts read once from the model (whether ``forward`` takes ``position_ids`` and
``logits_to_keep``, the name of its cache keyword, its context length, its device).

``routes`` names, per batch row, what the row runs through. A plain model has one route and
ignores it (``None``); a team of adapters on one base (:class:`~llm_marl.policies.LoRATeam`)
plugs in its own runner whose rows each carry their agent's adapter, so one forward serves
several agents. Another generation backend plugs in the same way.
"""

from __future__ import annotations

import inspect
from typing import Any, Sequence

import torch

from llm_marl.policies.weight_changes import epoch, last_change, weights_changed, weights_epoch

__all__ = ["LowPrecisionShadow", "ModelRunner", "context_length", "dense_head_inputs", "model_name"]


def model_name(model: Any) -> str:
    """The model's ``name_or_path`` (or its class name)."""
    name = getattr(model, "name_or_path", None) or getattr(getattr(model, "config", None), "_name_or_path", None)
    return str(name) if name else type(model).__name__


def context_length(model: Any) -> int | None:
    """The model's context length from its config, or None when it declares none."""
    config = getattr(model, "config", None)
    for attribute in ("n_positions", "max_position_embeddings", "n_ctx", "seq_length"):
        value = getattr(config, attribute, None)
        if isinstance(value, int) and value > 1:
            return value
    return None


def _fresh_strides(shape: torch.Size) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def _dense_input(module: Any, args: tuple) -> tuple | None:
    x = args[0] if args else None
    if not isinstance(x, torch.Tensor) or x.dim() < 3 or x.stride() == _fresh_strides(x.shape):
        return None
    return (x.contiguous().view(x.shape), *args[1:])


def dense_head_inputs(model: Any) -> bool:
    """Give ``model``'s output embedding (the lm head) its input with the strides of a fresh
    tensor. Returns whether the hook is in place (once per module; a deep copy carries it).

    ``logits_to_keep`` makes HF slice the hidden states (``h[:, -k:, :]``), and torch's CPU
    matmul runs a 3-D input whose strides are not a fresh tensor's (a slice of several rows, or
    even one row of a longer sequence, whose batch stride is the whole sequence's) as a batched
    product with the weight expanded and copied per batch row. Measured (``benchmarks/
    lm_head_input.py``, SmolLM2's head, 49,152 x 576, one thread): in bf16 one prompt's last
    position took 148 ms instead of 8, eight prompts' 1.18 s instead of 9 ms; in fp32 eight
    prompts' 66 instead of 28 ms. It bites where the head runs ``F.linear`` on such a slice:
    scoring's prompt pass (a team's scoring forward on a bf16 base: 0.66 s instead of 0.40), and
    sampling's prefill without packed weights (with them, bf16 prefills already ran at full speed).
    The values are the same (a copy of the same numbers)."""
    try:
        head = model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return False
    if not isinstance(head, torch.nn.Module):
        return False
    if not getattr(head, "_llm_marl_dense_input", False):
        head.register_forward_pre_hook(_dense_input)
        head._llm_marl_dense_input = True
    return True


def _forward_parameters(model: Any) -> Any:
    """The parameters of the forward that does the work: a peft wrapper's own ``forward`` takes
    ``**kwargs`` and passes them on, so the wrapped model's signature is the one that counts."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return inspect.signature(inner.forward).parameters


class ModelRunner:
    """Runs a causal LM for the sampling and scoring units (see the module docstring)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        forward = _forward_parameters(model)
        self.takes_position_ids = "position_ids" in forward
        self.takes_logits_to_keep = "logits_to_keep" in forward
        # transformers renamed past_key_values to cache (5.x); outputs carry the same name.
        self.cache_keyword = "cache" if "cache" in forward else "past_key_values"
        self.context_length = context_length(model)
        dense_head_inputs(model)

    @property
    def device(self) -> torch.device:
        try:
            return next(self.model.parameters()).device
        except StopIteration:  # pragma: no cover - a model without parameters
            return torch.device("cpu")

    def forward(self, inputs: dict[str, Any], routes: Sequence[str] | None = None) -> Any:
        """``model(**inputs)``; a plain model has a single route, so ``routes`` is ignored."""
        return self.model(**inputs)

    def left_pad(self, prompts: Sequence[Sequence[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(input_ids, attention_mask)`` of left-padded prompts, on the model's device."""
        width = max(len(ids) for ids in prompts)
        input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, ids in enumerate(prompts):
            if ids:
                input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
                attention_mask[row, width - len(ids) :] = 1
        device = self.device
        return input_ids.to(device), attention_mask.to(device)

    def run_prompts(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, routes: Sequence[str] | None = None
    ) -> tuple[torch.Tensor, Any]:
        """One pass over left-padded prompts: the logits at their last position and the KV cache
        (None where the model returns none)."""
        inputs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask, "use_cache": True}
        if self.takes_position_ids:
            inputs["position_ids"] = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        if self.takes_logits_to_keep:
            inputs["logits_to_keep"] = 1
        out = self.forward(inputs, routes)
        try:
            cache = out[self.cache_keyword]
        except KeyError:  # no cache returned (e.g. gradient checkpointing in train mode)
            cache = None
        if cache is not None and _cached_length(cache) not in (None, input_ids.shape[1]):
            # Gradient checkpointing in train mode under no_grad: HF returns a cache that holds
            # none of the prompt; answers run on it would be scored without their prompt.
            cache = None
        return out.logits[:, -1], cache


def _cached_length(cache: Any) -> int | None:
    """The positions a KV cache holds (None where it cannot say)."""
    length = getattr(cache, "get_seq_length", None)
    return int(length()) if callable(length) else None


class LowPrecisionShadow:
    """A copy of a model with its floating-point parameters in ``dtype``, for sampling only.

    Built once by ``copy.deepcopy`` with every parameter replaced by a ``dtype`` copy (tied
    weights stay tied; buffers keep their dtype), in eval mode, without gradients. :meth:`current`
    refreshes it before use: a parameter is copied again when a change notice covers it since
    the last refresh (:mod:`~llm_marl.policies.weight_changes`: every optimizer step, load and
    broadcast gives one; a fused AdamW step bumps no ``_version``), or when its ``_version``
    counter or its storage (``.data =``) moved; a change in the set of parameters or their
    device rebuilds it. Parameters already in ``dtype`` are shared, not
    copied. Memory: the parameters' element count at ``dtype``'s size (half the fp32 weights for
    bfloat16). ``make_runner`` builds the :class:`ModelRunner` of the copy (again on rebuild).
    A ``forward`` replaced on a source module's instance (e.g. a timing wrapper) is not carried
    over: it would call the source module; the copy runs its class's ``forward``.
    """

    def __init__(self, model: Any, dtype: torch.dtype, make_runner: Any = None) -> None:
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"a sampling dtype must be a floating-point torch dtype, got {dtype!r}")
        self.source = model
        self.dtype = dtype
        self.make_runner = make_runner or ModelRunner
        self.rebuilds = 0
        self.refreshed = 0
        """Parameters copied again by the last :meth:`current` call."""
        self._build()

    def _build(self) -> None:
        with torch.inference_mode(False):  # normal tensors, refreshable in place from anywhere
            self._build_copy()

    def _build_copy(self) -> None:
        import copy

        memo: dict[int, Any] = {}
        pairs = []
        for parameter in self.source.parameters():
            value = parameter.detach()
            if value.is_floating_point():  # others (e.g. quantised integers) are shared as they are
                value = value.to(self.dtype)
            twin = torch.nn.Parameter(value, requires_grad=False)
            memo[id(parameter)] = twin
            pairs.append((parameter, twin))
        self.model = copy.deepcopy(self.source, memo)
        for module in self.model.modules():
            # A forward set on a source module's instance (a timer, a hook) is a function deepcopy
            # shares, not copies: it would run the source's weights. The copy uses its class's.
            own = module.__dict__.get("forward")
            if own is not None and getattr(own, "__self__", None) is not module:
                del module.__dict__["forward"]
        self.model.eval()
        self._pairs = pairs
        self._ids = [id(p) for p, _ in pairs]
        self._stamps = [self._stamp(p) for p, _ in pairs]
        self._epoch = epoch()
        self.weights = weights_epoch(self.source.parameters())
        """The version of the weights the copy holds (the samplers' records carry it)."""
        self.runner = self.make_runner(self.model)
        self.rebuilds += 1

    @staticmethod
    def _stamp(parameter: torch.Tensor) -> tuple[int, int]:
        return parameter._version, parameter.data_ptr()

    def current(self) -> ModelRunner:
        """The copy's runner, its parameters equal (in ``dtype``) to the source's right now."""
        parameters = list(self.source.parameters())
        if [id(p) for p in parameters] != self._ids or any(
            p.device != twin.device for p, twin in self._pairs[:1] + self._pairs[-1:]
        ):
            self._build()
            self.refreshed = len(self._pairs)
            return self.runner
        seen, self._epoch = self._epoch, epoch()
        refreshed, copied = 0, []
        with torch.no_grad():
            for index, (parameter, twin) in enumerate(self._pairs):
                stamp = self._stamp(parameter)
                if stamp != self._stamps[index] or last_change(parameter) > seen:
                    if twin.data_ptr() != parameter.data_ptr():
                        twin.copy_(parameter.detach())
                        copied.append(twin)
                    self._stamps[index] = stamp
                    refreshed += 1
        self.refreshed = refreshed
        self.weights = weights_epoch(p for p, _ in self._pairs)
        if copied:
            weights_changed(copied)  # packs made of the copy's weights are stale now
        return self.runner

    def nbytes(self) -> int:
        """Bytes the copy's parameters add (those not shared with the source)."""
        return sum(t.numel() * t.element_size() for p, t in self._pairs if t.data_ptr() != p.data_ptr())

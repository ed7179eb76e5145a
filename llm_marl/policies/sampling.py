"""Sampling from a causal LM: the KV-cached decode loop, its cache handling and the token draws.

:func:`decode` answers every prompt ``num_samples`` times in one batched loop: each prompt runs
through the model once (:func:`prefill`), its KV cache is repeated ``num_samples`` times into
buffers with room for every new token (:func:`repeat_with_room`), then one forward per new
token serves all rows, and :func:`draw` picks each row's token. The model is reached only
through a :class:`~llm_marl.policies.lm_runner.ModelRunner`, and each prompt may carry a route
(the adapter of its agent, for a team on one base): its rows keep it for the whole loop.

:func:`draw` samples by inverse CDF from ``softmax(logits / temperature)`` after top-k then top-p
truncation (top-p keeps the most likely tokens up to and including the one that makes their
mass reach ``top_p``), with one ``torch.rand`` uniform per row (the global RNG).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from llm_marl import threads
from llm_marl.policies.lm_runner import ModelRunner
from llm_marl.runs import progress

__all__ = ["DrawSettings", "decode", "draw", "prefill", "repeat_with_room"]


@dataclass(frozen=True)
class DrawSettings:
    """How one token is drawn from a row's logits."""

    temperature: float
    """Logits are divided by this before the softmax."""
    top_k: int | None
    """Keep the ``top_k`` most likely tokens (None or 0: all)."""
    top_p: float | None
    """Then keep the smallest set whose mass reaches ``top_p`` (None or 1: all)."""
    eos_token_ids: tuple[int, ...]
    """The tokens banned while ``ban_eos`` (before ``min_new_tokens``)."""


def draw(logits: torch.Tensor, settings: DrawSettings, ban_eos: bool = False, uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row from ``softmax(logits / temperature)``, truncated to the ``top_k`` most
    likely tokens and then to the smallest set whose mass reaches ``top_p``. ``uniforms``: each
    row's uniform in [0, 1), shape ``[rows, 1]`` (e.g. from a request's own seeded generator,
    :mod:`llm_marl.serve.batch`); None draws them from the global RNG."""
    logits = logits.float() / settings.temperature
    if ban_eos:
        logits[:, list(settings.eos_token_ids)] = -math.inf
    vocab = logits.shape[-1]
    if settings.top_k and settings.top_k < vocab:
        kth = logits.topk(settings.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    probs = torch.softmax(logits, dim=-1)
    order = None
    if settings.top_p is not None and settings.top_p < 1.0:
        probs, order = probs.sort(dim=-1, descending=True)
        mass_before = probs.cumsum(dim=-1) - probs
        probs = probs.masked_fill(mass_before >= settings.top_p, 0.0)
    cdf = probs.cumsum(dim=-1)
    if uniforms is None:
        uniforms = torch.rand((cdf.shape[0], 1), device=cdf.device)
    threshold = uniforms.to(cdf.device) * cdf[:, -1:]
    token = torch.searchsorted(cdf, threshold, right=True).clamp_(max=vocab - 1)
    if order is not None:
        token = order.gather(-1, token)
    return token.squeeze(-1)


def repeat_with_room(cache: Any, repeats: int, extra: int) -> bool:
    """Repeat every row of a ``DynamicCache`` ``repeats`` times (each row's copies adjacent, as
    ``batch_repeat_interleave`` does) into buffers with room for ``extra`` more positions, one
    layer at a time. Returns False, touching nothing, for other cache types (sliding windows,
    quantised, static): the caller repeats those its own way.

    A plain ``DynamicCache`` concatenates every new key/value onto the whole cache, copying it once
    per generated token; with room reserved a step writes one position, and the layer's tensors
    are views of the filled part. Repeating straight into the new buffer means the repeated cache
    never exists twice.
    """
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:  # pragma: no cover - transformers without layered caches
        return False
    layers = list(getattr(cache, "layers", ()))
    if not layers or not all(
        type(layer) is DynamicLayer and getattr(layer, "is_initialized", False) and layer.keys.dim() == 4
        for layer in layers
    ):
        return False
    for layer in layers:
        rooms = []
        for name in ("keys", "values"):
            old = getattr(layer, name)
            rows, heads, filled, width = old.shape
            room = old.new_empty(rows * repeats, heads, filled + extra, width)
            room.view(rows, repeats, heads, filled + extra, width)[:, :, :, :filled] = old.unsqueeze(1)
            setattr(layer, name, room[:, :, :filled])
            rooms.append(room)
        layer.update = _in_place_update(layer, *rooms, DynamicLayer.update)
    return True


def _in_place_update(layer: Any, key_room: torch.Tensor, value_room: torch.Tensor, concatenate: Any) -> Any:
    def update(key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        start = layer.keys.shape[-2]
        stop = start + key_states.shape[-2]
        if stop > key_room.shape[-2]:  # past the reservation: concatenate as DynamicLayer does
            return concatenate(layer, key_states, value_states, *args, **kwargs)
        key_room[:, :, start:stop] = key_states
        value_room[:, :, start:stop] = value_states
        layer.keys, layer.values = key_room[:, :, :stop], value_room[:, :, :stop]
        return layer.keys, layer.values

    return update


def _repeat_routes(routes: Sequence[str] | None, repeats: int) -> list[str] | None:
    return None if routes is None else [route for route in routes for _ in range(repeats)]


def prefill(
    runner: ModelRunner,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    num_samples: int,
    room: int,
    routes: Sequence[str] | None = None,
) -> tuple[torch.Tensor, Any]:
    """Next-token logits and KV cache of every prompt, each repeated ``num_samples`` times (with
    ``room`` positions reserved where the cache allows it)."""
    logits, cache = runner.run_prompts(input_ids, attention_mask, routes)
    if repeat_with_room(cache, num_samples, room) or num_samples == 1:
        return logits.repeat_interleave(num_samples, dim=0), cache
    if not hasattr(cache, "batch_repeat_interleave"):
        # A cache type that cannot be repeated: run each prompt num_samples times instead.
        return runner.run_prompts(
            input_ids.repeat_interleave(num_samples, dim=0),
            attention_mask.repeat_interleave(num_samples, dim=0),
            _repeat_routes(routes, num_samples),
        )
    cache.batch_repeat_interleave(num_samples)
    return logits.repeat_interleave(num_samples, dim=0), cache


def decode(
    runner: ModelRunner,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    num_samples: int,
    *,
    max_new_tokens: int,
    min_new_tokens: int,
    room: int,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    draw_token: Callable[..., torch.Tensor],
    routes: Sequence[str] | None = None,
    on_step: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
) -> list[list[int]]:
    """The KV-cached sampling loop over left-padded prompts; returns ``num_samples`` rows of drawn
    token ids per prompt (prompt by prompt, its rows adjacent), padded with ``pad_token_id``
    after a row's eos. ``draw_token(logits, ban_eos=...)`` picks each step's tokens; ``routes``
    gives each prompt's route, kept by its rows; ``on_step(logits, token)``, if given, sees each
    step's logits and drawn tokens (e.g. to record the sampler's own log-probs)."""
    logits, cache = prefill(runner, input_ids, attention_mask, num_samples, room, routes)
    row_routes = _repeat_routes(routes, num_samples)
    rows = input_ids.shape[0] * num_samples
    attention_mask = attention_mask.repeat_interleave(num_samples, dim=0)
    position = attention_mask.sum(-1, keepdim=True)  # the next token's position id
    eos = torch.tensor(list(eos_token_ids), device=input_ids.device)
    finished = torch.zeros(rows, dtype=torch.bool, device=input_ids.device)
    drawn = []
    for step in range(max_new_tokens):
        threads.tick()  # torch's thread count follows the CPUs other work leaves free (llm_marl.threads)
        token = draw_token(logits, ban_eos=step < min_new_tokens)
        if on_step is not None:
            on_step(logits, token)
        if progress._LISTENERS:  # an evaluation's bar follows the tokens
            progress.decode_step(step + 1, max_new_tokens)
        token = token.masked_fill(finished, pad_token_id)
        drawn.append(token)
        finished |= torch.isin(token, eos)
        if step + 1 == max_new_tokens or bool(finished.all()):
            break
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones((rows, 1))], dim=1)
        inputs: dict[str, Any] = {
            "input_ids": token.unsqueeze(-1),
            "attention_mask": attention_mask,
            runner.cache_keyword: cache,
            "use_cache": True,
        }
        if runner.takes_position_ids:
            inputs["position_ids"] = position
        out = runner.forward(inputs, row_routes)
        cache, logits = out[runner.cache_keyword], out.logits[:, -1]
        position = position + 1
    return torch.stack(drawn, dim=1).tolist()

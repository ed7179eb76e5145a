"""Scoring answers under a causal LM: per-token log-probabilities, differentiable.

:func:`token_log_probs` recomputes, with the model's current weights, the log-probability of
every answer token (the eos included, padding excluded) in as few padded forward passes as the
row and token caps allow (:func:`chunks`). A batch is ``[left padding | prompt | answer | right
padding]``: prompts are left-padded to a common width ``P`` (as in sampling), answers start at
column ``P`` and are right-padded; ``position_ids = cumsum(attention_mask) - 1`` (0 on padding),
so a token's score is the one the sampler saw. Logits are computed only for the answer columns
(``logits_to_keep`` where the model supports it) and a chosen token's log-prob is
``logit[chosen] - logsumexp(logits)``: no full log-softmax tensor, no loop over tokens.

With ``prompts_once``, answers that share a prompt (and a route) share one pass over it: the
prompt's KV cache, with gradients, is selected for each of its answers and a second pass runs
the answers on it (:func:`answer_logits_shared`). The model is reached only through a
:class:`~llm_marl.policies.lm_runner.ModelRunner`; ``routes`` gives each row's route (its agent's
adapter, for a team on one base), so one pass may score several agents.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from llm_marl.policies.lm_runner import ModelRunner

__all__ = ["answer_logits", "answer_logits_shared", "chunks", "score", "token_log_probs"]


def chunks(
    prompts: Sequence[Sequence[int]],
    answers: Sequence[Sequence[int]],
    max_batch_size: int | None,
    max_batch_tokens: int | None,
) -> list[range]:
    """Consecutive rows per forward pass, within ``max_batch_size`` rows and ``max_batch_tokens``
    padded tokens (a single row is always allowed)."""
    found: list[range] = []
    start, width_p, width_a = 0, 0, 0
    for row in range(len(prompts)):
        new_p = max(width_p, len(prompts[row]))
        new_a = max(width_a, len(answers[row]))
        rows = row - start + 1
        too_many = max_batch_size is not None and rows > max_batch_size
        too_big = max_batch_tokens is not None and rows * (new_p + new_a) > max_batch_tokens
        if rows > 1 and (too_many or too_big):
            found.append(range(start, row))
            start, new_p, new_a = row, len(prompts[row]), len(answers[row])
        width_p, width_a = new_p, new_a
    if start < len(prompts):
        found.append(range(start, len(prompts)))
    return found


def token_log_probs(
    runner: ModelRunner,
    prompts: Sequence[Sequence[int]],
    answers: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    temperature: float,
    prompts_once: bool = True,
    max_batch_size: int | None = None,
    max_batch_tokens: int | None = None,
    routes: Sequence[str] | None = None,
    entropy_out: list[torch.Tensor] | None = None,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs ``(values, mask)``, both ``[rows, max_answer_tokens]``; logits are
    divided by ``temperature``; values are 0 where ``mask`` is False. ``entropy_out``: a list
    that gets one ``[rows, max_answer_tokens]`` tensor, the entropy of the (tempered) next-token
    distribution at each answer token, from the same logits (0 where ``mask`` is False;
    differentiable only with ``entropy_grad``)."""
    width = max((len(a) for a in answers), default=0)
    values, masks, entropies = [], [], []
    for rows in chunks(prompts, answers, max_batch_size, max_batch_tokens):
        v, m = score(
            runner,
            [prompts[i] for i in rows],
            [answers[i] for i in rows],
            pad_token_id=pad_token_id,
            temperature=temperature,
            prompts_once=prompts_once,
            routes=None if routes is None else [routes[i] for i in rows],
            entropy_out=entropies if entropy_out is not None else None,
            entropy_grad=entropy_grad,
        )
        pad = width - v.shape[1]
        values.append(torch.nn.functional.pad(v, (0, pad)))
        masks.append(torch.nn.functional.pad(m, (0, pad)))
        if entropy_out is not None:
            entropies[-1] = torch.nn.functional.pad(entropies[-1], (0, pad))
    if not values:
        device = runner.device
        if entropy_out is not None:
            entropy_out.append(torch.zeros((0, 0), device=device))
        return torch.zeros((0, 0), device=device), torch.zeros((0, 0), dtype=torch.bool, device=device)
    if entropy_out is not None:
        entropy_out.append(torch.cat(entropies))
    return torch.cat(values), torch.cat(masks)


def score(
    runner: ModelRunner,
    prompts: Sequence[Sequence[int]],
    answers: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    temperature: float,
    prompts_once: bool = True,
    routes: Sequence[str] | None = None,
    entropy_out: list[torch.Tensor] | None = None,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs ``(values, mask)`` of one forward chunk (``entropy_out``: see
    :func:`token_log_probs`)."""
    device = runner.device
    lengths = torch.tensor([len(a) for a in answers], device=device)
    width_a = int(lengths.max()) if answers else 0
    if width_a == 0:
        shape = (len(answers), 0)
        if entropy_out is not None:
            entropy_out.append(torch.zeros(shape, device=device))
        return torch.zeros(shape, device=device), torch.zeros(shape, dtype=torch.bool, device=device)
    targets = torch.full((len(answers), width_a), pad_token_id, dtype=torch.long)
    for row, answer in enumerate(answers):
        targets[row, : len(answer)] = torch.tensor(list(answer), dtype=torch.long)
    targets = targets.to(device)
    mask = torch.arange(width_a, device=device).unsqueeze(0) < lengths.unsqueeze(1)
    keys = [(tuple(p), None if routes is None else routes[row]) for row, p in enumerate(prompts)]
    distinct: dict[tuple[Any, ...], int] = {}
    owner = [distinct.setdefault(key, len(distinct)) for key in keys]
    logits = None
    if prompts_once and len(distinct) < len(prompts):
        logits = answer_logits_shared(
            runner,
            [list(p) for p, _ in distinct],
            owner,
            targets,
            mask,
            pad_token_id=pad_token_id,
            routes=None if routes is None else [route for _, route in distinct],
            row_routes=routes,
        )
    if logits is None:  # nothing shared, or a cache that cannot be indexed by row
        logits = answer_logits(runner, prompts, targets, mask, pad_token_id=pad_token_id, routes=routes)
    logits = logits.float() / temperature
    chosen = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    normalizer = torch.logsumexp(logits, dim=-1)
    values = chosen - normalizer
    values = torch.where(mask, values, torch.zeros_like(values))
    if entropy_out is not None:
        entropy_out.append(token_entropy(logits, normalizer, mask, entropy_grad))
    return values, mask


def token_entropy(logits: torch.Tensor, normalizer: torch.Tensor, mask: torch.Tensor, grad: bool = False) -> torch.Tensor:
    """Entropy of each position's next-token distribution ``softmax(logits)``:
    ``logsumexp(logits) - sum(p * logits)``, from the scoring pass's logits and their
    ``normalizer`` (the logsumexp); 0 where ``mask`` is False. Without ``grad``, detached."""
    with torch.enable_grad() if grad else torch.no_grad():
        entropy = normalizer - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)
    return torch.where(mask, entropy, torch.zeros_like(entropy))


def answer_logits(
    runner: ModelRunner,
    prompts: Sequence[Sequence[int]],
    targets: torch.Tensor,
    mask: torch.Tensor,
    *,
    pad_token_id: int,
    routes: Sequence[str] | None = None,
) -> torch.Tensor:
    """``[rows, width_a, vocab]`` logits predicting each answer token (``targets``, right-padded,
    real where ``mask``), one forward pass over ``[left padding | prompt | answer | right padding]``."""
    prompt_ids, prompt_mask = runner.left_pad(prompts, pad_token_id)
    input_ids = torch.cat([prompt_ids, targets], dim=1)
    attention_mask = torch.cat([prompt_mask, mask.long()], dim=1)
    inputs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask, "use_cache": False}
    if runner.takes_position_ids:
        # As generate does for left padding: positions count real tokens only.
        inputs["position_ids"] = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    width_a = targets.shape[1]
    if runner.takes_logits_to_keep:
        inputs["logits_to_keep"] = width_a + 1
    logits = runner.forward(inputs, routes).logits
    # Column width_p - 1 + t predicts answer token t: the last width_a + 1 columns minus one.
    return logits[:, -(width_a + 1) : -1]


def answer_logits_shared(
    runner: ModelRunner,
    distinct: Sequence[Sequence[int]],
    owner: Sequence[int],
    targets: torch.Tensor,
    mask: torch.Tensor,
    *,
    pad_token_id: int,
    routes: Sequence[str] | None = None,
    row_routes: Sequence[str] | None = None,
) -> torch.Tensor | None:
    """As :func:`answer_logits`, but each distinct prompt runs through the model once (with its
    route ``routes[i]``): its KV cache (with gradients) is selected for every row ``r`` whose
    prompt is ``distinct[owner[r]]``, and a second pass runs the answers on it (with
    ``row_routes``). None when the model's cache cannot be indexed by row."""
    prompt_ids, prompt_mask = runner.left_pad(distinct, pad_token_id)
    last, cache = runner.run_prompts(prompt_ids, prompt_mask, routes)
    if not hasattr(cache, "batch_select_indices"):
        return None
    index = torch.tensor(list(owner), device=prompt_ids.device)
    first = last[index].unsqueeze(1)  # predicts answer token 0
    if targets.shape[1] == 1:
        return first
    cache.batch_select_indices(index)
    # Answer tokens 0 .. width_a - 2 predict tokens 1 .. width_a - 1.
    attention_mask = torch.cat([prompt_mask[index], mask[:, 1:].long()], dim=1)
    inputs = {
        "input_ids": targets[:, :-1],
        "attention_mask": attention_mask,
        runner.cache_keyword: cache,
        "use_cache": True,
    }
    if runner.takes_position_ids:
        # The one-pass path's positions: real tokens counted, right padding repeats the answer's
        # last position. (Numbering padding on past the answer's end runs past the context for a
        # prompt near the limit batched with longer answers: IndexError in position embeddings.)
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        inputs["position_ids"] = positions[:, prompt_mask.shape[1] :]
    rest = runner.forward(inputs, row_routes).logits
    return torch.cat([first, rest], dim=1)

"""Algorithm math as small pure functions, registered by name (docs/algorithms.md §2, §3.6-3.7, §6).

Every function works on plain lists or tensors and knows nothing about models or environments,
so each can be checked against numbers computed by hand.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

Baseline = Callable[[torch.Tensor], torch.Tensor]
BASELINES: dict[str, Baseline] = {}


def register_baseline(name: str) -> Callable[[Baseline], Baseline]:
    """Register ``fn(returns[K]) -> advantages[K]`` as advantage mode ``name``."""

    def decorator(fn: Baseline) -> Baseline:
        BASELINES[name] = fn
        return fn

    return decorator


@register_baseline("raw")
def raw_advantages(returns: torch.Tensor) -> torch.Tensor:
    """MAREINFORCE: b = 0."""
    return returns.clone()


@register_baseline("mean")
def mean_advantages(returns: torch.Tensor) -> torch.Tensor:
    """MAGRPO: b = mean of the K returns (sample k included)."""
    return returns - returns.mean()


@register_baseline("rloo")
def rloo_advantages(returns: torch.Tensor) -> torch.Tensor:
    """MARLOO: b_k = mean of the other K-1 returns; equals K/(K-1) x the mean advantages."""
    k = returns.numel()
    return (returns - (returns.sum() - returns) / (k - 1))


@register_baseline("max")
def max_advantages(returns: torch.Tensor) -> torch.Tensor:
    """MAReMax: b = max of the K returns; every advantage is <= 0, the best sample's is 0."""
    return returns - returns.max()


@register_baseline("best")
def best_advantages(returns: torch.Tensor) -> torch.Tensor:
    """Best-of-group imitation (RAFT's reward-ranked fine-tuning, within one group): the n answers
    that earned the group's highest return get 1/n each when that return beats another answer's,
    every other answer 0; a group whose K returns coincide gets 0 everywhere. With
    ``advantage_normalization`` off, one group's update is the log-likelihood gradient of its best
    answer; with it on, the centred and scaled version (the others pushed down)."""
    best = returns == returns.max()
    if bool(best.all()):
        return torch.zeros_like(returns)
    return best.to(returns.dtype) / best.sum()


def normalize_advantages(advantages: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Centre and divide by the population std (divide by K), the denominator floored at ``eps``."""
    centred = advantages - advantages.mean()
    std = advantages.std(correction=0) if advantages.numel() > 1 else advantages.new_zeros(())
    return centred / torch.clamp(std, min=eps)


def group_advantages(
    returns: Sequence[float] | torch.Tensor, mode: str = "mean", normalize: bool = True, eps: float = 1e-6
) -> list[float] | torch.Tensor:
    """K returns of one group (one node, one agent) in, K advantages out.

    Returns a tensor for a tensor input, else a list of floats. Raises ValueError for an unknown
    mode, fewer than 2 returns (a single return is accepted in mode "raw" without
    normalization: plain REINFORCE at K = 1), or a non-finite return.
    """
    if mode not in BASELINES:
        raise ValueError(f"advantage mode must be one of {sorted(BASELINES)}, got {mode!r}")
    values = returns if isinstance(returns, torch.Tensor) else torch.tensor(list(returns), dtype=torch.float64)
    if not values.is_floating_point():  # integer returns: the baselines and the std need floats
        values = values.to(torch.float64)
    if values.dim() != 1 or values.numel() < (1 if mode == "raw" and not normalize else 2):
        raise ValueError(f"a group needs at least 2 returns (K >= 2; 1 for raw returns without normalization), got shape {tuple(values.shape)}")
    if not torch.isfinite(values).all():
        raise ValueError(f"returns must be finite, got {values.tolist()}")
    advantages = BASELINES[mode](values)
    if normalize:
        advantages = normalize_advantages(advantages, eps)
    return advantages if isinstance(returns, torch.Tensor) else advantages.tolist()


def aggregate_children(child_returns: Sequence[float], how: str = "mean", temperature: float = 1.0) -> float:
    """What an inner node's branch takes from its children's returns (docs/algorithms.md §3.9):
    their ``"mean"``; their ``"max"`` (optimistic credit: the best continuation the partners
    found); or ``"softmax"``, the soft maximum ``t * log(mean(exp(G / t)))`` with temperature
    ``t`` (between the mean, t -> inf, and the max, t -> 0)."""
    values = [float(v) for v in child_returns]
    if how == "mean":
        return sum(values) / len(values)
    if how == "max":
        return max(values)
    if how == "softmax":
        top = max(values)
        return top + temperature * math.log(sum(math.exp((v - top) / temperature) for v in values) / len(values))
    raise ValueError(f"tree_return_aggregation must be one of 'mean', 'max', 'softmax'; got {how!r}")


def discounted_return(
    reward: float, child_returns: Sequence[float] | None, discount: float, how: str = "mean", temperature: float = 1.0
) -> float:
    """G = r at a leaf; G = r + gamma * agg(child returns) at an inner node (docs/algorithms.md §3.6),
    agg the mean unless ``how`` says otherwise (:func:`aggregate_children`)."""
    if not child_returns:
        return float(reward)
    return float(reward) + discount * aggregate_children(child_returns, how, temperature)


def should_stop(rewards: Sequence[float], threshold: float | None) -> bool:
    """Early termination: stop after this turn when ``threshold`` is set and the mean of the
    turn's (unshaped) rewards is strictly above it."""
    return threshold is not None and sum(rewards) / len(rewards) > threshold


CROSS_AGGREGATORS: dict[str, Callable[[list[float]], float]] = {
    "sum": lambda values: float(sum(values)),
    "mean": lambda values: float(sum(values) / len(values)),
    "max": lambda values: float(max(values)),
}


def agent_returns(
    joint: Sequence[Sequence[int]], returns: Sequence[float], position: int, num_answers: int, how: str = "sum"
) -> list[float]:
    """Per-answer returns of the agent at ``position`` (docs/algorithms.md §3.7).

    Answer k gets the ``how`` ("sum", "mean", "max") of the returns of every joint action that
    contains it. In aligned mode each answer is in exactly one joint action, so it gets that
    return whatever ``how`` is.
    """
    if how not in CROSS_AGGREGATORS:
        raise ValueError(f"cross_aggregation must be one of {sorted(CROSS_AGGREGATORS)}, got {how!r}")
    groups: list[list[float]] = [[] for _ in range(num_answers)]
    for combo, value in zip(joint, returns):
        groups[combo[position]].append(value)
    missing = [k for k, group in enumerate(groups) if not group]
    if missing:
        raise ValueError(f"answers {missing} of agent position {position} appear in no joint action")
    return [CROSS_AGGREGATORS[how](group) for group in groups]


def k3_kl(policy_logps: torch.Tensor, reference_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-answer KL estimate: sum over tokens of exp(r - p) - (r - p) - 1, with r, p the
    reference and policy token log-probs; masked tokens count 0. A model against itself gives 0.
    """
    delta = (reference_logps - policy_logps).masked_fill(~mask, 0.0)
    return ((torch.exp(delta) - delta - 1.0) * mask).sum(dim=-1)


def sample_losses(log_probs: torch.Tensor, advantages: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
    """Per-sample losses mean_k(-A_k log pi(answer_k)) from flat per-answer tensors.

    ``sizes[i]`` is sample i's number of answers; returns a tensor of ``len(sizes)`` losses.
    """
    weighted = -(advantages.detach().to(log_probs.dtype) * log_probs)
    return torch.stack([chunk.mean() for chunk in weighted.split(list(sizes))])


def answer_entropies(entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-answer mean entropy per token from ``[answers, tokens]`` token entropies and their
    mask (an answer without tokens: 0)."""
    mask = mask.to(entropy.dtype)
    return (entropy * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)


def zero_advantage(advantages: Sequence[float]) -> bool:
    """Whether a group carries no signal: every one of its advantages is exactly 0 (a group
    baseline over K equal returns)."""
    return all(a == 0 for a in advantages)


def policy_gradient_loss(log_probs: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """Mean over samples of mean over their K answers of -A_k log pi(answer_k) (docs/algorithms.md §4).

    ``log_probs`` and ``advantages`` have shape [samples, K].
    """
    return -(advantages.detach().to(log_probs.dtype) * log_probs).mean()

"""The preference learners' math as small pure functions (docs/preference.md).

Nothing here knows about models or environments: pair selection works on a list of candidate
rewards, the losses on tensors of sequence log-probabilities or scores, so each can be checked
against numbers computed by hand.
"""

from __future__ import annotations

import math
import random
from typing import Sequence

import torch
import torch.nn.functional as F

PAIR_SELECTIONS = ("reward_gap", "all", "random")


def candidate_pairs(rewards: Sequence[float]) -> list[tuple[float, int, int]]:
    """Every ordered pair of candidates with a strictly higher reward for the first:
    ``(gap, winner, loser)`` with ``gap = rewards[winner] - rewards[loser] > 0``, in
    (winner, loser) order. Ties make no pair."""
    values = [float(r) for r in rewards]
    for k, value in enumerate(values):
        if not math.isfinite(value):
            raise ValueError(f"candidate {k}: reward is {value}, not a finite number")
    return [
        (values[i] - values[j], i, j)
        for i in range(len(values))
        for j in range(len(values))
        if i != j and values[i] > values[j]
    ]


def select_pairs(
    rewards: Sequence[float], mode: str = "reward_gap", limit: int | None = None, rng: random.Random | None = None
) -> list[tuple[int, int]]:
    """``(winner, loser)`` candidate indices for one dataset item.

    Args:
        rewards: the shared reward of each candidate joint answer.
        mode: ``"reward_gap"``: the pairs with the largest gaps first (equal gaps in (winner,
            loser) order); ``"all"``: every pair in (winner, loser) order, ``limit`` must be None;
            ``"random"``: a uniformly random order drawn from ``rng``.
        limit: keep at most this many pairs (``preference_pairs_per_sample``); None keeps all.
        rng: the random source of ``"random"`` (required there).
    """
    if mode not in PAIR_SELECTIONS:
        raise ValueError(f"pair_selection must be one of {', '.join(map(repr, PAIR_SELECTIONS))}; got {mode!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"preference_pairs_per_sample must be None or an int >= 1, got {limit!r}")
    if mode == "all" and limit is not None:
        raise ValueError("preference_pairs_per_sample must be None when pair_selection='all'")
    pairs = candidate_pairs(rewards)
    if mode == "reward_gap":
        pairs.sort(key=lambda p: -p[0])  # stable: equal gaps keep (winner, loser) order
    elif mode == "random":
        if rng is None:
            raise ValueError("pair_selection='random' needs an rng")
        rng.shuffle(pairs)
    if limit is not None:
        pairs = pairs[:limit]
    return [(i, j) for _, i, j in pairs]


def dpo_margins(
    chosen: torch.Tensor, rejected: torch.Tensor, ref_chosen: torch.Tensor | None, ref_rejected: torch.Tensor | None
) -> torch.Tensor:
    """Per-agent DPO log-ratio margins Δ = (log π(w) − log π_ref(w)) − (log π(l) − log π_ref(l)).

    All inputs have the same shape (e.g. ``[agents, pairs]``); ``ref_*`` None gives the
    reference-free margin log π(w) − log π(l).
    """
    margin = chosen - rejected
    if ref_chosen is not None and ref_rejected is not None:
        margin = margin - (ref_chosen.to(margin) - ref_rejected.to(margin))
    return margin


def joint_dpo_losses(margins: torch.Tensor, beta: float) -> torch.Tensor:
    """Per-pair joint DPO losses −log σ(β · Σ_i Δ_i) from margins of shape ``[agents, pairs]``.

    The loss depends on the agents only through the sum of their margins, so the gradient in
    agent i's parameters is −σ(−βΣΔ)·β·∇Δ_i: it flows only through agent i's own log-probs.
    """
    if margins.dim() != 2:
        raise ValueError(f"margins must have shape [agents, pairs], got {tuple(margins.shape)}")
    return -F.logsigmoid(beta * margins.sum(dim=0))


def bradley_terry_losses(chosen_scores: torch.Tensor, rejected_scores: torch.Tensor) -> torch.Tensor:
    """Per-pair Bradley–Terry losses −log σ(s(w) − s(l)) of a reward model's scalar scores."""
    if chosen_scores.shape != rejected_scores.shape:
        raise ValueError(f"{tuple(chosen_scores.shape)} chosen scores but {tuple(rejected_scores.shape)} rejected")
    return -F.logsigmoid(chosen_scores - rejected_scores)


def pair_accuracy(chosen_scores: Sequence[float], rejected_scores: Sequence[float]) -> float:
    """Fraction of pairs whose winner scores strictly higher (ties count half)."""
    if len(chosen_scores) != len(rejected_scores):
        raise ValueError(f"{len(chosen_scores)} chosen scores but {len(rejected_scores)} rejected")
    if not chosen_scores:
        return math.nan
    hits = sum(1.0 if c > r else 0.5 if c == r else 0.0 for c, r in zip(chosen_scores, rejected_scores))
    return hits / len(chosen_scores)


def net_preferences(num_candidates: int, pairs: Sequence[tuple[int, int]]) -> list[float]:
    """Per candidate: (times chosen − times rejected) / number of pairs; all 0 without pairs."""
    counts = [0.0] * num_candidates
    for winner, loser in pairs:
        counts[winner] += 1.0
        counts[loser] -= 1.0
    return [c / len(pairs) for c in counts] if pairs else counts


def select_comparison_pairs(
    current: Sequence[float], comparator: Sequence[float], mode: str = "comparator_reward", limit: int | None = None,
    rng: random.Random | None = None,
) -> list[tuple[tuple[str, int], tuple[str, int]]]:
    """The iterative learners' pairs: current candidate k against comparator candidate k.

    Each k < min(len(current), len(comparator)) whose rewards differ gives one pair
    ``((source, k), (source, k))``, winner first, sources ``"current"`` / ``"comparator"``.
    Order: ``"comparator_reward"``: highest comparator reward first, then largest gap;
    ``"reward_gap"``: largest gap first; ``"all"``: by k (``limit`` must be None); ``"random"``:
    drawn from ``rng``. Then at most ``limit`` pairs.
    """
    modes = PAIR_SELECTIONS + ("comparator_reward",)
    if mode not in modes:
        raise ValueError(f"pair_selection must be one of {', '.join(map(repr, modes))}; got {mode!r}")
    if mode == "all" and limit is not None:
        raise ValueError("preference_pairs_per_sample must be None when pair_selection='all'")
    found = []
    for k in range(min(len(current), len(comparator))):
        mine, theirs = float(current[k]), float(comparator[k])
        if not (math.isfinite(mine) and math.isfinite(theirs)):
            raise ValueError(f"candidate {k}: rewards {mine}, {theirs} are not both finite numbers")
        if mine != theirs:
            first, second = (("current", k), ("comparator", k)) if mine > theirs else (("comparator", k), ("current", k))
            found.append((abs(mine - theirs), theirs, k, first, second))
    if mode == "comparator_reward":
        found.sort(key=lambda p: (-p[1], -p[0]))
    elif mode == "reward_gap":
        found.sort(key=lambda p: -p[0])
    elif mode == "random":
        if rng is None:
            raise ValueError("pair_selection='random' needs an rng")
        rng.shuffle(found)
    if limit is not None:
        found = found[:limit]
    return [(w, l) for _, _, _, w, l in found]


REPLAY_MODES = ("current", "nearest_k", "all_history", "lambda_decay")


def lambda_decay_weights(count: int, lam: float) -> list[float]:
    """Replay weights of ``count`` rounds, oldest first: proportional to (1 − λ)·λ^age (age 0 the
    newest), normalized to sum 1; λ = 1 weighs every round equally."""
    if count < 1:
        return []
    if lam == 1.0:
        return [1.0 / count] * count
    newest_first = [(1.0 - lam) * lam**age for age in range(count)]
    total = sum(newest_first)
    if total <= 0:
        newest_first, total = [1.0] + [0.0] * (count - 1), 1.0
    return [w / total for w in reversed(newest_first)]


def replay_sample(sizes: Sequence[int], sample_size: int, rng: random.Random, weights: Sequence[float] | None = None) -> list[tuple[int, int]]:
    """``sample_size`` (round, pair) indices from rounds of ``sizes`` pairs: each draw picks a
    non-empty round with probability ∝ its weight (1 each by default); within a round, pairs are
    taken without replacement while they last, then with replacement. Returned shuffled."""
    eligible = [r for r, n in enumerate(sizes) if n > 0]
    if sample_size <= 0 or not eligible:
        return []
    chosen_weights = [float(weights[r]) if weights is not None else 1.0 for r in eligible]
    counts = {r: 0 for r in eligible}
    for r in rng.choices(eligible, weights=chosen_weights, k=sample_size):
        counts[r] += 1
    picked = []
    for r, count in counts.items():
        if count <= sizes[r]:
            picked += [(r, i) for i in rng.sample(range(sizes[r]), count)]
        else:
            picked += [(r, i) for i in range(sizes[r])] + [(r, rng.randrange(sizes[r])) for _ in range(count - sizes[r])]
    rng.shuffle(picked)
    return picked

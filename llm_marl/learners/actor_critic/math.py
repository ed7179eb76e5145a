"""Actor-critic math as small pure functions (docs/actor_critic.md §3-§4).

Notation: r̃ the shaped reward of one answer, V_old the critic's value at rollout time, y the
one-step TD target, A the advantage, γ the discount, β the reference-KL coefficient, c_v the
value-loss coefficient, ε the value-clip range. Every function works on plain lists or tensors
and knows nothing about models or environments, so each is checked against numbers computed by
hand (tests/test_actor_critic_math.py).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch


def shaped_rewards(rewards: Sequence[float], kl: Sequence[float] | None, coef: float) -> list[float]:
    """r̃ = R − β·KL per answer; without a KL (``kl`` None or empty) r̃ = R."""
    if not kl:
        return [float(r) for r in rewards]
    if len(kl) != len(rewards):
        raise ValueError(f"{len(rewards)} rewards but {len(kl)} KL values")
    return [float(r) - coef * float(d) for r, d in zip(rewards, kl)]


def td_target(reward: float, next_value: float | None, discount: float) -> float:
    """One-step TD target y = r̃ + γ·V_old(h') ; y = r̃ at the end of an episode (``next_value``
    None: the last turn, an early stop or an env termination — never bootstrapped)."""
    if next_value is None:
        return float(reward)
    return float(reward) + discount * float(next_value)


def td_targets(rewards: Sequence[float], values: Sequence[float], discount: float) -> list[float]:
    """Targets of one episode of T turns: y_t = r̃_t + γ·V_old(h_{t+1}) for t < T−1, y_{T−1} = r̃_{T−1}.

    ``values[t]`` is V_old(h_t) of the same agent (MAAC: the joint value of that agent).
    """
    if len(rewards) != len(values):
        raise ValueError(f"{len(rewards)} rewards but {len(values)} values")
    last = len(rewards) - 1
    return [td_target(r, values[t + 1] if t < last else None, discount) for t, r in enumerate(rewards)]


def logged_returns(rewards: Sequence[float], child_returns: Sequence[Sequence[float] | None]) -> list[float]:
    """The logged returns of one node's answers: r̃_k + mean of the child's returns of answer k
    (the same agent's), or r̃_k where answer k has no child — undiscounted and shaped, so on a
    chain (G = 1) return_t = Σ_{t'≥t} r̃_{t'} (docs/actor_critic.md §5). No loss uses them."""
    if len(child_returns) != len(rewards):
        raise ValueError(f"{len(rewards)} rewards but {len(child_returns)} children")
    return [float(r) + (sum(after) / len(after) if after else 0.0) for r, after in zip(rewards, child_returns)]


def advantages(targets: Sequence[float], baselines: Sequence[float]) -> list[float]:
    """A = y − b, where b is V_old(h) (critic_type "v") — never an action value (docs/actor_critic.md §3; docs/actor_critic_learners.md, Q7)."""
    if len(targets) != len(baselines):
        raise ValueError(f"{len(targets)} targets but {len(baselines)} baselines")
    return [float(y) - float(b) for y, b in zip(targets, baselines)]


def whiten(values: Sequence[float] | torch.Tensor, eps: float = 1e-6) -> list[float]:
    """(A − mean A) / max(std_pop A, eps) over one update group; a group of one is left as is."""
    x = values if isinstance(values, torch.Tensor) else torch.tensor([float(v) for v in values], dtype=torch.float64)
    if x.numel() < 2:
        return [float(v) for v in x.tolist()]
    if not torch.isfinite(x).all():
        raise FloatingPointError(f"advantages must be finite to be normalized, got {x.tolist()}")
    centred = x - x.mean()
    return (centred / torch.clamp(x.std(correction=0), min=eps)).tolist()


def value_errors(
    values: torch.Tensor, old_values: torch.Tensor, targets: torch.Tensor, clip_range: float | None
) -> torch.Tensor:
    """Per-sample squared errors e = (y − V)², or with ``clip_range`` ε the PPO-style
    e = max((y − V)², (y − V_clip)²) with V_clip = V_old + clip(V − V_old, −ε, ε)."""
    targets = targets.to(values.dtype)
    errors = (targets - values) ** 2
    if clip_range is None:
        return errors
    old_values = old_values.to(values.dtype)
    clipped = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
    return torch.maximum(errors, (targets - clipped) ** 2)


def check_finite(values: Sequence[float], what: str) -> None:
    """Raise FloatingPointError naming ``what`` and the first non-finite entry."""
    for k, v in enumerate(values):
        if not math.isfinite(v):
            raise FloatingPointError(f"{what}: entry {k} is {v}")

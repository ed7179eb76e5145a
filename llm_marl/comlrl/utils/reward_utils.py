"""CoMLRL's ``comlrl.utils.reward_utils``: calling a reward function the way CoMLRL does, and a
reward function's declared range."""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Mapping, Sequence, TypeVar

R = TypeVar("R", bound=Callable[..., Any])


def resolve_reward_range(reward_func: Callable[..., Any]) -> tuple[float, float] | None:
    """``reward_func.reward_range`` as ``(minimum, maximum)``, or None when it declares none.

    Raises:
        ValueError: the range is not two finite numbers with minimum < maximum.
    """
    declared = getattr(reward_func, "reward_range", None)
    if declared is None:
        return None
    if isinstance(declared, (str, bytes)) or not isinstance(declared, Sequence) or len(declared) != 2:
        raise ValueError(f"reward_func.reward_range must be (minimum, maximum), got {declared!r}")
    low, high = float(declared[0]), float(declared[1])
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError(f"reward_func.reward_range must be finite, got {declared!r}")
    if low >= high:
        raise ValueError(f"reward_func.reward_range minimum {low} must be less than its maximum {high}")
    return low, high


def set_reward_range(reward_func: R, minimum: float, maximum: float) -> R:
    """Declare ``reward_func``'s raw output range (checked) and return it."""
    reward_func.reward_range = (float(minimum), float(maximum))  # type: ignore[attr-defined]
    resolve_reward_range(reward_func)
    return reward_func


def _floats(raw: Any) -> list[float]:
    if hasattr(raw, "detach"):
        raw = raw.detach().cpu().tolist()
    values = list(raw) if isinstance(raw, (list, tuple)) else [raw]
    return [float(v) for v in values]


def _call_without_signature(reward_func: Callable[..., Any], completions: list[Any], num_agents: int,
                            batch_items: Sequence[Mapping[str, Any]] | None) -> Any:
    """Try, as CoMLRL does, ``f(*completions, batch_items=...)``, then ``f(*completions)``, then (several
    agents) ``f(completions)``: each ``TypeError`` moves to the next form, the last one's is raised."""
    attempts: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    if batch_items is not None:
        attempts.append((tuple(completions), {"batch_items": batch_items}))
    attempts.append((tuple(completions), {}))
    if num_agents > 1:
        attempts.append(((completions,), {}))
    for args, keywords in attempts[:-1]:
        try:
            return reward_func(*args, **keywords)
        except TypeError:
            pass
    args, keywords = attempts[-1]
    return reward_func(*args, **keywords)


def call_reward_function(
    reward_func: Callable[..., Any],
    prompts: Sequence[str],
    agent_completions: Sequence[Sequence[str]],
    *,
    num_agents: int,
    batch_items: Sequence[Mapping[str, Any]] | None = None,
    signature: inspect.Signature | None = None,
) -> list[float]:
    """Call ``reward_func`` as its signature asks and return its rewards as floats.

    Completions go positionally, one list per agent (``*args`` functions too); a function with
    one positional parameter more (``batch_items`` not counted) takes ``prompts`` first; one with a single parameter (and
    several agents) takes the list of lists. ``batch_items=`` and ``prompts=`` are passed as
    keywords where the function names them or takes ``**kwargs``. Without a readable
    signature, the completions go positionally (with ``batch_items=``, then without), then as one list.
    """
    if signature is None:
        try:
            signature = inspect.signature(reward_func)
        except (TypeError, ValueError):
            signature = None
    completions = list(agent_completions)
    if signature is None:
        return _floats(_call_without_signature(reward_func, completions, num_agents, batch_items))
    params = list(signature.parameters.values())
    # batch_items is passed by keyword, so it is not counted as a positional slot
    # (CoMLRL counts them, and then calls f(prompts, a, b, batch_items=...) for f(a, b, batch_items=None))
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "batch_items"]
    varargs = any(p.kind == p.VAR_POSITIONAL for p in params)
    varkw = any(p.kind == p.VAR_KEYWORD for p in params)
    names = signature.parameters
    with_prompts = False
    if varargs:
        call = completions
    elif num_agents == 1:
        with_prompts = len(positional) != 1
        call = [prompts, completions[0]] if with_prompts else [completions[0]]
    elif len(positional) == num_agents + 1:
        call, with_prompts = [prompts, *completions], True
    elif len(positional) == 1:
        call = [completions]
    else:
        call = completions
    keywords: dict[str, Any] = {}
    if batch_items is not None and ("batch_items" in names or varkw):
        keywords["batch_items"] = batch_items
    if not with_prompts and ("prompts" in names or varkw):
        keywords["prompts"] = prompts
    try:
        return _floats(reward_func(*call, **keywords))
    except TypeError as first:
        try:
            return _floats(reward_func(*completions))
        except TypeError:
            raise first from None


def normalize_reward_lengths(rewards: Sequence[float], *, num_agents: int, num_generations: int, algorithm: str) -> list[float]:
    """Rewards of one prompt as a list: one value repeated for every agent, or as given when
    there is one per agent or one per generation.

    Raises:
        ValueError: any other count (several agents), or num_generations < 1.
    """
    values = [float(r) for r in rewards]
    if num_agents == 1:
        return values
    if num_generations < 1:
        raise ValueError(f"num_generations must be >= 1, got {num_generations}")
    if len(values) == 1:
        return values * num_agents
    if len(values) in (num_agents, num_generations):
        return values
    raise ValueError(f"{algorithm}: the reward function returned {len(values)} values; expected 1 or {num_agents} (one per agent) per prompt")


__all__ = ["call_reward_function", "normalize_reward_lengths", "resolve_reward_range", "set_reward_range"]

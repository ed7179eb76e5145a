"""CoMLRL's ``comlrl.utils.formatters``: one prompt formatter per agent from what a script passes."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping, Sequence

Formatter = Callable[..., str]


def _takes_external_prompts(fn: Callable[..., Any]) -> bool:
    try:
        return "external_prompts" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _uniform(fn: Formatter, pass_none: bool) -> Formatter:
    """``fn`` callable as ``f(item, external_prompts=None)``; ``external_prompts`` reaches it
    only if it names that parameter (and, with ``pass_none`` False, only when not None)."""
    if not _takes_external_prompts(fn):
        return lambda item, external_prompts=None: fn(item)
    if pass_none:
        return lambda item, external_prompts=None: fn(item, external_prompts=external_prompts)
    return lambda item, external_prompts=None: fn(item) if external_prompts is None else fn(item, external_prompts=external_prompts)


def build_formatters(
    formatters: Formatter | Sequence[Formatter] | None, num_agents: int, *, pass_none_external_prompts: bool = True
) -> list[Formatter]:
    """``num_agents`` formatters ``f(item, external_prompts=None) -> str``.

    Args:
        formatters: None (each agent's prompt is ``item["prompt"]``, or the external prompt
            when one is given), one callable for every agent, or one per agent.
        num_agents: how many agents.
        pass_none_external_prompts: pass ``external_prompts=None`` to formatters that take it
            (True), or call them without it at the first turn (False).
    """
    if formatters is None:

        def default(item: Mapping[str, Any], external_prompts: str | None = None) -> str:
            return external_prompts if external_prompts is not None else item.get("prompt", "")

        return [default] * num_agents
    if callable(formatters):
        return [_uniform(formatters, pass_none_external_prompts) for _ in range(num_agents)]
    if isinstance(formatters, Sequence) and not isinstance(formatters, (str, bytes)):
        if len(formatters) != num_agents:
            raise ValueError(f"{len(formatters)} formatters for {num_agents} agents: pass one per agent, or one for all")
        return [_uniform(f, pass_none_external_prompts) for f in formatters]
    raise ValueError(f"formatters must be None, a callable or a sequence of callables, got {type(formatters).__name__}")


__all__ = ["build_formatters"]

"""Environment ids: ``make("ClimbingGame-v0")`` builds a ready :class:`DialogueEnv`.

Ids follow Gymnasium's ``Name-vN`` convention; a version changes whenever the task's dynamics or
rewards change. Every id registered here is also registered with PettingZoo's own registry
(``pettingzoo.make("parallel", id)``) when the installed PettingZoo has one.
"""

from __future__ import annotations

from typing import Any, Callable

from pettingzoo import ParallelEnv

_REGISTRY: dict[str, Callable[..., ParallelEnv]] = {}


def register(env_id: str, factory: Callable[..., ParallelEnv], *, override: bool = False) -> None:
    """Register ``factory(**kwargs) -> ParallelEnv`` under ``env_id``."""
    if env_id in _REGISTRY and not override:
        raise ValueError(f"environment id {env_id!r} is already registered (pass override=True to replace it)")
    _REGISTRY[env_id] = factory
    try:
        import pettingzoo

        if hasattr(pettingzoo, "parallel_registry"):
            if env_id in pettingzoo.parallel_registry:
                del pettingzoo.parallel_registry[env_id]
            pettingzoo.register("parallel", env_id, entry_point=factory)
    except ImportError:  # pragma: no cover - PettingZoo is a dependency
        pass


def make(env_id: str, **kwargs: Any) -> ParallelEnv:
    """Build the environment registered as ``env_id``; ``kwargs`` go to its factory."""
    if env_id not in _REGISTRY:
        raise KeyError(f"unknown environment id {env_id!r}; registered: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[env_id](**kwargs)


def registered_ids() -> list[str]:
    """All registered ids, sorted."""
    return sorted(_REGISTRY)


def _matrix_factory(game: Callable[..., Any], repeated: bool) -> Callable[..., ParallelEnv]:
    def factory(*, split: str = "train", render_mode: str | None = None, num_turns: int | None = None, **kwargs):
        from llm_marl.envs.dialogue import DialogueEnv

        turns = num_turns if num_turns is not None else (3 if repeated else 1)
        return DialogueEnv(game(num_turns=turns, **kwargs), split=split, render_mode=render_mode)

    return factory


def _register_builtin() -> None:
    from llm_marl.tasks import matrix

    for name, game in (
        ("ClimbingGame", matrix.climbing_game),
        ("PenaltyGame", matrix.penalty_game),
        ("CoordinationGame", matrix.coordination_game),
    ):
        register(f"{name}-v0", _matrix_factory(game, repeated=False))
        register(f"Repeated{name}-v0", _matrix_factory(game, repeated=True))

    from llm_marl.tasks.writing import register_envs as register_writing

    register_writing()

    from llm_marl.tasks.code import register_envs as register_code

    register_code()


_register_builtin()

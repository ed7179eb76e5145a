"""Environment ids: ``make("ClimbingGame-v0")`` builds a ready :class:`DialogueEnv`.

Ids follow Gymnasium's ``Name-vN`` convention; a version changes whenever the task's dynamics or
rewards change. As in Gymnasium, an id maps to an *entry point*, a callable or a
``"package.module:attribute"`` string that is imported only when the id is made, plus default
keyword arguments. The shipped ids are declared in one table, :data:`SHIPPED`, so importing the
registry imports no task, and no task imports the registry.

What an entry point builds:

- a :class:`~llm_marl.tasks.CooperativeTask` (a task class, or any callable registered with
  ``task=True``): ``make(id, split=..., render_mode=..., **kwargs)`` builds
  ``DialogueEnv(entry_point(**kwargs), split=split, render_mode=render_mode)``; PettingZoo's
  ``max_cycles`` is accepted as an alias of ``num_turns``;
- anything else is an environment factory: ``make(id, **kwargs)`` returns
  ``entry_point(**kwargs)``, a ``pettingzoo.ParallelEnv``.

The id's default keywords are overridden by the caller's; a keyword the caller gives as ``None``
keeps the id's default (``make("RepeatedClimbingGame-v0", num_turns=None)`` plays 3 turns).

Registering your own task is one call, with the task class itself, a factory, or its entry-point
string::

    register("Guess-v0", Guess)                               # a CooperativeTask subclass
    register("Guess-v0", "my_package.guess:Guess")            # the same, imported at make time
    register("Guess-v0", lambda **kw: DialogueEnv(Guess(), **kw))  # an environment factory

Environments from outside the library (this module too; its old name ``llm_marl.envs.plugins``
imports it with a DeprecationWarning). Besides the registered ids, :func:`make` (and so
``llm-marl train --env``) accepts, as Gymnasium does:

- an entry-point string ``"package.module:factory"`` — a task class or an env factory, imported
  when the env is made (the string registers itself as its own id on first use);
- an id declared by an installed package under the ``llm_marl.envs`` entry-point group, e.g. in
  its ``pyproject.toml``::

      [project.entry-points."llm_marl.envs"]
      Guess-v0 = "my_package.guess:Guess"

  Installed ids are registered the first time an unknown id is looked up (and by ``llm-marl
  list``); an id the program registered itself always wins.

A module that calls ``register`` is loaded before lookup with ``llm-marl train --import module``
(or ``import: [module]`` in a YAML config). An id found none of these ways raises
:class:`UnknownEnvError` listing the known ids and these three ways.

Every id is also registered with PettingZoo's own registry (``pettingzoo.make("parallel", id)``)
when the installed PettingZoo has one; it builds the env through :func:`make`.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from pettingzoo import ParallelEnv

from llm_marl.tasks.base import CooperativeTask

__all__ = ["GAMES", "PROGRAMS", "SHIPPED", "EnvSpec", "make", "register", "registered_ids", "resolve", "spec"]


@dataclass(frozen=True)
class EnvSpec:
    """One registered id: what builds it and with which default keywords."""

    id: str
    """The id, ``Name-vN``."""
    entry_point: str | Callable[..., Any]
    """A callable, or ``"package.module:attribute"`` imported when the id is made."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Default keyword arguments of the entry point; the caller's override them."""
    task: bool | None = None
    """True: the entry point builds a task, played through a DialogueEnv; False: it builds the
    env; None: decided at make time (a CooperativeTask subclass is a task, anything else a factory)."""


# The shipped ids: id -> (entry point, default keywords). All build tasks.
SHIPPED: dict[str, tuple[str, dict[str, Any]]] = {
    "ClimbingGame-v0": ("llm_marl.tasks.matrix:climbing_game", {"num_turns": 1}),
    "RepeatedClimbingGame-v0": ("llm_marl.tasks.matrix:climbing_game", {"num_turns": 3}),
    "PenaltyGame-v0": ("llm_marl.tasks.matrix:penalty_game", {"num_turns": 1}),
    "RepeatedPenaltyGame-v0": ("llm_marl.tasks.matrix:penalty_game", {"num_turns": 3}),
    "CoordinationGame-v0": ("llm_marl.tasks.matrix:coordination_game", {"num_turns": 1}),
    "RepeatedCoordinationGame-v0": ("llm_marl.tasks.matrix:coordination_game", {"num_turns": 3}),
    "WritingCollab-v0": ("llm_marl.tasks.writing:WritingCollab", {"num_turns": 1}),
    "WritingCollabMultiTurn-v0": ("llm_marl.tasks.writing:WritingCollab", {"num_turns": 2}),
    "CoopCode-v0": ("llm_marl.tasks.code:CoopCodeTask", {"num_turns": 1}),
    "CoopCodeMultiTurn-v0": ("llm_marl.tasks.code:CoopCodeTask", {"num_turns": 2}),
    "NameMatch-v0": ("llm_marl.tasks.naming:NameMatch", {"num_turns": 1}),
}

# OpenSpiel games (llm_marl/envs/openspiel.py; the optional open-spiel package, extra "games"):
# id -> (env factory, default keywords). They build envs, not tasks.
GAMES: dict[str, tuple[str, dict[str, Any]]] = {
    **{f"TinyHanabi-{g}-v0": ("llm_marl.envs.openspiel:tiny_hanabi", {"game": g}) for g in "ABCDEF"},
    "Hanabi-Small-v0": ("llm_marl.envs.openspiel:hanabi_small", {}),
    "Hanabi-Small-RandomOnIllegal-v0": ("llm_marl.envs.openspiel:hanabi_small", {"on_illegal": "random"}),
    "CoopBoxPushing-v0": ("llm_marl.envs.openspiel:coop_box_pushing", {}),
    "TradeComm-v0": ("llm_marl.envs.openspiel:trade_comm", {}),
    "OpenSpiel-v0": ("llm_marl.envs.openspiel:OpenSpielEnv", {}),
}

# Programs as environments (llm_marl/programs; extra "program"): make("Program-v0",
# program="FILE.py:FUNCTION") builds a ProgramEnv (agents and items from the file, or given).
PROGRAMS: dict[str, tuple[str, dict[str, Any]]] = {
    "Program-v0": ("llm_marl.programs.loading:program_env", {}),
}

_REGISTRY: dict[str, EnvSpec] = {}


def register(
    env_id: str,
    entry_point: str | Callable[..., Any],
    *,
    kwargs: Mapping[str, Any] | None = None,
    task: bool | None = None,
    override: bool = False,
) -> None:
    """Register ``entry_point`` (a callable or a ``"module:attr"`` string) under ``env_id``.

    ``kwargs`` are its default keywords; ``task`` says whether it builds a task (see the module
    documentation; ``None``: a CooperativeTask subclass is a task, anything else a factory).
    """
    if not isinstance(env_id, str) or not env_id:
        raise ValueError(f"environment id must be a non-empty string, got {env_id!r}")
    if isinstance(entry_point, str):
        _split_entry_point(env_id, entry_point)
    elif not callable(entry_point):
        raise TypeError(f"entry point of {env_id!r} must be a callable or a 'module:attr' string, got {entry_point!r}")
    if env_id in _REGISTRY and not override:
        raise ValueError(f"environment id {env_id!r} is already registered (pass override=True to replace it)")
    _REGISTRY[env_id] = EnvSpec(env_id, entry_point, dict(kwargs or {}), task)
    _register_with_pettingzoo(env_id)


def spec(env_id: str) -> EnvSpec:
    """The :class:`EnvSpec` registered as ``env_id``; an unregistered ``"module:attr"`` string or
    an id an installed package declares (``llm_marl.envs`` entry points) is registered first
    (:func:`find`). Unknown ids raise :class:`UnknownEnvError` (a KeyError)."""
    if env_id not in _REGISTRY:
        find(env_id)
    return _REGISTRY[env_id]


def make(env_id: str, **kwargs: Any) -> ParallelEnv:
    """Build the environment registered as ``env_id``; ``kwargs`` go to its entry point (a task's
    ``split`` and ``render_mode`` go to its :class:`DialogueEnv`)."""
    env_spec = spec(env_id)
    entry = resolve(env_spec.entry_point, env_id)
    merged = dict(env_spec.kwargs)
    merged.update({k: v for k, v in kwargs.items() if not (v is None and k in env_spec.kwargs)})
    is_task = env_spec.task if env_spec.task is not None else (
        isinstance(entry, type) and issubclass(entry, CooperativeTask)
    )
    if not is_task:
        env = entry(**merged)
        if isinstance(env, CooperativeTask):
            raise TypeError(
                f"the entry point of {env_id!r} returned a task ({type(env).__name__}), not an env: "
                f"register it with task=True"
            )
        return env
    from llm_marl.envs.dialogue import DialogueEnv

    split = merged.pop("split", "train")
    render_mode = merged.pop("render_mode", None)
    max_cycles = merged.pop("max_cycles", None)
    if max_cycles is not None and kwargs.get("num_turns") is None:
        merged["num_turns"] = max_cycles
    task_obj = entry(**merged)
    if not isinstance(task_obj, CooperativeTask):
        raise TypeError(f"the entry point of {env_id!r} was registered as a task but returned {type(task_obj).__name__}")
    return DialogueEnv(task_obj, split=split, render_mode=render_mode)


def registered_ids() -> list[str]:
    """All registered ids, sorted."""
    return sorted(_REGISTRY)


def resolve(entry_point: str | Callable[..., Any], env_id: str = "?") -> Callable[..., Any]:
    """The callable an entry point names: a callable itself, or ``"module:attr"`` (``attr`` may
    be dotted) imported now."""
    if not isinstance(entry_point, str):
        return entry_point
    module_name, attr = _split_entry_point(env_id, entry_point)
    subject = entry_point if env_id == entry_point else f"{env_id!r} (entry point {entry_point!r})"
    obj: Any = import_here(module_name, subject)
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise AttributeError(f"{subject}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{subject} is not callable: {obj!r}")
    return obj


def import_here(module_name: str, subject: str) -> Any:
    """Import ``module_name`` as ``python -m`` would find it: on the Python path, else in the
    current folder (which a console script such as ``llm-marl`` does not search by itself; once
    a module is found there, the folder stays on the path). A module that is really missing is
    a ``ModuleNotFoundError`` naming it and the folder searched."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if not _is_the_module(exc, module_name):
            raise ImportError(f"{subject}: importing module {module_name!r} failed: {exc}") from exc
        missing = exc
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
        importlib.invalidate_caches()
        try:
            return importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            sys.path.remove(here)
            if not _is_the_module(exc, module_name):
                raise ImportError(f"{subject}: importing module {module_name!r} failed: {exc}") from exc
            missing = exc
        except BaseException:
            sys.path.remove(here)
            raise
    raise ModuleNotFoundError(
        f"{subject}: no module named {missing.name!r} in the current folder {here} or on the Python path",
        name=missing.name,
    )


def _is_the_module(exc: ModuleNotFoundError, module_name: str) -> bool:
    """Whether ``exc`` says ``module_name`` itself (or a package above it) is missing, not a
    module it imports."""
    parts = module_name.split(".")
    return exc.name in {".".join(parts[: i + 1]) for i in range(len(parts))}


def _split_entry_point(env_id: str, entry_point: str) -> tuple[str, str]:
    module_name, sep, attr = entry_point.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"entry point of {env_id!r} must look like 'package.module:attribute', got {entry_point!r}")
    return module_name, attr


def _register_with_pettingzoo(env_id: str) -> None:
    import pettingzoo

    if hasattr(pettingzoo, "parallel_registry"):
        if env_id in pettingzoo.parallel_registry:
            del pettingzoo.parallel_registry[env_id]
        pettingzoo.register("parallel", env_id, entry_point=functools.partial(make, env_id))



# --- environments from outside the library (module docstring) -----------------------------------

ENTRY_POINT_GROUP = "llm_marl.envs"
"""The entry-point group in which installed packages declare env ids."""


class UnknownEnvError(KeyError):
    """An env id that is neither registered, an entry-point string, nor declared by a package."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def load_entry_points() -> list[str]:
    """Register every id of the ``llm_marl.envs`` entry-point group not registered yet; returns them."""
    added = []
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry.name not in _REGISTRY:
            try:
                _register_entry_point(entry.name, entry.value)
            except UnknownEnvError as exc:
                warnings.warn(f"skipping the {ENTRY_POINT_GROUP} entry point {entry.name} of {entry.dist.name if entry.dist else '?'}: {exc}")
                continue
            added.append(entry.name)
    return added


def find(env_id: str) -> None:
    """Make ``env_id`` known if one of the outside ways names it; raise UnknownEnvError otherwise."""
    if env_id in _REGISTRY:
        return
    if ":" in env_id:
        _register_entry_point(env_id, env_id)
        return
    load_entry_points()
    if env_id not in _REGISTRY:
        raise UnknownEnvError(unknown_message(env_id, registered_ids()))


def unknown_message(env_id: str, known: list[str]) -> str:
    """The error for an unknown id: the known ids and the three ways to name a custom env."""
    return (
        f"unknown environment id {env_id!r}; known: {', '.join(known)}. A custom env is named by an entry point "
        "(--env package.module:factory), by importing the module that registers it (--import module), or by "
        f"an installed package's {ENTRY_POINT_GROUP!r} entry points"
    )


def _register_entry_point(env_id: str, value: str) -> None:
    """Register the entry point ``value`` ("module:attr", imported when the env is made) under ``env_id``."""
    try:
        register(env_id, value)
    except ValueError as exc:
        raise UnknownEnvError(f"{exc}") from None


for _env_id, (_entry_point, _defaults) in SHIPPED.items():
    register(_env_id, _entry_point, kwargs=_defaults, task=True)
for _env_id, (_entry_point, _defaults) in {**GAMES, **PROGRAMS}.items():
    register(_env_id, _entry_point, kwargs=_defaults, task=False)

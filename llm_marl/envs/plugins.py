"""Environments from outside the library: entry-point strings and installed packages.

Besides the ids registered with :func:`~llm_marl.envs.register`, :func:`~llm_marl.envs.make`
(and so ``llm-marl train --env``) accepts, as Gymnasium does:

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
"""

from __future__ import annotations

import importlib.metadata
import warnings

ENTRY_POINT_GROUP = "llm_marl.envs"
"""The entry-point group in which installed packages declare env ids."""


class UnknownEnvError(KeyError):
    """An env id that is neither registered, an entry-point string, nor declared by a package."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def load_entry_points() -> list[str]:
    """Register every id of the ``llm_marl.envs`` entry-point group not registered yet; returns them."""
    from llm_marl.envs import registry

    added = []
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry.name not in registry._REGISTRY:
            try:
                _register_entry_point(entry.name, entry.value)
            except UnknownEnvError as exc:
                warnings.warn(f"skipping the {ENTRY_POINT_GROUP} entry point {entry.name} of {entry.dist.name if entry.dist else '?'}: {exc}")
                continue
            added.append(entry.name)
    return added


def find(env_id: str) -> None:
    """Make ``env_id`` known if one of the outside ways names it; raise UnknownEnvError otherwise."""
    from llm_marl.envs import registry

    if env_id in registry._REGISTRY:
        return
    if ":" in env_id:
        _register_entry_point(env_id, env_id)
        return
    load_entry_points()
    if env_id not in registry._REGISTRY:
        raise UnknownEnvError(unknown_message(env_id, registry.registered_ids()))


def unknown_message(env_id: str, known: list[str]) -> str:
    """The error for an unknown id: the known ids and the three ways to name a custom env."""
    return (
        f"unknown environment id {env_id!r}; known: {', '.join(known)}. A custom env is named by an entry point "
        "(--env package.module:factory), by importing the module that registers it (--import module), or by "
        f"an installed package's {ENTRY_POINT_GROUP!r} entry points"
    )


def _register_entry_point(env_id: str, value: str) -> None:
    """Register the entry point ``value`` ("module:attr", imported when the env is made) under ``env_id``."""
    from llm_marl.envs import registry

    try:
        registry.register(env_id, value)
    except ValueError as exc:
        raise UnknownEnvError(f"{exc}") from None

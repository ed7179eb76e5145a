"""Naming a program: ``FILE.py:FUNCTION`` (or ``package.module:function``), its agents and items.

:func:`program_env` is the factory behind the env id ``Program-v0`` and ``llm-marl train
--program``::

    make("Program-v0", program="examples/program_team.py:team")          # agents, items from the file
    program_env("team.py:team", agents=("writer", "editor"), items="items.jsonl", num_turns=2)

Where the arguments are not given, they come from the program's module:

- ``agents``: a module-level ``agents`` tuple of the model names the program calls;
- ``items``: a module-level ``items`` (a list of dicts or a ``datasets.Dataset``); a string is a
  JSON-lines file, one item per line; ``eval_items`` likewise for ``split="eval"``, and the
  train env's :meth:`~llm_marl.programs.ProgramEnv.eval_split` (without it there is no eval
  split: a learner given no ``eval_env`` warns that evaluation is skipped);
- ``num_turns``: a module-level ``num_turns`` (the most steps of calls), else 8.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from llm_marl.programs.env import ProgramEnv


def load_program(spec: str | Callable[..., Any]) -> tuple[Callable[..., Any], Any]:
    """The function ``spec`` names (``FILE.py:FUNCTION`` or ``module:function``) and its module
    (None for a callable given as is)."""
    if callable(spec):
        return spec, sys.modules.get(getattr(spec, "__module__", ""), None)
    source, sep, name = str(spec).rpartition(":")
    if not sep or not source or not name:
        raise ValueError(f"--program {spec}: name a function as FILE.py:FUNCTION or package.module:function")
    if source.endswith(".py"):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"--program {spec}: no file {source} (from {os.getcwd()})")
        folder = str(path.resolve().parent)
        if folder not in sys.path:  # its neighbours import as they would under `python FILE.py`
            sys.path.insert(0, folder)
        module_name = f"llm_marl_program_{path.stem}"
        module = sys.modules.get(module_name)
        if module is None or getattr(module, "__file__", None) != str(path.resolve()):
            loader_spec = importlib.util.spec_from_file_location(module_name, path.resolve())
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[module_name] = module
            try:
                loader_spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[module_name]
                raise
    else:
        from llm_marl.envs.registry import import_here

        module = import_here(source, f"--program {spec}")
    function = getattr(module, name, None)
    if not callable(function):
        raise AttributeError(f"--program {spec}: {source} has no function {name!r}")
    return function, module


def load_items(items: Any, where: str) -> Any:
    """A list of dicts or a ``datasets.Dataset`` as is; a string is read as a JSON-lines file."""
    if isinstance(items, (str, os.PathLike)):
        path = Path(items)
        if not path.is_file():
            raise FileNotFoundError(f"{where}: no items file {path}")
        rows = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{where}: {path} line {number} is not JSON ({exc.msg})") from None
                if not isinstance(row, dict):
                    raise ValueError(f"{where}: {path} line {number} is not a JSON object")
                rows.append(row)
        return rows
    if items is None or not hasattr(items, "__len__") or not hasattr(items, "__getitem__"):
        raise ValueError(f"{where}: items must be a list of dicts, a datasets.Dataset or a .jsonl file, got {type(items).__name__}")
    return items


def program_env(
    program: str | Callable[..., Any],
    agents: Sequence[str] | str | None = None,
    items: Any = None,
    split: str = "train",
    num_turns: int | None = None,
    **options: Any,
) -> ProgramEnv:
    """A :class:`~llm_marl.programs.ProgramEnv` for ``program`` (module docstring); ``options``
    go to it (``timeout_s``, ``on_program_error``, ``error_penalty``, ``render_mode``)."""
    function, module = load_program(program)
    where = f"program {program if isinstance(program, str) else getattr(program, '__name__', program)}"
    if isinstance(agents, str):
        agents = [a.strip() for a in agents.split(",") if a.strip()]
    if agents is None:
        agents = getattr(module, "agents", None)
        if agents is None:
            raise ValueError(f"{where}: no agents: give --agents a,b or a module-level agents tuple")
    if split == "train":
        items = items if items is not None else getattr(module, "items", None)
        if items is None:
            raise ValueError(f"{where}: no items: give --items FILE.jsonl or a module-level items list")
        eval_items = getattr(module, "eval_items", None)
        if eval_items is not None and "eval_items" not in options:
            options["eval_items"] = load_items(eval_items, f"{where} (eval_items)")
    elif split == "eval":
        items = getattr(module, "eval_items", None)
        if items is None:
            raise ValueError(f"{where}: no eval split (a module-level eval_items)")
    else:
        raise ValueError(f"{where}: unknown split {split!r} (train or eval)")
    items = load_items(items, where)
    if num_turns is None:
        num_turns = getattr(module, "num_turns", 8)
    return ProgramEnv(function, tuple(agents), items, num_turns=num_turns, **options)


def program_env_id(program: str, agents: str | None = None, items: str | None = None) -> str:
    """Register ``program`` (with ``--agents``/``--items`` where given) as an env id and return it
    (``llm-marl train --program``); the program is imported when the env is made."""
    import functools

    from llm_marl.envs.registry import register

    source, _, name = program.rpartition(":")
    env_id = f"{Path(source).stem if source.endswith('.py') else source}.{name}"
    kwargs = {"program": program}
    if agents is not None:
        kwargs["agents"] = agents
    if items is not None:
        kwargs["items"] = items
    register(env_id, functools.partial(program_env), kwargs=kwargs, task=False, override=True)
    return env_id

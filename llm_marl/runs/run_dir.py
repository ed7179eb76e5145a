"""Default run directories: where a run with no ``output_dir`` leaves its record.

``llm-marl train`` without ``--output_dir`` and a CoMLRL-style script without ``output_dir``
(CoMLRL's config has no such field) both get ``runs/<name>-<YYYYmmdd-HHMMSS>`` under the
current directory; a name already taken gets ``-2``, ``-3``, ... appended, so two runs started
in the same second never share a folder.
"""

from __future__ import annotations

import os
import re
import time

RUNS_ROOT = "runs"


def default_run_dir(*parts: str, root: str = RUNS_ROOT, stamp: str | None = None) -> str:
    """``root/<parts joined by '-'>-<stamp>``, with characters other than letters, digits,
    ``.``, ``_`` and ``-`` replaced by ``_``; the first of ``...``, ``...-2``, ``...-3`` that
    does not exist yet. ``stamp`` defaults to the local time as ``YYYYmmdd-HHMMSS``."""
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    name = "-".join([_clean(part) for part in parts if part] + [stamp])
    path = os.path.join(root, name)
    suffix = 1
    while os.path.exists(path):
        suffix += 1
        path = os.path.join(root, f"{name}-{suffix}")
    return path


def _clean(part: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(part)).strip("_") or "run"


_FOLDER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
RESERVED_FOLDERS = frozenset({"critic", "reward_model"})
"""Folders a saved run keeps beside its agents' (MAAC's central critic, MARLHF's reward model)."""


def agent_folders(agents: "list[str] | tuple[str, ...]") -> list[str]:
    """The folder of each agent in a saved model (``save_model``, a run's ``final/``): the agent's
    own name (``final/player_1``); ``agent_0 ... agent_{N-1}`` for all of them when a name is not a
    plain folder name (letters, digits, ``_ . -``), is reserved, or two names differ only in case.
    Agents built by the CoMLRL-style constructor are named ``agent_i``, so CoMLRL scripts get the
    ``dir/agent_{i}`` folders CoMLRL writes."""
    names = [str(agent) for agent in agents]
    plain = all(_FOLDER_NAME.fullmatch(name) and name not in RESERVED_FOLDERS for name in names)
    if plain and len({name.lower() for name in names}) == len(names):
        return names
    return [f"agent_{i}" for i in range(len(names))]


def saved_agent_folders(folder: str, agents: "list[str] | tuple[str, ...]") -> "list[str] | None":
    """The per-agent folders of a saved model in ``folder`` for ``agents`` — named as
    :func:`agent_folders` names them, or ``agent_0 ... agent_{N-1}`` (saved before agents' own
    names were used) — or None when ``folder`` holds neither set."""
    for names in (agent_folders(agents), [f"agent_{i}" for i in range(len(agents))]):
        paths = [os.path.join(folder, name) for name in names]
        if all(os.path.isdir(path) for path in paths):
            return paths
    return None

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

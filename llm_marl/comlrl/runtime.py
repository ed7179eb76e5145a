"""CoMLRL's ``comlrl.runtime`` (its main branch, ahead of the 1.4.3 wheel): launch helpers.
Importing this module imports no torch and starts no CUDA."""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path


def configure_job_cuda_cache() -> str | None:
    """Give a Slurm job its own CUDA JIT cache (``CUDA_CACHE_PATH``) before CUDA starts.

    Returns the cache folder, or None where nothing is done: outside Slurm (no
    ``SLURM_JOB_ID`` / ``SLURM_JOBID``) or with ``CUDA_CACHE_DISABLE=1``. An existing
    ``CUDA_CACHE_PATH`` is kept and returned. Otherwise a new private folder (mode 0700) is made
    under ``COMLRL_CUDA_CACHE_ROOT`` (an absolute, existing folder), else ``SLURM_TMPDIR``, else
    ``/tmp``, exported for this process and its children, and printed to stderr.

    Raises:
        ValueError: the job id holds characters other than letters, digits, ``_`` and ``-``,
            or ``COMLRL_CUDA_CACHE_ROOT`` is not absolute.
        RuntimeError: CUDA is already initialized in this process, or the root is not a folder.
    """
    job = os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID")
    if not job or os.environ.get("CUDA_CACHE_DISABLE") == "1":
        return None
    if os.environ.get("CUDA_CACHE_PATH"):
        return os.environ["CUDA_CACHE_PATH"]
    if not re.fullmatch(r"[A-Za-z0-9_-]+", job):
        raise ValueError(f"SLURM_JOB_ID {job!r} may hold only letters, digits, '_' and '-' (it names a folder)")
    torch = sys.modules.get("torch")  # only an already imported torch is asked
    if torch is not None and torch.cuda.is_initialized():
        raise RuntimeError("configure_job_cuda_cache() must run before CUDA is initialized; call it first thing in the launch script")
    chosen = os.environ.get("COMLRL_CUDA_CACHE_ROOT")
    if chosen is not None and not Path(chosen).is_absolute():
        raise ValueError(f"COMLRL_CUDA_CACHE_ROOT must be an absolute folder, got {chosen!r}")
    root = Path(chosen or os.environ.get("SLURM_TMPDIR") or "/tmp")
    if chosen is None and not root.is_dir():
        root = Path("/tmp")
    if not root.is_dir():
        raise RuntimeError(f"the CUDA cache root {root} is not an existing folder; set COMLRL_CUDA_CACHE_ROOT")
    cache = tempfile.mkdtemp(prefix=f"comlrl-cuda-{job}-", dir=str(root))
    os.environ["CUDA_CACHE_PATH"] = cache
    print(f"[runtime] job={job} CUDA_CACHE_PATH={cache}", file=sys.stderr, flush=True)
    return cache


__all__ = ["configure_job_cuda_cache"]

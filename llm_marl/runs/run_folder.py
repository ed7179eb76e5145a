"""Run folders that never mix runs.

A run folder (``output_dir``) belongs to one run. When training starts the trainer claims it:

- **a new run** (no resume) needs an empty or missing folder. A non-empty one is refused with a
  :class:`RunFolderError` naming it and the two ways on: resume the run it holds
  (``train(resume_from_checkpoint=True)``, ``llm-marl train --resume``), or
  ``overwrite_output_dir=True`` (``--overwrite``), which renames the old folder to
  ``OUTPUT_DIR.replaced-YYYYmmdd-HHMMSS`` — nothing is deleted. The run then writes its identity
  to ``run.json``: a run id, the start time and the hash of its config (every field except those
  a resumed run may change, :data:`RESUMABLE_FIELDS`).
- **a resumed run** checks ``run.json`` against its own config and refuses, naming the fields,
  when they differ. Resuming "the newest" checkpoint means the newest checkpoint of the run in
  ``run.json`` (by the time it was written), never the highest step number of any run.

Checkpoints record the run id (``checkpoint.py``); one never replaces a checkpoint of another
run: that one is moved aside with a warning.

The refusal lives in the trainer, not only in the command line, because a Python user loses a
run the same way; a folder made fresh for each run (``llm-marl train`` without ``--output_dir``)
is never refused.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import uuid
import warnings
from typing import Any

RUN_FILE = "run.json"
"""The identity file of a run folder."""

RESUMABLE_FIELDS = frozenset(
    {
        "output_dir",
        "overwrite_output_dir",
        "num_train_epochs",
        "max_steps",
        "save_steps",
        "save_total_limit",
        "save_final_checkpoint",
        "logging_steps",
        "progress_bar",
        "agent_devices",
        "reference_devices",
    }
)
"""Config fields a resumed run may change (how long, how often to save and log, where it runs)."""


class RunFolderError(ValueError):
    """An output folder cannot be used for this run (it holds another run, or its config differs)."""


def identity_config(args: Any) -> dict[str, Any]:
    """The config fields that define a run (JSON values), i.e. all but :data:`RESUMABLE_FIELDS`."""
    fields = json.loads(json.dumps(dataclasses.asdict(args), default=str))
    return {k: v for k, v in sorted(fields.items()) if k not in RESUMABLE_FIELDS}


def config_hash(args: Any) -> str:
    """SHA-256 (hex, first 16 digits) of :func:`identity_config` and the config class name."""
    text = json.dumps({"class": type(args).__name__, "fields": identity_config(args)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_identity(output_dir: str) -> dict[str, Any] | None:
    """The identity in ``output_dir/run.json``, or None when there is none."""
    path = os.path.join(output_dir, RUN_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


OWN_ENTRIES = frozenset({"wandb", "rollouts", "eval_before.json"})
"""Entries a trainer makes in its output_dir before training claims the folder — W&B's run
files (``report_to="wandb"``, made when the trainer is built), the rollouts an evaluation
before training records, and the command's record of that evaluation (``eval_before.json``,
which a resumed run's summary reads) — so alone they do not make a folder "used"."""


def is_empty(output_dir: str) -> bool:
    """True when ``output_dir`` is missing or holds nothing but :data:`OWN_ENTRIES`."""
    return not os.path.isdir(output_dir) or not set(os.listdir(output_dir)) - OWN_ENTRIES


def refusal(output_dir: str) -> str:
    """The message refusing to start a new run in the non-empty ``output_dir``."""
    held = read_identity(output_dir)
    what = f"run {held['run_id']} (started {held['started']})" if held else f"{len(os.listdir(output_dir))} entries"
    return (
        f"output folder {output_dir} is not empty (it holds {what}); a new run would mix with it. "
        "Either resume that run (llm-marl train --resume; train(resume_from_checkpoint=True)) or start "
        "afresh with --overwrite (overwrite_output_dir=True), which moves the old contents aside to "
        f"{output_dir}.replaced-<time> — or choose another --output_dir."
    )


def move_aside(output_dir: str) -> str:
    """Rename ``output_dir`` to a free ``OUTPUT_DIR.replaced-<time>`` sibling; returns the new path."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = f"{os.path.normpath(output_dir)}.replaced-{stamp}"
    target, n = base, 1
    while os.path.exists(target):
        n += 1
        target = f"{base}-{n}"
    os.rename(output_dir, target)
    return target


def new_identity(args: Any, run_id: str | None = None, launch: dict[str, Any] | None = None) -> dict[str, Any]:
    """A fresh identity for ``args`` (a new run id unless one is given). ``launch``: what the
    config does not hold but a run is made of — the env, the policies, the CLI's model and menu."""
    return {
        "run_id": run_id or uuid.uuid4().hex[:12],
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "config_class": type(args).__name__,
        "config_hash": config_hash(args),
        "config": identity_config(args),
        "launch": _jsonable(launch or {}),
    }


def _jsonable(value: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(value, default=str, sort_keys=True))


def write_identity(output_dir: str, identity: dict[str, Any]) -> None:
    """Write ``identity`` to ``output_dir/run.json`` (atomically)."""
    os.makedirs(output_dir, exist_ok=True)
    tmp = os.path.join(output_dir, f".{RUN_FILE}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(identity, f, indent=2, sort_keys=True)
    os.replace(tmp, os.path.join(output_dir, RUN_FILE))


def claim_new(output_dir: str, args: Any, launch: dict[str, Any] | None = None) -> tuple[dict[str, Any], str | None]:
    """Claim ``output_dir`` for a new run: refuse a non-empty folder unless
    ``args.overwrite_output_dir`` (then move it aside). Returns (identity, moved-to path or None)."""
    moved = None
    if not is_empty(output_dir):
        if not getattr(args, "overwrite_output_dir", False):
            raise RunFolderError(refusal(output_dir))
        moved = move_aside(output_dir)
    identity = new_identity(args, launch=launch)
    write_identity(output_dir, identity)
    return identity, moved


def check_resume(output_dir: str, args: Any, launch: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The identity of the run to resume in ``output_dir``; raises RunFolderError when its config
    differs from ``args``, or its launch (env, policies, model, menu) from ``launch``, naming what
    changed. None for a folder without ``run.json`` (written before run identities existed: a
    warning, and its checkpoints are used as they are)."""
    held = read_identity(output_dir)
    if held is None:
        if not is_empty(output_dir):
            warnings.warn(f"{output_dir} has no {RUN_FILE}: resuming its newest checkpoint without an identity check")
        return None
    if held.get("config_hash") != config_hash(args):
        _, shown = _differences(held.get("config", {}), identity_config(args))
        if held.get("config_class") != type(args).__name__:
            shown = f"config class {held.get('config_class')} -> {type(args).__name__}" + (f"; {shown}" if shown else "")
        raise RunFolderError(
            f"cannot resume run {held.get('run_id')} in {output_dir}: this config differs from the one it "
            f"was started with ({shown}). Only {', '.join(sorted(RESUMABLE_FIELDS))} may change on resume."
        )
    theirs, mine = held.get("launch"), _jsonable(launch or {})
    if theirs is not None and theirs != mine:  # run.json files written before launches were recorded have none
        changed, shown = _differences(theirs, mine)
        raise RunFolderError(
            f"cannot resume run {held.get('run_id')} in {output_dir}: it was started with another {changed[0]} "
            f"({shown}); a resumed run trains the same env with the same policies"
        )
    return held


def _differences(theirs: dict[str, Any], mine: dict[str, Any]) -> tuple[list[str], str]:
    """The keys whose values differ, and the first six shown as ``key: old -> new``."""
    changed = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    return changed, ", ".join(f"{k}: {theirs.get(k)!r} -> {mine.get(k)!r}" for k in changed[:6])

"""The viewer page: one self-contained HTML file for a run's recorded trees and curves.

The page's markup, styles and script are the package data file ``page.html`` (plain JavaScript
and SVG, no build step); this module fills in the run's index (steps, items, metrics) and, unless
served, one inert ``<script type="application/x-ndjson">`` block per step holding that step's
JSON Lines.
"""

from __future__ import annotations

import html
import json
import os
from importlib import resources
from typing import Any

from llm_marl.learners.recording import rollout_files

PAGE = "page.html"


def _template() -> str:
    return resources.files(__package__).joinpath(PAGE).read_text(encoding="utf-8")


def _script_safe(text: str) -> str:
    """JSON text that cannot close the <script> element it sits in (``<`` as its JSON escape)."""
    return text.replace("<", "\\u003c")


def read_metrics(run_dir: str) -> dict[str, list[list[float]]]:
    """``metrics.jsonl`` of a run as ``{name: [[step, value], ...]}`` (empty without the file)."""
    path = os.path.join(run_dir, "metrics.jsonl")
    curves: dict[str, list[list[float]]] = {}
    if not os.path.exists(path):
        return curves
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}, line {number}: not JSON ({exc})") from None
            step = row.pop("step", None)
            for name, value in row.items():
                if isinstance(value, (int, float)) and value == value and abs(value) != float("inf"):
                    curves.setdefault(name, []).append([step, value])
    return curves


def _summary(line: str, where: str) -> list[Any]:
    """[item, node count, mean root reward] of one recorded tree's line (for the item list)."""
    try:
        record = json.loads(line)
        rewards = record["nodes"][0]["rewards"]
        return [record["item"], len(record["nodes"]), sum(rewards) / len(rewards) if rewards else None]
    except (json.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
        raise ValueError(f"{where}: not a recorded rollout tree ({type(exc).__name__}: {exc})") from None


def build_page(run_dir: str, *, embed: bool = True) -> str:
    """The viewer page of ``run_dir``; ``embed=False`` leaves the trees out (served mode)."""
    if not os.path.isdir(run_dir):
        raise FileNotFoundError(f"run directory {run_dir!r} does not exist")
    entries, chunks = [], []
    for n, (kind, step, path) in enumerate(rollout_files(run_dir)):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        lines = [line for line in text.split("\n") if line.strip()]
        trees = [_summary(line, f"{path}, line {i + 1}") for i, line in enumerate(lines)]
        entry = {"kind": kind, "step": step, "file": os.path.basename(path), "trees": trees, "chunk": None}
        if embed:
            entry["chunk"] = f"rollouts-{n}"
            chunks.append(f'<script type="application/x-ndjson" id="rollouts-{n}">\n{_script_safe(chr(10).join(lines))}\n</script>')
        entries.append(entry)
    name = os.path.basename(os.path.normpath(os.path.abspath(run_dir)))
    index = {"version": 1, "run": name, "entries": entries, "metrics": read_metrics(run_dir)}
    head, rest = _template().split("__INDEX__", 1)
    middle, tail = rest.split("__CHUNKS__", 1)
    return head.replace("__TITLE__", html.escape(name)) + _script_safe(json.dumps(index)) + middle + "\n".join(chunks) + tail


def write_page(run_dir: str, out: str | None = None) -> str:
    """Write the self-contained page (default ``RUN_DIR/viewer.html``); returns its path."""
    page = build_page(run_dir)
    target = out or os.path.join(run_dir, "viewer.html")
    os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
    with open(target, "w", encoding="utf-8") as f:
        f.write(page)
    return target



"""The viewer page: one self-contained HTML file for a run's recorded trees and curves.

The page's markup, styles and script are the package data file ``page.html`` (plain JavaScript
and SVG, no build step); this module fills in the run's index (steps, items, metrics) and, unless
served, one inert ``<script type="application/octet-stream">`` block per step holding that
step's JSON Lines gzipped and base64-encoded (a step is inflated with the browser's own
``DecompressionStream`` when it is opened). The step shown first is stored as plain text before
the script and the others after it, so the first tree is drawn while the browser is still
reading the rest of a large page; choosing another step before that waits for it.
"""

from __future__ import annotations

import base64
import gzip
import html
import json
import os
import re
from importlib import resources
from typing import Any

from llm_marl.runs.recording import rollout_files

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


SUMMARY = re.compile(r'^\{"schema": "llm_marl.rollout_tree", "version": \d+, "kind": "\w+", "step": \d+, '
                     r'"item": (-?\d+), "num_nodes": (\d+), "reward_mean": ([^,]+),')


def _summary(line: str, where: str) -> list[Any]:
    """[item, node count, mean root reward] of one recorded tree's line, read from the line's
    first keys (recording.py writes them first) or, failing that, from the parsed line."""
    match = SUMMARY.match(line)
    if match:
        return [int(match.group(1)), int(match.group(2)), json.loads(match.group(3))]
    try:
        record = json.loads(line)
        rewards = record["nodes"][0]["rewards"]
        return [record["item"], len(record["nodes"]), sum(rewards) / len(rewards) if rewards else None]
    except (json.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
        raise ValueError(f"{where}: not a recorded rollout tree ({type(exc).__name__}: {exc})") from None


_SUMMARIES: dict[str, tuple[tuple[int, int], list[list[Any]]]] = {}


def file_summaries(path: str) -> list[list[Any]]:
    """The summaries of a rollout file's trees, cached while the file's size and mtime stay the
    same (the server rebuilds the page on every request; a file of a running run only grows)."""
    stat = os.stat(path)
    key = (stat.st_size, stat.st_mtime_ns)
    cached = _SUMMARIES.get(path)
    if cached is None or cached[0] != key:
        with open(path, encoding="utf-8") as f:
            lines = [line for line in f.read().split("\n") if line.strip()]
        cached = _SUMMARIES[path] = (key, [_summary(line, f"{path}, line {i + 1}") for i, line in enumerate(lines)])
    return cached[1]


def _packed(lines: list[str]) -> str:
    """A step's JSON Lines, gzipped and base64-encoded (the page inflates one step when opened)."""
    return base64.b64encode(gzip.compress("\n".join(lines).encode("utf-8"), compresslevel=6, mtime=0)).decode("ascii")


def build_page(run_dir: str, *, embed: bool = True) -> str:
    """The viewer page of ``run_dir``; ``embed=False`` leaves the trees out (served mode)."""
    if not os.path.isdir(run_dir):
        raise FileNotFoundError(f"run directory {run_dir!r} does not exist")
    files = rollout_files(run_dir)
    first = next((n for n, (kind, _, _) in enumerate(files) if kind == "train"), 0)  # the step shown on opening
    entries, chunks = [], []
    for n, (kind, step, path) in enumerate(files):
        entry = {"kind": kind, "step": step, "file": os.path.basename(path), "trees": None, "chunk": None}
        if embed:
            with open(path, encoding="utf-8") as f:
                lines = [line for line in f.read().split("\n") if line.strip()]
            entry["trees"] = [_summary(line, f"{path}, line {i + 1}") for i, line in enumerate(lines)]
            entry["chunk"] = f"rollouts-{n}"
            if n == first:  # plain text before the script: drawn while the browser still reads the rest
                entry["encoding"] = "plain"
                chunks.append(f'<script type="application/x-ndjson" id="rollouts-{n}">\n{_script_safe(chr(10).join(lines))}\n</script>')
            else:
                entry["encoding"] = "gzip+base64"
                chunks.append(f'<script type="application/octet-stream" data-encoding="gzip+base64" id="rollouts-{n}">{_packed(lines)}</script>')
        else:
            entry["trees"] = file_summaries(path)
        entries.append(entry)
    name = os.path.basename(os.path.normpath(os.path.abspath(run_dir)))
    index = {"version": 1, "run": name, "entries": entries, "metrics": read_metrics(run_dir)}
    head, rest = _template().split("__INDEX__", 1)
    before, rest = rest.split("__FIRST__", 1)
    middle, tail = rest.split("__CHUNKS__", 1)
    return "".join([
        head.replace("__TITLE__", html.escape(name)), _script_safe(json.dumps(index)), before,
        chunks[first] if chunks else "", middle, "\n".join(c for n, c in enumerate(chunks) if n != first), tail,
    ])


def write_page(run_dir: str, out: str | None = None) -> str:
    """Write the self-contained page (default ``RUN_DIR/viewer.html``); returns its path."""
    page = build_page(run_dir)
    target = out or os.path.join(run_dir, "viewer.html")
    os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
    with open(target, "w", encoding="utf-8") as f:
        f.write(page)
    return target



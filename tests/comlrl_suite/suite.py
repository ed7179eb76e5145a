"""CoMLRL 1.4.3's own test suite, migrated with docs/migrating.md's one line, run on llm_marl.

:func:`run_suite` downloads the ``comlrl==1.4.3`` source package with pip (CoMLRL is not
installed), extracts its ``tests/``, rewrites the imports with exactly the sed line of
docs/migrating.md and runs pytest on it in a subprocess against this checkout, returning each
test's outcome. ``expectations.json`` lists the tests expected to fail, each with its reason:

- ``private``: the test names CoMLRL-private (underscore) attributes or methods, listed in
  ``names`` (checked: each occurs in the test's source);
- ``deliberate``: llm_marl differs on purpose; ``doc`` names the page and ``quote`` is text of
  one line of it that documents the difference (checked: found in that page);
- ``open``: not yet served; ``why`` says what is missing (the target is none).

``python tests/comlrl_suite/update.py`` reruns the suite and rewrites the file: entries of tests
that still fail keep their reasons, tests that pass are dropped, new failures get a reason
found from their source (``private``) or ``TODO``, which it lists.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
EXPECTATIONS = HERE / "expectations.json"
VERSION = "1.4.3"
REASONS = ("private", "deliberate", "open")


class DownloadFailed(RuntimeError):
    """pip could not fetch the CoMLRL source package."""


def sed_line() -> str:
    """The one migration line docs/migrating.md gives (the only line there with ``sed -i`` and ``llm_marl.comlrl``)."""
    lines = [line for line in (REPO / "docs" / "migrating.md").read_text().splitlines() if "sed -i" in line and "llm_marl.comlrl" in line]
    if len(lines) != 1:
        raise AssertionError(f"docs/migrating.md should give exactly one sed line, found {len(lines)}")
    return lines[0]


def fetch_tests(work: Path) -> Path:
    """Download the sdist into ``work`` and extract its ``tests/`` to ``work/tests``; return that folder."""
    download = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:", f"comlrl=={VERSION}", "-d", str(work / "sdist")],
        capture_output=True, text=True)
    archives = sorted((work / "sdist").glob(f"comlrl-{VERSION}.tar.gz")) if (work / "sdist").is_dir() else []
    if download.returncode != 0 or not archives:
        last = (download.stderr.strip().splitlines() or ["no archive"])[-1]
        raise DownloadFailed(f"could not download the comlrl=={VERSION} sdist with pip: {last}")
    prefix = f"comlrl-{VERSION}/tests/"
    with tarfile.open(archives[0]) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and m.isfile()]
        for member in members:
            member.name = "tests/" + member.name[len(prefix):]
        tar.extractall(work, members=members, filter="data")
    return work / "tests"


def public_names(work: Path) -> dict[str, list[str]]:
    """From the sdist downloaded into ``work``: each CoMLRL package's ``__all__`` ({module: names}),
    and under ``"modules"`` every module path without a leading underscore that its tests, docs or
    examples import (read from the source, CoMLRL is not imported)."""
    archive = next((work / "sdist").glob(f"comlrl-{VERSION}.tar.gz"))
    names: dict[str, list[str]] = {}
    modules: set[str] = set()
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            path = member.name.split("/", 1)[-1]
            if not member.isfile() or not path.endswith((".py", ".md")):
                continue
            text = tar.extractfile(member).read().decode()
            if path.startswith("comlrl/") and path.endswith("__init__.py"):
                for node in ast.parse(text).body:
                    if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
                        names[path[: -len("/__init__.py")].replace("/", ".")] = sorted(ast.literal_eval(node.value))
            if path.startswith(("tests/", "docs/", "examples/", "README")):
                modules |= _imports(text, path.endswith(".py"))
    with tarfile.open(archive) as tar:
        files = {m.name.split("/", 1)[-1] for m in tar.getmembers()}
    served = {m for m in modules if f"{m.replace('.', '/')}.py" in files or f"{m.replace('.', '/')}/__init__.py" in files}
    names["modules"] = sorted(m for m in served if not any(part.startswith("_") for part in m.split(".")))
    imported: dict[str, list[str]] = {}
    for dotted in sorted(modules - served):
        module, _, name = dotted.rpartition(".")
        if module in served and name not in names.get(module, []):
            imported.setdefault(module, []).append(name)
    names["imported"] = imported
    return names


def _imports(text: str, python: bool) -> set[str]:
    """``module`` and ``module.name`` of every ``import comlrl...`` / ``from comlrl... import name`` (a
    Markdown page: its one-line imports)."""
    found = set()
    if python:
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.split(".")[0] == "comlrl"}
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "comlrl" and not node.level:
                found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names if not a.name.startswith("_")}
        return found
    for match in re.finditer(r"^\s*from (comlrl[\w.]*) import ([\w, ]+)$", text, re.M):
        found |= {match.group(1)} | {f"{match.group(1)}.{n.strip()}" for n in match.group(2).split(",") if n.strip()}
    for match in re.finditer(r"^\s*import (comlrl[\w.]*)", text, re.M):
        found.add(match.group(1))
    return found


def migrate(work: Path) -> None:
    """Run docs/migrating.md's sed line at ``work`` (as a user runs it at their repository's root)."""
    subprocess.run(["bash", "-c", sed_line()], cwd=work, check=True)


def run_pytest(work: Path, timeout: int = 900) -> dict[str, dict[str, str]]:
    """Run the migrated ``work/tests`` against this checkout: {"outcomes": {node id: outcome}, "messages": {node id: message}}."""
    out = work / "outcomes.json"
    (work / "pytest.ini").write_text("[pytest]\n")  # rootdir here: not this repository's pytest settings
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false",
           "WANDB_MODE": "offline", "WANDB_SILENT": "true", "COMLRL_SUITE_OUTCOMES": str(out), "COMLRL_SUITE_REPO": str(REPO),
           "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE), os.environ.get("PYTHONPATH", "")])}
    env.pop("WANDB_SERVICE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "outcomes_plugin", "--continue-on-collection-errors",
         "-o", "addopts=", "tests"],
        cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
    if not out.exists():
        raise AssertionError(f"the CoMLRL suite did not run (exit {proc.returncode}): {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return json.loads(out.read_text())


def run_suite(work: Path) -> tuple[dict[str, str], dict[str, str], Path]:
    """Fetch, migrate and run; the outcomes, the failures' messages and the migrated tests folder."""
    tests = fetch_tests(work)
    migrate(work)
    report = run_pytest(work)
    return report["outcomes"], report["messages"], tests


def load_expectations() -> dict:
    return json.loads(EXPECTATIONS.read_text())


def dump_expectations(expected: dict[str, dict]) -> None:
    """Write the file, one test a line (sorted), so that a change shows as one line of a diff."""
    lines = [f"  {json.dumps(node)}: {json.dumps(entry)}" for node, entry in sorted(expected.items())]
    EXPECTATIONS.write_text(f'{{\n "comlrl": "{VERSION}",\n "expected": {{\n' + ",\n".join(lines) + "\n }\n}\n")


def compare(outcomes: dict[str, str], expected: dict[str, dict]) -> list[str]:
    """What differs from the expectations, one line each: tests that newly fail, tests listed that
    now pass, and listed tests that no longer exist."""
    problems = []
    for node, outcome in sorted(outcomes.items()):
        if outcome in ("failed", "error") and node not in expected:
            problems.append(f"newly {'fails' if outcome == 'failed' else 'errors'}: {node}")
        elif outcome == "passed" and node in expected:
            problems.append(f"newly passes (remove it from tests/comlrl_suite/expectations.json): {node}")
    problems += [f"listed but not run: {node}" for node in sorted(set(expected) - set(outcomes))]
    return problems


def reason_problems(expected: dict[str, dict], tests: Path) -> list[str]:
    """Entries whose reason is missing or does not check out, one line each."""
    problems = []
    docs: dict[str, str] = {}
    for node, entry in sorted(expected.items()):
        reason = entry.get("reason")
        if reason not in REASONS:
            problems.append(f"{node}: reason {reason!r} is not one of {REASONS}")
        elif reason == "private":
            source = suite_source(tests, node)
            missing = [name for name in entry.get("names") or [None] if not name or not re.fullmatch(r"_\w+", name) or name not in source]
            if missing:
                problems.append(f"{node}: private names {missing} are not underscore names in the test's module or the suite's helpers")
        elif reason == "deliberate":
            page = entry.get("doc", "")
            if page not in docs:
                docs[page] = (REPO / page).read_text() if page.startswith("docs/") and (REPO / page).is_file() else ""
            quote = entry.get("quote", "")
            if not quote or not any(quote in line for line in docs[page].splitlines()):
                problems.append(f"{node}: the quote is not a line of {page or 'a docs page'}: {quote!r}")
        elif not entry.get("why"):
            problems.append(f"{node}: an open entry needs its why")
    return problems


def _function(tree: ast.Module, parts: list[str]) -> ast.AST | None:
    scope: list[ast.stmt] = tree.body
    found = None
    for part in parts:
        found = next((n for n in scope if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part), None)
        if found is None:
            return None
        scope = found.body
    return found


def source_of(tests: Path, node: str) -> str:
    """The source of the test ``node`` (a whole module for a module entry)."""
    path, _, rest = node.partition("::")
    text = (tests.parent / path).read_text()
    if not rest:
        return text
    found = _function(ast.parse(text), re.sub(r"\[.*\]$", "", rest).split("::"))
    return ast.get_source_segment(text, found) or "" if found is not None else ""


HELPERS = ("conftest.py", "helpers.py", "checkpoint_helpers.py")


def suite_source(tests: Path, node: str) -> str:
    """The test's module and the suite's shared helper modules."""
    return "\n".join([(tests.parent / node.partition("::")[0]).read_text()] + [(tests / h).read_text() for h in HELPERS if (tests / h).exists()])


def private_from_message(tests: Path, node: str, message: str) -> list[str]:
    """The underscore attribute an AttributeError names, when the test's module or a helper names it too."""
    match = re.search(r"has no attribute '(_[A-Za-z]\w*)'|cannot import name '(_[A-Za-z]\w*)'", message or "")
    name = match and (match.group(1) or match.group(2))
    return [name] if name and not name.endswith("__") and name in suite_source(tests, node) else []


def private_names(tests: Path, node: str) -> list[str]:
    """Underscore (not dunder) attributes, imported names and attribute-name strings the test names."""
    source = source_of(tests, node)
    names = set()
    for n in ast.walk(ast.parse(source)) if source else []:
        if isinstance(n, ast.Attribute):
            names.add(n.attr)
        elif isinstance(n, ast.Name):
            names.add(n.id)
        elif isinstance(n, ast.alias):
            names.add(n.name)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and re.fullmatch(r"_\w+", n.value):
            names.add(n.value)
    module = (tests.parent / node.partition("::")[0]).read_text()
    imported = {a.name for n in ast.walk(ast.parse(module)) if isinstance(n, ast.ImportFrom) for a in n.names}
    return sorted(name for name in names
                  if re.fullmatch(r"_[A-Za-z]\w*", name) and not name.endswith("__")
                  and (name in imported or f".{name}" in source or f'"{name}"' in source or f"'{name}'" in source))


def counts(outcomes: dict[str, str]) -> dict[str, int]:
    """collected (tests run), passed, failed, errors (modules that cannot be imported count one each)."""
    values = list(outcomes.values())
    return {"collected": sum(1 for n in outcomes if "::" in n), "passed": values.count("passed"), "failed": values.count("failed"),
            "errors": values.count("error"), "skipped": values.count("skipped")}

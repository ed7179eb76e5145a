"""The package's layout rules, read from the source (ast, nothing imported), plus the old import
path that still works.

What counts as an import of module B by module A:
- ``import B`` and ``from B import x``; for ``from B import x`` where ``B.x`` is a module of the
  package, the import is of ``B.x`` (``from llm_marl import sandbox`` imports
  ``llm_marl.sandbox``). Relative imports are resolved against A's package.
- The parent packages Python imports on the way (``llm_marl/__init__``, ``llm_marl.tasks``
  for ``llm_marl.tasks.base``) are not counted: every module would otherwise import every
  package ``__init__`` that re-exports it.

Rule 1, layering: no module under ``llm_marl/tasks/`` imports anything under
``llm_marl/envs/`` or ``llm_marl/learners/``, wherever the import statement is (a lazy import
inside a function counts: it is still a dependency).

Rule 2, no circles: among the imports that run when a module is imported (module level,
including ``if``/``try``/``with`` blocks and class bodies; not function bodies and not
``if TYPE_CHECKING:`` blocks), no chain of llm_marl modules leads back to where it started.
"""

from __future__ import annotations

import ast
import importlib
import sys
import textwrap
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "llm_marl"


# --- the walker -----------------------------------------------------------------------------------


def module_names(root: Path) -> dict[str, Path]:
    """Dotted name -> file for every .py under the package directory ``root``."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.Module, module_level_only: bool):
    """Import statements of a module: all of them, or those that run when it is imported."""
    if not module_level_only:
        yield from (n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)))
        return
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
        else:
            stack.extend(n for n in ast.iter_child_nodes(node) if isinstance(n, ast.stmt) or hasattr(n, "body"))


def imports_of(name: str, path: Path, known: set[str], module_level_only: bool) -> set[str]:
    """The package modules that module ``name`` (file ``path``) imports, as defined above."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _import_nodes(ast.parse(path.read_text("utf-8"), str(path)), module_level_only):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        found.update(t for t in targets if t in known)
    found.discard(name)
    return found


def import_graph(root: Path, module_level_only: bool) -> dict[str, set[str]]:
    names = module_names(root)
    known = set(names)
    return {name: imports_of(name, path, known, module_level_only) for name, path in names.items()}


def layering_violations(graph: dict[str, set[str]], root_name: str = "llm_marl") -> list[str]:
    """``"A -> B"`` for every import from tasks/ into envs/ or learners/."""
    lower = f"{root_name}.tasks"
    upper = (f"{root_name}.envs", f"{root_name}.learners")

    def under(module: str, package: str) -> bool:
        return module == package or module.startswith(package + ".")

    return sorted(
        f"{a} -> {b}"
        for a, targets in graph.items()
        if under(a, lower)
        for b in targets
        if any(under(b, u) for u in upper)
    )


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


# --- the walker finds what it should, on a planted package ----------------------------------------


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root / "llm_marl"


def test_walker_finds_planted_circle_and_lazy_upward_import(tmp_path):
    pkg = _write(tmp_path, {
        "llm_marl/__init__.py": "from llm_marl.tasks import Task\n",
        "llm_marl/tasks/__init__.py": "from llm_marl.tasks.base import Task\n",
        "llm_marl/tasks/base.py": "import os\nclass Task:\n    pass\n",
        # a circle through a package __init__: code/__init__ -> code.task -> code (from .. import)
        "llm_marl/tasks/code/__init__.py": "from .task import CodeTask\n",
        "llm_marl/tasks/code/task.py": "from llm_marl.tasks.code import helper\nCodeTask = 1\n",
        "llm_marl/tasks/code/helper.py": "from llm_marl.tasks import code\n",
        # a lazy upward import: not a circle, but a layering violation
        "llm_marl/tasks/matrix.py": "def f():\n    from llm_marl.envs import registry\n",
        "llm_marl/envs/__init__.py": "",
        "llm_marl/envs/registry.py": "from llm_marl.tasks.base import Task\n",
        # imports that do not run at import time do not make circles
        "llm_marl/envs/typed.py": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from llm_marl.envs import lazy\n"
        ),
        "llm_marl/envs/lazy.py": "def g():\n    from llm_marl.envs import typed\n",
    })
    everywhere = import_graph(pkg, module_level_only=False)
    at_import = import_graph(pkg, module_level_only=True)
    assert everywhere["llm_marl.tasks.matrix"] == {"llm_marl.envs.registry"}
    assert at_import["llm_marl.tasks.matrix"] == set()
    assert at_import["llm_marl.tasks.code"] == {"llm_marl.tasks.code.task"}
    assert at_import["llm_marl.tasks.code.task"] == {"llm_marl.tasks.code.helper"}
    assert layering_violations(everywhere) == ["llm_marl.tasks.matrix -> llm_marl.envs.registry"]
    assert circles(at_import) == [["llm_marl.tasks.code", "llm_marl.tasks.code.helper", "llm_marl.tasks.code.task"]]
    # with the lazy imports counted, typed <-> lazy would be a circle; at import time it is not
    assert ["llm_marl.envs.lazy", "llm_marl.envs.typed"] in circles(everywhere)


# --- the rules, on the real package ---------------------------------------------------------------


def test_tasks_import_nothing_from_envs_or_learners():
    graph = import_graph(PACKAGE_ROOT, module_level_only=False)
    assert "llm_marl.tasks.code.reward" in graph and "llm_marl.sandbox" in graph["llm_marl.tasks.code.reward"]
    assert layering_violations(graph) == []


def test_no_import_circle_even_through_lazy_imports():
    """Counting the imports inside functions too, no llm_marl module reaches back to itself
    (except through a package ``__init__`` re-exporting its own modules, and the lazily imported
    re-exports of ``llm_marl`` and ``llm_marl.learners``)."""
    graph = import_graph(PACKAGE_ROOT, module_level_only=False)
    inits = {name for name, path in module_names(PACKAGE_ROOT).items() if path.name == "__init__.py"}
    graph = {a: {b for b in targets if b not in inits} for a, targets in graph.items() if a not in inits}
    assert circles(graph) == []


def test_no_import_circle_among_package_modules():
    graph = import_graph(PACKAGE_ROOT, module_level_only=True)
    assert "llm_marl.tasks.base" in graph["llm_marl.envs.registry"]  # the registry depends on tasks ...
    assert not any(m.startswith("llm_marl.tasks.") and m != "llm_marl.tasks.base"
                   for m in graph["llm_marl.envs.registry"])  # ... but names the shipped ones as strings
    assert circles(graph) == []


def test_documented_layout_matches_the_tree():
    """docs/development.md's *Layout* lists every package and top-level module, and nothing gone."""
    page = (PACKAGE_ROOT.parent / "docs" / "development.md").read_text("utf-8")
    layout = page.split("## Layout", 1)[1].split("```")[1]
    listed = {line.split()[0].rstrip("/") for line in layout.splitlines() if line.startswith("llm_marl/")}
    top_level = {
        f"llm_marl/{p.name}" for p in PACKAGE_ROOT.iterdir()
        if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name != "__init__.py")
    }
    packages = {str(p.parent.relative_to(PACKAGE_ROOT.parent)) for p in PACKAGE_ROOT.rglob("*/__init__.py")}
    missing_on_disk = {entry for entry in listed if not (PACKAGE_ROOT.parent / entry).exists()}
    assert missing_on_disk == set()
    assert (top_level | packages) - listed == set()


# --- the old sandbox path -------------------------------------------------------------------------


def test_old_sandbox_path_reexports_with_a_deprecation_warning(monkeypatch):
    import llm_marl.sandbox as new

    monkeypatch.delitem(sys.modules, "llm_marl.tasks.sandbox", raising=False)
    with pytest.warns(DeprecationWarning, match=r"import llm_marl\.sandbox instead"):
        old = importlib.import_module("llm_marl.tasks.sandbox")
    for name in ("run_program", "run_programs", "run_tests", "SandboxResult", "SandboxError"):
        assert getattr(old, name) is getattr(new, name)


def test_the_code_tasks_old_module_level_names_still_import():
    """Before the move to tasks/code/, ``llm_marl.tasks.code`` was one module: its functions keep
    their import path, and register_envs (now the registry's job) only warns."""
    from llm_marl.tasks.code import full_feedback, register_envs
    from llm_marl.tasks.code.task import full_feedback as moved

    assert full_feedback is moved
    with pytest.warns(DeprecationWarning, match="no longer needed"):
        register_envs()


# --- the rooms: learners/ by family beside the shared core, runs/ what a run leaves behind ------------

LEARNERS_CORE = {"__init__", "config", "config_types", "config_docs", "tree", "buffer", "update", "evaluation", "checks", "advantages", "stalls", "staleness", "natural_gradient"}
FAMILIES = {
    "reinforce": {"__init__", "trainer", "config", "centralized"},
    "actor_critic": {"__init__", "trainer", "config", "math"},
    "preference": {"__init__", "madpo", "iterative", "math", "reward_model"},
}
MOVED = {f"llm_marl.learners.{m}": f"llm_marl.runs.{m}"
         for m in ("checkpoint", "distributed", "interrupt", "logging", "recording", "run_dir", "run_folder")}
MOVED["llm_marl.learners.anchor_compat"] = "llm_marl.comlrl.anchor_compat"
MOVED["llm_marl.envs.plugins"] = "llm_marl.envs.registry"  # registry and plugins are one module
MOVED.update({  # issue 38: the learners by family
    "llm_marl.learners.centralized": "llm_marl.learners.reinforce.centralized",
    "llm_marl.learners.actor_critic_config": "llm_marl.learners.actor_critic.config",
    "llm_marl.learners.actor_critic_math": "llm_marl.learners.actor_critic.math",
    "llm_marl.learners.preference_iter": "llm_marl.learners.preference.iterative",
    "llm_marl.learners.preference_math": "llm_marl.learners.preference.math",
    "llm_marl.learners.reward_model": "llm_marl.learners.preference.reward_model",
})
TOOK_THE_NAME = {  # family packages named like the module that moved into them: old names forward
    "llm_marl.learners.reinforce": ("llm_marl.learners.reinforce.trainer", ("MAGRPOTrainer", "default_optimizer", "_num_items")),
    "llm_marl.learners.actor_critic": ("llm_marl.learners.actor_critic.trainer", ("IACTrainer", "ActorCriticTrainerBase", "RolloutSample")),
    "llm_marl.learners.preference": ("llm_marl.learners.preference.madpo", ("MADPOTrainer", "PreferenceSample", "centralize_if_asked")),
}


def test_the_trainer_reads_as_its_loop():
    """MAGRPOTrainer keeps the loop; the update, evaluation, run folder, checkpoints and metric
    flushing live in their own modules (issue 26: under ~350 lines)."""
    source = (PACKAGE_ROOT / "learners" / "reinforce" / "trainer.py").read_text("utf-8")
    tree = ast.parse(source)
    trainer = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "MAGRPOTrainer")
    assert trainer.end_lineno - trainer.lineno + 1 <= 350
    names = {n.name for n in trainer.body if isinstance(n, ast.FunctionDef)}
    assert not names & {"_claim_run_folder", "_stop_on_signal", "_hook_metrics", "_joint_optimizer_step"}


def test_learners_holds_the_shared_core_and_one_folder_per_family():
    learners = PACKAGE_ROOT / "learners"
    assert {p.stem for p in learners.glob("*.py")} - LEARNERS_CORE == set()
    assert {p.name for p in learners.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(FAMILIES)
    for family, files in FAMILIES.items():
        assert {p.stem for p in (learners / family).glob("*.py")} - files == set(), family
        assert not [p for p in (learners / family).iterdir() if p.is_dir() and p.name != "__pycache__"], family


def test_the_shared_core_imports_no_family():
    graph = import_graph(PACKAGE_ROOT, module_level_only=False)
    assert "llm_marl.learners.reinforce.trainer" in graph["llm_marl.learners.actor_critic.trainer"]  # families build on each other ...
    core = {f"llm_marl.learners.{m}" for m in LEARNERS_CORE - {"__init__"}}
    families = tuple(f"llm_marl.learners.{f}" for f in FAMILIES)
    assert {f"{a} -> {b}" for a in core for b in graph[a] if b.startswith(families)} == set()  # ... never the core on them


def test_runs_imports_nothing_from_learners():
    graph = import_graph(PACKAGE_ROOT, module_level_only=False)
    runs = {name: targets for name, targets in graph.items() if name.startswith("llm_marl.runs")}
    assert "llm_marl.rollouts" in runs["llm_marl.runs.checkpoint"]  # what both need lives a floor below
    assert {"llm_marl.rollouts", "llm_marl.advantages"} <= runs["llm_marl.runs.recording"]
    assert {f"{a} -> {b}" for a, targets in runs.items() for b in targets if b.startswith("llm_marl.learners")} == set()
    below = {"llm_marl.rollouts", "llm_marl.advantages"}
    assert {f"{a} -> {b}" for a in below for b in graph[a] if b.startswith(("llm_marl.learners", "llm_marl.runs"))} == set()


def test_the_design_path_of_the_advantage_math_imports_without_a_warning(recwarn):
    """DESIGN.md names ``llm_marl.learners.advantages.group_advantages``: defined a floor below,
    re-exported at that path, one function object."""
    import llm_marl.advantages as below
    import llm_marl.learners.advantages as core

    assert core.group_advantages is below.group_advantages and core.agent_returns is below.agent_returns
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning)]
    assert [n for n in vars(below) if not n.startswith("_") and callable(getattr(below, n)) and getattr(getattr(below, n), "__module__", "") == below.__name__ and not hasattr(core, n)] == []


@pytest.mark.parametrize("package", sorted(TOOK_THE_NAME))
def test_a_family_package_forwards_the_old_modules_other_names_with_a_warning(package, recwarn):
    home, names = TOOK_THE_NAME[package]
    old, new = importlib.import_module(package), importlib.import_module(home)
    public, *others = names
    assert getattr(old, public) is getattr(new, public)  # the family's own name: no warning
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning)]
    for name in others:
        with pytest.warns(DeprecationWarning, match=f"{package}.{name} moved to {home}.{name}"):
            assert getattr(old, name) is getattr(new, name)
    with pytest.raises(AttributeError):
        old.no_such_name


def test_the_reinforce_variants_old_config_path_warns_and_gives_the_same_class():
    import llm_marl.learners.config as shared
    import llm_marl.learners.reinforce.config as reinforce_config

    for name in ("MAREINFORCEConfig", "MARLOOConfig", "MAReMaxConfig"):
        with pytest.warns(DeprecationWarning, match=f"{name} moved to llm_marl.learners.reinforce.config"):
            assert getattr(shared, name) is getattr(reinforce_config, name)
    assert reinforce_config.MAGRPOConfig is shared.MAGRPOConfig  # one base, re-exported by the family
    with pytest.raises(AttributeError):
        shared.NoSuchConfig


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_moved_modules_import_from_their_old_paths_with_a_deprecation_warning(monkeypatch, old, new):
    moved = importlib.import_module(new)
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        assert importlib.import_module(old) is moved
    parent, _, leaf = old.rpartition(".")
    monkeypatch.delitem(sys.modules, old)
    monkeypatch.delattr(sys.modules[parent], leaf, raising=False)
    with pytest.warns(DeprecationWarning, match=f"import {new} instead"):
        exec(f"from {parent} import {leaf} as found", namespace := {})
    assert namespace["found"] is moved


# --- assembly: one code path builds models, policies and trainers ----------------------------------

MODEL_BUILDERS = {"llm_marl.policies.causal_lm", "llm_marl.policies.lora_team", "llm_marl.comlrl.anchor_compat", "transformers"}


def imported_modules(path: Path) -> set[str]:
    """Every module an import statement of ``path`` names, in the package or not, wherever the
    statement is (``from a.b import c`` names ``a.b`` and ``a.b.c``)."""
    found = set()
    for node in _import_nodes(ast.parse(path.read_text("utf-8"), str(path)), module_level_only=False):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_the_cli_parses_and_prints_while_assembly_builds_the_models():
    path = PACKAGE_ROOT / "cli.py"
    names = imported_modules(path)
    assert "llm_marl.assembly" in names
    assert {n for n in names if n in MODEL_BUILDERS or n.startswith("transformers.")} == set()
    # no policy class and no builder but the one path: the model list (`llm-marl models`) only
    policies = {n for n in names if n.startswith("llm_marl.policies")}
    assert policies - {"llm_marl.policies"} and all(n.startswith("llm_marl.policies.models") for n in policies - {"llm_marl.policies"})
    assert {n for n in names if n.startswith("llm_marl.assembly.") and n != "llm_marl.assembly.SAMPLING_FIELDS"} == set()
    called = {n.func.attr for n in ast.walk(ast.parse(path.read_text("utf-8"))) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    assert "make_policies" in called
    assert called & {"build_policies", "tabular_policies", "quiet_downloads", "TabularPolicy", "CausalLMPolicy", "LoRATeam"} == set()


def test_the_drop_in_constructor_builds_its_policies_through_assembly():
    path = PACKAGE_ROOT / "comlrl" / "anchor_compat.py"
    assert "llm_marl.assembly.make_policies" in imported_modules(path)
    assert "llm_marl.assembly.build_policies" not in imported_modules(path)
    calls = [n.func for n in ast.walk(ast.parse(path.read_text("utf-8"))) if isinstance(n, ast.Call)]
    builders = {"CausalLMPolicy", "LoRATeam", "AutoModelForCausalLM", "AutoTokenizer", "build_policies", "TabularPolicy"}
    named = {f.id for f in calls if isinstance(f, ast.Name)} | {f.value.id for f in calls if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)}
    assert named & builders == set()
    assert "make_policies" in named

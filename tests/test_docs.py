"""The documentation's code runs: every Python block of docs/writing_a_task.md, in order, in one
namespace (the task, its registration, the menu, PettingZoo's checks including render_test)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.fixture(autouse=True)
def scratch_registry(monkeypatch):
    """Env ids registered by a test here (custom envs, docs examples) vanish afterwards."""
    import pettingzoo

    from llm_marl.envs import registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    before = set(getattr(pettingzoo, "parallel_registry", {}))
    yield
    for env_id in set(getattr(pettingzoo, "parallel_registry", {})) - before:
        del pettingzoo.parallel_registry[env_id]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.S | re.M)


def test_writing_a_task_blocks_run_in_order():
    blocks = python_blocks(DOCS / "writing_a_task.md")
    assert any("render_test(aec_env" in block for block in blocks)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "docs/writing_a_task.md", "exec"), namespace)
    assert namespace["Digits"].menu == ("apple", "river", "pear")


def test_algorithms_doc_has_every_section_the_code_cites():
    text = (DOCS / "algorithms.md").read_text()
    cited = set()
    root = DOCS.parent
    for path in [*root.glob("llm_marl/**/*.py"), *root.glob("tests/*.py"), root / "README.md"]:
        cited |= set(re.findall(r"algorithms\.md §(\d+(?:\.\d+)?)", path.read_text()))
    headings = set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", text, flags=re.M))
    assert cited and cited <= headings, cited - headings


def test_user_facing_text_cites_no_spec_outside_the_repository():
    root = DOCS.parent
    for path in [*root.glob("llm_marl/**/*.py"), root / "README.md", *DOCS.glob("*.md")]:
        assert not re.search(r"(?<![-\w])SPEC[-\w]*\.md|\bSPEC §", path.read_text()), f"{path} cites a spec outside the repository (use docs/)"


def test_the_tabular_examples_of_the_docs_pages_run(tmp_path, monkeypatch):
    """Every Python block of the README or a docs page that trains tabular policies (no model to
    download) runs as written, each in a fresh namespace, in an empty folder (they write runs/...)."""
    ran = []
    for path in [DOCS.parent / "README.md", *sorted(DOCS.glob("*.md"))]:
        if path.name == "writing_a_task.md":  # its blocks build on each other: the test above
            continue
        for i, block in enumerate(python_blocks(path)):
            if "TabularPolicy(" in block and ".train()" in block and "from_pretrained" not in block:
                (tmp_path / f"{path.stem}-{i}").mkdir()
                monkeypatch.chdir(tmp_path / f"{path.stem}-{i}")
                namespace: dict = {}
                exec(compile(block, str(path.relative_to(DOCS.parent)), "exec"), namespace)
                assert namespace["trainer"].state.global_step > 0, path.name
                ran.append(path.name)
    assert {"README.md", "training.md", "actor_critic_learners.md", "preference.md"} <= set(ran), ran


def test_the_migration_page_gives_the_readmes_sed_line():
    """docs/migrating.md repeats the README's one-line migration (which tests/test_comlrl_script.py runs)."""
    def sed_lines(path: Path) -> list[str]:
        return [line for line in path.read_text().splitlines() if "llm_marl.comlrl" in line and "sed -i" in line]

    [readme_line] = sed_lines(DOCS.parent / "README.md")
    assert sed_lines(DOCS / "migrating.md") == [readme_line]

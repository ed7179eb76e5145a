"""The documentation site builds with warnings as errors, and its pages render in a browser.

This is how CI builds the site (``python -m sphinx -W docs docs/_build``, here into a temporary
folder, once per session): a broken cross-reference, a docstring autodoc cannot read or a config
class missing from the generated configuration reference fails it. The pages are then opened in
headless Chromium (``llm_marl/viewer/chromium.py``; skipped, saying why, where none is installed)
to check what a reader sees: the title, furo's navigation, a code block, a page that is not blank.
Needs the ``docs`` extra (sphinx, furo, myst-parser).
"""

from __future__ import annotations

import dataclasses
import html
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("sphinx", reason="the docs extra is not installed: pip install -e '.[docs]'")
pytest.importorskip("furo", reason="the docs extra is not installed: pip install -e '.[docs]'")
pytest.importorskip("myst_parser", reason="the docs extra is not installed: pip install -e '.[docs]'")

from llm_marl.viewer.chromium import Chromium, find_chromium  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
NO_CHROMIUM = "no Chromium on this machine: install the Debian package `chromium` (.ci/run does) to run the browser tests"
needs_chromium = pytest.mark.skipif(find_chromium() is None, reason=NO_CHROMIUM)


def sphinx_build(source: Path, out: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "FORCE_COLOR"}  # a CI that forces colour would colour the messages
    env.update(OMP_NUM_THREADS="1", NO_COLOR="1", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "--no-color", "-q", "-E", str(source), str(out)],
                          capture_output=True, text=True, env=env, timeout=600)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = sphinx_build(DOCS, out)
    assert result.returncode == 0, f"the site does not build with -W:\n{result.stderr[-4000:]}"
    return out


def test_every_markdown_page_is_in_the_site(site):
    pages = {p.stem for p in DOCS.glob("*.md")}
    built = {p.stem for p in site.glob("*.html")}
    assert pages <= built, pages - built
    index = (site / "index.html").read_text()
    linked = set(re.findall(r'class="reference internal" href="([\w/]+)\.html"', index))
    assert pages - {"index"} <= linked, f"pages left out of the home page's navigation: {pages - {'index'} - linked}"


def test_the_configuration_reference_lists_every_field_with_its_doc(site):
    """The generated tables hold each MAGRPOConfig field with its default and its one-line doc
    (the text ``llm-marl train --help`` prints), and IAC's own fields in IAC's section."""
    import llm_marl
    from llm_marl.learners.config_docs import field_docs

    page = html.unescape(re.sub(r"<[^>]+>", "", (site / "configuration.html").read_text()))
    page = " ".join(page.split())
    docs = field_docs(llm_marl.MAGRPOConfig)
    for field in dataclasses.fields(llm_marl.MAGRPOConfig):
        doc = " ".join(docs[field.name].replace("``", "").replace("`", "").split())
        assert f"{field.name} " in page and doc in page, field.name
    assert "num_generations int 4 K: samples per observation per agent" in page
    iac_section = page.split("IACConfig", 2)[2].split("MAACConfig", 1)[0]
    assert "critic_learning_rate" in iac_section and "num_agents" not in iac_section  # only what IAC changes


def test_a_config_class_no_page_documents_fails_the_build(tmp_path):
    (tmp_path / "conf.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(DOCS / "_ext")!r})
        extensions = ["myst_parser", "config_reference"]
    """))
    (tmp_path / "index.md").write_text("# Only MAGRPO\n\n```{config-fields} llm_marl.MAGRPOConfig\n```\n")
    result = sphinx_build(tmp_path, tmp_path / "_build")
    assert result.returncode != 0
    [listed] = re.findall(r"configuration reference: no config-fields directive documents (.*)", result.stderr)
    import llm_marl

    assert set(listed.split(", ")) == {n for n in llm_marl.__all__ if n.endswith("Config")} - {"MAGRPOConfig"}


PAGE = """(() => ({
  title: document.title,
  sidebar: [...document.querySelectorAll('.sidebar-tree a.reference')].map(a => a.textContent.trim()),
  code: [...document.querySelectorAll('div.highlight pre')].map(p => p.textContent),
  heading: (document.querySelector('article h1') || {textContent: ''}).textContent,
  classes: [...document.querySelectorAll('dl.py.class > dt')].map(dt => dt.id),
  width: document.documentElement.scrollWidth,
}))()"""


def non_blank(png: str) -> bool:
    from PIL import Image

    image = Image.open(png).convert("L")
    histogram = image.histogram()
    background = max(histogram)
    return len([n for n in histogram if n]) > 20 and background < 0.97 * sum(histogram)


@needs_chromium
def test_home_page_and_an_api_page_render_in_chromium(site, tmp_path):
    with Chromium.start() as browser:
        browser.open((site / "index.html").as_uri())
        home = browser.evaluate(PAGE)
        assert home["title"].startswith("llm_marl")
        assert {"Getting started", "Writing a task", "API reference", "Configuration reference"} <= set(home["sidebar"]), home["sidebar"]
        assert any("llm-marl train" in block for block in home["code"])
        assert non_blank(browser.screenshot(str(tmp_path / "home.png")))

        browser.open((site / "api" / "learners.html").as_uri())
        api = browser.evaluate(PAGE)
        assert api["title"].startswith("Learners") and api["heading"].startswith("Learners")
        assert len(api["sidebar"]) == len(home["sidebar"])  # the same navigation on every page
        assert "llm_marl.MAGRPOTrainer" in api["classes"] and "llm_marl.MAACTrainer" in api["classes"]
        assert non_blank(browser.screenshot(str(tmp_path / "api.png")))
        assert browser.console_errors == []

"""Sphinx configuration of the llm_marl documentation site (furo theme, MyST Markdown pages).

Build it with ``python -m sphinx -W docs docs/_build`` (warnings are errors; CI builds it this way
through ``tests/test_docs_site.py``). The configuration reference is generated at build time from
the config dataclasses' field docs (``docs/_ext/config_reference.py``), so it cannot go stale.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(DOCS.parent))  # the checkout's llm_marl, installed or not
os.environ.setdefault("OMP_NUM_THREADS", "1")  # autodoc imports torch; a docs build needs no threads

project = "llm_marl"
author = "the llm_marl authors"
copyright = "the llm_marl authors, Apache License 2.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "config_reference",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3  # [text](page.md#a-heading) links to headings down to ###

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options: dict = {}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

smartquotes = False  # quotes stay as written: field docs, flags and messages are quoted exactly

html_theme = "furo"
html_title = "llm_marl"
html_static_path: list[str] = []

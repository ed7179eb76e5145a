"""The one-line documentation of config fields, read from the source (``llm-marl train --help``).

Every field of a learner config is followed in its class body by a string literal — its
documentation. Python keeps no such attribute at run time, so :func:`field_docs` parses the
class source with :mod:`ast` (the class and its bases; a subclass's string, where it has one, overrides its
base's). :func:`field_sections` gives the ``# --- section ---`` comment above each field, which
groups the flags in ``--help``.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap

_SECTION = re.compile(r"^\s*#\s*-+\s*(.+?)\s*-+\s*$")


def field_docs(config_class: type) -> dict[str, str]:
    """Field name -> its documentation string, first line joined (empty when it has none)."""
    docs: dict[str, str] = {}
    for klass in reversed(config_class.__mro__):
        for name, doc, _ in _documented_fields(klass):
            if doc or name not in docs:
                docs[name] = doc
    return {f.name: docs.get(f.name, "") for f in dataclasses.fields(config_class)}


def field_sections(config_class: type) -> dict[str, str]:
    """Field name -> the section comment (``# --- title ---``) it stands under ("" if none)."""
    sections: dict[str, str] = {}
    for klass in reversed(config_class.__mro__):
        for name, _, section in _documented_fields(klass):
            sections.setdefault(name, section)
    return {f.name: sections.get(f.name, "") for f in dataclasses.fields(config_class)}


def _documented_fields(klass: type) -> list[tuple[str, str, str]]:
    """(name, doc, section) of the annotated assignments in ``klass``'s own body."""
    if not dataclasses.is_dataclass(klass) or klass.__module__ == "builtins":
        return []
    try:
        source = textwrap.dedent(inspect.getsource(klass))
    except (OSError, TypeError):
        return []
    lines = source.splitlines()
    body = ast.parse(source).body[0].body
    out = []
    section = ""
    previous_end = 0
    for i, node in enumerate(body):
        for line in lines[previous_end : node.lineno - 1]:
            if match := _SECTION.match(line):
                section = match.group(1)
        previous_end = node.end_lineno or node.lineno
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        doc = ""
        following = body[i + 1] if i + 1 < len(body) else None
        if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant) and isinstance(following.value.value, str):
            doc = " ".join(following.value.value.split())
        out.append((node.target.id, doc, section))
    return out

"""Sphinx extension: the configuration reference, generated from the config dataclasses at build time.

The directive ``config-fields`` renders one config class's fields as tables grouped by their
``# --- section ---`` comments, each row with the field's type, its default and its one-line
documentation, read by :mod:`llm_marl.learners.config_docs` (what ``llm-marl train --help``
prints). With ``:base: OTHER`` it lists only the fields the class adds to OTHER or whose default
or documentation differs. A config class exported by ``llm_marl`` that no page documents is a
build warning (an error under ``-W``), so a new learner's config cannot be left out.

In a MyST page::

    ```{config-fields} llm_marl.IACConfig
    :base: llm_marl.MAGRPOConfig
    ```
"""

from __future__ import annotations

import dataclasses
import importlib
import re

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)


def _resolve(path: str) -> type:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _default(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        return repr(field.default)
    if field.default_factory is not dataclasses.MISSING:
        return repr(field.default_factory())
    return "(required)"


def _inline(text: str) -> list[nodes.Node]:
    """Plain text with ``code`` or `code` spans as literals."""
    out: list[nodes.Node] = []
    for i, part in enumerate(re.split(r"``?([^`]+)``?", text)):
        if part:
            out.append(nodes.literal(part, part) if i % 2 else nodes.Text(part))
    return out


def _table(rows: list[tuple[str, str, str, str]]) -> nodes.table:
    table = nodes.table(classes=["config-fields"])
    group = nodes.tgroup(cols=4)
    table += group
    for width in (22, 14, 14, 50):
        group += nodes.colspec(colwidth=width)
    head = nodes.thead()
    group += head
    body = nodes.tbody()
    group += body

    def row(cells: list[list[nodes.Node]]) -> nodes.row:
        r = nodes.row()
        for content in cells:
            entry = nodes.entry()
            entry += nodes.paragraph("", "", *content)
            r += entry
        return r

    head += row([[nodes.Text(t)] for t in ("field", "type", "default", "what it does")])
    for name, type_, default, doc in rows:
        body += row([[nodes.literal(name, name)], [nodes.literal(type_, type_)], [nodes.literal(default, default)], _inline(doc)])
    return table


class ConfigFields(SphinxDirective):
    required_arguments = 1
    option_spec = {"base": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        from llm_marl.learners.config_docs import field_docs, field_sections

        config_class = _resolve(self.arguments[0])
        fields = {f.name: f for f in dataclasses.fields(config_class)}
        docs, sections = field_docs(config_class), field_sections(config_class)
        shown = list(fields)
        if "base" in self.options:
            base = _resolve(self.options["base"])
            base_fields = {f.name: f for f in dataclasses.fields(base)}
            base_docs = field_docs(base)
            shown = [name for name in fields if name not in base_fields
                     or _default(fields[name]) != _default(base_fields[name]) or docs[name] != base_docs[name]]
        self.env.llm_marl_configs.setdefault(self.env.docname, set()).add(config_class.__name__)
        out: list[nodes.Node] = []
        if not shown:
            out.append(nodes.paragraph("", f"{config_class.__name__} changes no field of {self.options['base']}."))
            return out
        by_section: dict[str, list[tuple[str, str, str, str]]] = {}
        for name in shown:
            field = fields[name]
            type_ = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", str(field.type))
            by_section.setdefault(sections[name] or "other fields", []).append((name, type_, _default(field), docs[name]))
        for section, rows in by_section.items():
            out.append(nodes.rubric("", "", *_inline(section)))
            out.append(_table(rows))
        return out


def _init_env(app, env, docnames) -> None:
    if not hasattr(env, "llm_marl_configs"):
        env.llm_marl_configs = {}


def _purge(app, env, docname) -> None:
    getattr(env, "llm_marl_configs", {}).pop(docname, None)


def _merge(app, env, docnames, other) -> None:
    env.llm_marl_configs.update({d: other.llm_marl_configs[d] for d in docnames if d in other.llm_marl_configs})


def _check_every_config_documented(app, env) -> None:
    import llm_marl

    documented = set().union(*env.llm_marl_configs.values()) if env.llm_marl_configs else set()
    missing = sorted(name for name in llm_marl.__all__ if name.endswith("Config") and name not in documented)
    if missing:
        logger.warning("configuration reference: no config-fields directive documents %s", ", ".join(missing))


def setup(app):
    app.add_directive("config-fields", ConfigFields)
    app.connect("env-before-read-docs", _init_env)
    app.connect("env-purge-doc", _purge)
    app.connect("env-merge-info", _merge)
    app.connect("env-check-consistency", _check_every_config_documented)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}

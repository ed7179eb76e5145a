"""Reading a model's answer: the code in it (:func:`extract_code`) and the part of that which
is run (:func:`kept_code`), as described in :mod:`llm_marl.tasks.code`."""

from __future__ import annotations

import ast
import keyword
import re
import textwrap
from typing import NamedTuple

__all__ = ["Block", "code_blocks", "extract_code", "kept_code", "source_segment"]


def source_segment(lines: list[str], node: ast.AST) -> str:
    """The text of a statement ``node`` of the code split into ``lines``, decorators included."""
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return "\n".join(lines[first - 1 : node.end_lineno])


_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+.#-]*)")
_CODE_START = re.compile(
    r"^(?:async[ \t]+)?def[ \t]+\w+[ \t]*\(|^class[ \t]+\w+[ \t]*[:(]|^import[ \t]+[\w.]+"
    r"|^from[ \t]+[\w.]+[ \t]+import\b|^@[\w.]+"
)
_WORDS = re.compile(r"^([A-Za-z_][A-Za-z0-9_']*)[ \t]+[A-Za-z_]")
_MARKDOWN = re.compile(r"^(?:[-*+][ \t]|\*\*|\d+[.)][ \t]|>[ \t]?)")
_PYTHON_LANGS = {"", "python", "py", "python3", "py3"}


def _prose(line: str) -> bool:
    """A column-0 line of English rather than code ("Here is the helper:", "- a bullet")."""
    if not line or line[0].isspace() or line.startswith("#"):
        return False
    if _MARKDOWN.match(line):
        return True
    words = _WORDS.match(line)
    if words and not keyword.iskeyword(words.group(1)) and words.group(1) not in ("print", "match", "case", "type"):
        try:
            ast.parse(line)
        except SyntaxError:
            return True
    return False


def extract_code(text: str) -> str:
    """The code of a model's answer.

    With Markdown fences: the contents of every ``python``/``py``/unlabelled fenced block (an
    unclosed block runs to the end), joined by blank lines; if every block has another label,
    all blocks. Without fences: the text from its first line that starts a definition or import
    (``def``, ``async def``, ``class``, ``import``, ``from``, ``@``), with column-0 prose lines
    removed; if no line starts code, the whole text. Indentation common to all lines is removed.
    """
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    blocks: list[tuple[str, list[str]]] = []
    current: list[str] | None = None
    fence = ""
    for line in lines:
        match = _FENCE.match(line)
        if current is None:
            if match:
                fence, current = match.group(1), []
                blocks.append((match.group(2).lower(), current))
        elif match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence) and not match.group(2):
            current = None
        else:
            current.append(line)
    if blocks:
        chosen = [body for lang, body in blocks if lang in _PYTHON_LANGS] or [body for _, body in blocks]
        code = "\n\n".join(textwrap.dedent("\n".join(body)).strip("\n") for body in chosen)
        return code.strip("\n") + ("\n" if code.strip() else "")
    starts = [i for i, line in enumerate(lines) if _CODE_START.match(line.lstrip()) and not _prose(line)]
    if not starts:
        return textwrap.dedent("\n".join(lines)).strip("\n") + ("\n" if text.strip() else "")
    body = textwrap.dedent("\n".join(lines[starts[0] :])).split("\n")
    return "\n".join(line for line in body if not _prose(line)).strip("\n") + "\n"


class Block(NamedTuple):
    """One top-level statement of some code (see :func:`code_blocks`)."""

    kind: str  # "import", "def", "class" or "other"
    name: str | None
    text: str


def code_blocks(code: str) -> list[Block]:
    """Top-level statements of ``code`` (by its syntax tree, or by indentation when it does not parse)."""
    lines = code.split("\n")
    try:
        module = ast.parse(code)
    except (SyntaxError, ValueError):
        return _text_blocks(lines)
    blocks = []
    for node in module.body:
        text = source_segment(lines, node)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            blocks.append(Block("import", None, text))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            blocks.append(Block("def", node.name, text))
        elif isinstance(node, ast.ClassDef):
            blocks.append(Block("class", node.name, text))
        else:
            blocks.append(Block("other", None, text))
    return blocks


_HEAD = re.compile(r"^(?:async[ \t]+)?(def|class)[ \t]+([A-Za-z_]\w*)|^(import[ \t]+[\w.]|from[ \t]+[\w.]+[ \t]+import\b)")


def _text_blocks(lines: list[str]) -> list[Block]:
    """Split code that does not parse: a block starts at a column-0 line (not a comment or a
    closing bracket) that does not follow a decorator."""
    groups: list[list[str]] = []
    for line in lines:
        starts = bool(line) and not line[0].isspace() and line[0] not in "#)]}"
        decorated = bool(groups) and all(l.startswith(("@", "#")) or not l.strip() for l in groups[-1])
        if starts and not decorated:
            groups.append([line])
        elif groups:
            groups[-1].append(line)
        elif line.strip():
            groups.append([line])
    blocks = []
    for group in groups:
        head = next((l for l in group if not l.startswith("@")), group[0])
        match = _HEAD.match(head)
        text = "\n".join(group).rstrip()
        if match and match.group(1):
            blocks.append(Block(match.group(1), match.group(2), text))
        elif match:
            blocks.append(Block("import", None, text))
        else:
            blocks.append(Block("other", None, text))
    return blocks


def kept_code(answer: str, *, forbidden: str | None = None) -> str:
    """The part of ``answer`` that is run: its top-level imports, functions and classes (after
    :func:`extract_code`), without a definition named ``forbidden``."""
    kept = [b.text for b in code_blocks(extract_code(answer)) if b.kind != "other" and not (b.name and b.name == forbidden)]
    return "\n\n".join(kept) + ("\n" if kept else "")

"""An English corpus that ships with Python itself: the paragraphs of ``pydoc_data.topics``.

``pydoc_data.topics`` holds the text that ``help("assert")`` and friends print: the language
reference, written as English prose with code samples, grammar rules and tables mixed in. This
module keeps only the prose paragraphs, cleaned to one line of plain ASCII-ish text each, so that
small local language models (``llm_marl.policies.tiny``) can be warm-started and the writing task
can draw source texts without downloading anything.

The exact paragraphs depend on the Python version (the topics file changes between releases);
anything cached from them (tiny models) is keyed by a hash of the text, not by the version.
"""

from __future__ import annotations

import functools
import re

__all__ = ["pydoc_paragraphs"]

_HEADER = re.compile(r"^[*=\-~^]{3,}$")  # the underline of a section title
_MARKER = re.compile(r"^(\*|-|\d+\.|\[\d+\]) +")  # bullet, numbered item, footnote
_SENTENCE_END = re.compile(r"[.!?][\")]?$")
_PUNCT = str.maketrans(
    {
        "\u2018": "'",
        "\u2019": "'",
        "\u201c": '"',
        "\u201d": '"',
        "\u2013": "-",
        "\u2014": "-",
        "\u2026": "...",
        "\u00a0": " ",
    }
)


def _clean(block: str) -> str | None:
    """One prose paragraph as a single line, or None for code, grammar, tables and titles."""
    lines = [line for line in block.split("\n") if line.strip()]
    if not lines or any(_HEADER.match(line.strip()) for line in lines):
        return None
    text = " ".join(line.strip() for line in lines)
    if ">>>" in text or "::=" in text or text.startswith("..."):
        return None  # interactive sessions, grammar rules
    # Prose is a paragraph whose lines share one indentation; a bullet or footnote may hang.
    indents = [len(line) - len(line.lstrip()) for line in lines]
    hanging = _MARKER.match(lines[0].strip()) is not None
    if len(set(indents[1:])) > 1 or (len(indents) > 1 and indents[1] != indents[0] and not hanging):
        return None  # code blocks and nested structures
    text = _MARKER.sub("", text)
    text = re.sub(r"\s+", " ", text).translate(_PUNCT).strip()
    if len(text.split()) < 8 or not _SENTENCE_END.search(text):
        return None  # titles, signatures, "For example:" lead-ins
    if not (text[0].isupper() or text[0] in "\"*"):
        return None
    letters = sum(c.isalpha() or c == " " for c in text)
    if letters < 0.8 * len(text):
        return None  # mostly symbols: code or a table row
    return text


@functools.lru_cache(maxsize=1)
def _paragraphs() -> tuple[str, ...]:
    from pydoc_data.topics import topics

    seen: set[str] = set()
    out: list[str] = []
    for key in sorted(topics):
        for block in re.split(r"\n[ \t]*\n", topics[key]):
            text = _clean(block)
            if text is not None and text not in seen:
                seen.add(text)
                out.append(text)
    return tuple(out)


def pydoc_paragraphs() -> list[str]:
    """English prose paragraphs from Python's own documentation (``pydoc_data.topics``).

    Each paragraph is one line of cleaned text (typographic quotes and dashes made ASCII,
    whitespace collapsed) of at least 8 words ending like a sentence; code samples, grammar rules,
    tables, titles and duplicates are dropped. The order is deterministic (topics sorted by name,
    paragraphs in reading order). About 900 paragraphs (~215k characters, median ~30 words) on
    CPython 3.11; the count varies a little between Python versions.

    Returns a new list each call, so callers may shuffle or slice it freely.
    """
    return list(_paragraphs())

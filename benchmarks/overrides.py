"""``--set FIELD=VALUE`` for the benchmark scripts that run ``llm-marl train`` settings."""

from __future__ import annotations

import json


def parse_sets(items: list[str]) -> dict:
    """``["a=1", "b=x"]`` -> ``{"a": 1, "b": "x"}``: each value read as JSON, else kept as text."""
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set {item!r}: expected FIELD=VALUE")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    return overrides

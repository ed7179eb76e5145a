"""The coding task itself: :class:`CoopCodeTask`, its multi-turn feedback and its evaluation
hooks, as described in :mod:`llm_marl.tasks.code`."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import datasets

from llm_marl.tasks.base import CooperativeTask
from llm_marl.tasks.code.humaneval import split_name, split_problems
from llm_marl.tasks.code.reward import AUX_NAME, MAX_SCORE, score_answers

__all__ = ["FEEDBACK_MODES", "CoopCodeTask", "eval_aggregator", "eval_logger", "full_feedback"]

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

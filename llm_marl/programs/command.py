"""``llm-marl train --program FILE.py:FUNCTION [--agents a,b] [--items FILE.jsonl]``.

The program is registered as an env id (``FILE.FUNCTION``, built by
:func:`~llm_marl.programs.loading.program_env`) and the run goes on as with ``--env``: any
``--learner``, ``--policy lm --model M``. The agents come from ``--agents`` or the module's
``agents``, the items from ``--items`` or the module's ``items``, the most steps from
``--num_turns`` or the module's ``num_turns``.
"""

from __future__ import annotations


def program_option(program: str, agents: str | None, items: str | None, env: str | None = None) -> str:
    """The env id for ``--program``; a ``ValueError`` that names the flag for bad usage (the
    command turns it into a usage error)."""
    from llm_marl.programs.loading import program_env_id

    if env:
        raise ValueError(f"--program {program} and --env {env}: give one of them")
    source, sep, name = program.rpartition(":")
    if not sep or not source or not name:
        raise ValueError(f"--program {program}: name a function as FILE.py:FUNCTION (or package.module:function)")
    return program_env_id(program, agents, items)

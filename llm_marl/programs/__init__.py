"""Programs as environments: train the agents of any multi-agent program written against an
OpenAI-compatible client (docs/programs.md).

- :mod:`~llm_marl.programs.env`: :class:`ProgramEnv`, a program as a PettingZoo parallel env;
- :mod:`~llm_marl.programs.run`: one execution of a program and the rule for which calls form a step;
- :mod:`~llm_marl.programs.endpoint`: the local endpoint the program calls;
- :mod:`~llm_marl.programs.messages`: calls as observations, and their space;
- :mod:`~llm_marl.programs.loading`: ``FILE.py:FUNCTION``, agents and items; :func:`program_env`;
- :mod:`~llm_marl.programs.errors`: :class:`ProgramError`, :class:`ProgramDivergenceError`.

Needs the extra ``program`` (``pip install llm_marl[program]``: openai, starlette, uvicorn).
Importing this package imports none of them.
"""

from llm_marl import _lazy_exports

__all__, __getattr__, __dir__ = _lazy_exports(
    __name__,
    {
        "llm_marl.programs.env": ("ProgramEnv", "ProgramWarning", "ProgramBranch"),
        "llm_marl.programs.errors": ("ProgramError", "ProgramDivergenceError"),
        "llm_marl.programs.loading": ("program_env", "load_program"),
        "llm_marl.programs.messages": ("Messages",),
    },
)

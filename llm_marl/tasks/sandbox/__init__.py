"""Deprecated: the sandbox is now :mod:`llm_marl.sandbox`; this name re-exports it for one release.

Importing it warns with a :class:`DeprecationWarning`; replace ``llm_marl.tasks.sandbox`` with
``llm_marl.sandbox`` in your imports.
"""

import warnings

from llm_marl.sandbox import (
    LoadError,
    SandboxError,
    SandboxResult,
    TestOutcome,
    TestReport,
    run_program,
    run_programs,
    run_tests,
)

__all__ = [
    "LoadError",
    "SandboxError",
    "SandboxResult",
    "TestOutcome",
    "TestReport",
    "run_program",
    "run_programs",
    "run_tests",
]

warnings.warn(
    "llm_marl.tasks.sandbox is deprecated and will be removed; import llm_marl.sandbox instead",
    DeprecationWarning,
    stacklevel=2,
)

"""Deprecated: the sandbox is now :mod:`llm_marl.sandbox`; this name re-exports it for one release.

Importing it warns with a :class:`DeprecationWarning`; replace ``llm_marl.tasks.sandbox`` with
``llm_marl.sandbox`` in your imports.
"""

import warnings

from llm_marl.sandbox import *  # noqa: F403 (the names and __all__ of llm_marl.sandbox)
from llm_marl.sandbox import __all__  # noqa: F401

warnings.warn(
    "llm_marl.tasks.sandbox is deprecated and will be removed; import llm_marl.sandbox instead",
    DeprecationWarning,
    stacklevel=2,
)

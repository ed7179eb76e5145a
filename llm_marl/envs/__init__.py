"""The PettingZoo face of a task.

The names below are imported on first use (as in :mod:`llm_marl`), so that ``llm-marl list``
reads the registry without loading the env classes and their dependencies.
"""

from llm_marl import _lazy_exports
from llm_marl._moved import alias_modules

alias_modules({"llm_marl.envs.plugins": "llm_marl.envs.registry"})

__all__, __getattr__, __dir__ = _lazy_exports(
    __name__,
    {
        "llm_marl.envs.adapters": ("DiscreteMenuWrapper", "TokenIdsWrapper"),
        "llm_marl.envs.dialogue": ("Branch", "DialogueEnv", "ScoredStep"),
        "llm_marl.envs.registry": ("make", "register", "registered_ids"),
        "llm_marl.envs.spaces": ("Utterance",),
        "llm_marl.envs.turn_based": ("AECWrapper",),
        "llm_marl.programs.env": ("ProgramEnv",),
        "llm_marl.programs.loading": ("program_env",),
    },
)

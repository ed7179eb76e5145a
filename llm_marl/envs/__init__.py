"""The PettingZoo face of a task."""

from llm_marl._moved import alias_modules

alias_modules({"llm_marl.envs.plugins": "llm_marl.envs.registry"})

from llm_marl.envs.adapters import DiscreteMenuWrapper, TokenIdsWrapper
from llm_marl.envs.dialogue import Branch, DialogueEnv, ScoredStep
from llm_marl.envs.registry import make, register, registered_ids
from llm_marl.envs.spaces import Utterance
from llm_marl.envs.turn_based import AECWrapper

__all__ = [
    "AECWrapper",
    "Branch",
    "ScoredStep",
    "DialogueEnv",
    "DiscreteMenuWrapper",
    "TokenIdsWrapper",
    "Utterance",
    "make",
    "register",
    "registered_ids",
]

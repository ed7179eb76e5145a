"""What acts: tabular, scripted and language-model policies behind one protocol."""

from llm_marl.policies.base import Completion, Policy
from llm_marl.policies.causal_lm import CausalLMPolicy
from llm_marl.policies.scripted import ScriptedPolicy
from llm_marl.policies.tabular import TabularPolicy

__all__ = ["CausalLMPolicy", "Completion", "Policy", "ScriptedPolicy", "TabularPolicy"]

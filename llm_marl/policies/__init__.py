"""What acts: tabular, scripted and language-model policies (full models, or a team of LoRA
adapters on one base) behind one protocol; and what judges:
critics (tabular and language-model value heads) for the actor-critic learners."""

from llm_marl.policies.adapter_critic import AdapterCritic
from llm_marl.policies.base import Completion, Policy
from llm_marl.policies.causal_lm import CausalLMPolicy
from llm_marl.policies.critic import Critic, joint_observation
from llm_marl.policies.lm_critic import CausalLMCritic, ValueHead
from llm_marl.policies.lora_team import AdapterPolicy, LoRATeam
from llm_marl.policies.scripted import ScriptedPolicy
from llm_marl.policies.tabular import TabularPolicy
from llm_marl.policies.tabular_critic import TabularCritic

__all__ = [
    "AdapterCritic",
    "AdapterPolicy",
    "CausalLMCritic",
    "CausalLMPolicy",
    "Completion",
    "Critic",
    "LoRATeam",
    "Policy",
    "ScriptedPolicy",
    "TabularCritic",
    "TabularPolicy",
    "ValueHead",
    "joint_observation",
]

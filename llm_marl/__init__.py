"""llm_marl: train teams of language models to cooperate with reinforcement learning."""

from llm_marl.envs import DialogueEnv, make, register
from llm_marl.learners import (
    IACConfig,
    IACTrainer,
    MAACConfig,
    MAACTrainer,
    MAGRPOConfig,
    MAGRPOTrainer,
    MAREINFORCEConfig,
    MAREINFORCETrainer,
    MARLOOConfig,
    MARLOOTrainer,
    MAReMaxConfig,
    MAReMaxTrainer,
)
from llm_marl.policies import (
    CausalLMCritic,
    CausalLMPolicy,
    Completion,
    Critic,
    LoRATeam,
    Policy,
    ScriptedPolicy,
    TabularCritic,
    TabularPolicy,
)
from llm_marl.tasks import CooperativeTask, FunctionTask, Turn

__all__ = [
    "CausalLMCritic",
    "CausalLMPolicy",
    "Completion",
    "CooperativeTask",
    "Critic",
    "DialogueEnv",
    "FunctionTask",
    "IACConfig",
    "IACTrainer",
    "LoRATeam",
    "MAACConfig",
    "MAACTrainer",
    "MAGRPOConfig",
    "MAGRPOTrainer",
    "MAREINFORCEConfig",
    "MAREINFORCETrainer",
    "MARLOOConfig",
    "MARLOOTrainer",
    "MAReMaxConfig",
    "MAReMaxTrainer",
    "Policy",
    "ScriptedPolicy",
    "TabularCritic",
    "TabularPolicy",
    "Turn",
    "make",
    "register",
]

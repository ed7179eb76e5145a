"""What learns: the MAREINFORCE family on K-branch rollout trees, and the actor-critic learners."""

from llm_marl.learners.actor_critic import IACTrainer, MAACTrainer
from llm_marl.learners.actor_critic_config import IACConfig, MAACConfig
from llm_marl.learners.config import MAGRPOConfig, MAREINFORCEConfig, MARLOOConfig, MAReMaxConfig
from llm_marl.learners.reinforce import MAGRPOTrainer, MAREINFORCETrainer, MARLOOTrainer, MAReMaxTrainer

__all__ = [
    "IACConfig",
    "IACTrainer",
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
]

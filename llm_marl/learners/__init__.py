"""What learns: the MAREINFORCE family on K-branch rollout trees."""

from llm_marl.learners.config import MAGRPOConfig, MAREINFORCEConfig, MARLOOConfig, MAReMaxConfig
from llm_marl.learners.reinforce import MAGRPOTrainer, MAREINFORCETrainer, MARLOOTrainer, MAReMaxTrainer

__all__ = [
    "MAGRPOConfig",
    "MAGRPOTrainer",
    "MAREINFORCEConfig",
    "MAREINFORCETrainer",
    "MARLOOConfig",
    "MARLOOTrainer",
    "MAReMaxConfig",
    "MAReMaxTrainer",
]

"""CoMLRL's ``comlrl.trainers``: the REINFORCE family, the actor-critic learners and the
preference learners (see :mod:`llm_marl.comlrl`)."""

from llm_marl.comlrl.trainers.actor_critic import ActorCriticTrainerBase, IACConfig, IACTrainer, MAACConfig, MAACTrainer
from llm_marl.comlrl.trainers.preference import JointRewardModel, MADPOConfig, MADPOTrainer, MARLHFConfig, MARLHFTrainer
from llm_marl.comlrl.trainers.reinforce import (
    MAGRPOConfig,
    MAGRPOTrainer,
    MAREINFORCEConfig,
    MAREINFORCETrainer,
    MARLOOConfig,
    MARLOOTrainer,
    MAReMaxConfig,
    MAReMaxTrainer,
)

__all__ = [
    "ActorCriticTrainerBase",
    "IACConfig",
    "IACTrainer",
    "JointRewardModel",
    "MAACConfig",
    "MAACTrainer",
    "MADPOConfig",
    "MADPOTrainer",
    "MAGRPOConfig",
    "MAGRPOTrainer",
    "MAREINFORCEConfig",
    "MAREINFORCETrainer",
    "MARLOOConfig",
    "MARLOOTrainer",
    "MAReMaxConfig",
    "MAReMaxTrainer",
    "MARLHFConfig",
    "MARLHFTrainer",
]

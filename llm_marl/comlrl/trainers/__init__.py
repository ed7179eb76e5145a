"""CoMLRL's ``comlrl.trainers``: the REINFORCE family (see :mod:`llm_marl.comlrl`)."""

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
    "MAGRPOConfig",
    "MAGRPOTrainer",
    "MAREINFORCEConfig",
    "MAREINFORCETrainer",
    "MARLOOConfig",
    "MARLOOTrainer",
    "MAReMaxConfig",
    "MAReMaxTrainer",
]

"""CoMLRL's ``comlrl.trainers.reinforce``: MAGRPO, centralized MAGRPO, MAREINFORCE, MARLOO and MAReMax configs and
trainers (see :mod:`llm_marl.comlrl`)."""

from llm_marl.comlrl.trainers.reinforce.centralized_magrpo import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer
from llm_marl.comlrl.trainers.reinforce.magrpo import MAGRPOConfig, MAGRPOTrainer
from llm_marl.comlrl.trainers.reinforce.mareinforce import MAREINFORCEConfig, MAREINFORCETrainer
from llm_marl.comlrl.trainers.reinforce.maremax import MAReMaxConfig, MAReMaxTrainer
from llm_marl.comlrl.trainers.reinforce.marloo import MARLOOConfig, MARLOOTrainer

__all__ = [
    "CentralizedMAGRPOConfig",
    "CentralizedMAGRPOTrainer",
    "MAGRPOConfig",
    "MAGRPOTrainer",
    "MAREINFORCEConfig",
    "MAREINFORCETrainer",
    "MARLOOConfig",
    "MARLOOTrainer",
    "MAReMaxConfig",
    "MAReMaxTrainer",
]

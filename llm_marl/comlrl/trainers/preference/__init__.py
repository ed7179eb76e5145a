"""CoMLRL's ``comlrl.trainers.preference``: MADPO, MARLHF with its joint reward model, their
iterative variants, and the centralized comparator adapters (see :mod:`llm_marl.comlrl`; docs/preference.md)."""

from llm_marl.comlrl.trainers.preference.centralized import (
    CentralizedComparatorAdapter,
    CentralizedComparatorParseError,
    TaggedCentralizedComparatorAdapter,
)
from llm_marl.comlrl.trainers.preference.iterative import MADPOIterConfig, MADPOIterTrainer, MARLHFIterConfig, MARLHFIterTrainer
from llm_marl.comlrl.trainers.preference.madpo import MADPOConfig, MADPOTrainer
from llm_marl.comlrl.trainers.preference.marlhf import JointRewardModel, MARLHFConfig, MARLHFTrainer

__all__ = [
    "CentralizedComparatorAdapter",
    "CentralizedComparatorParseError",
    "JointRewardModel",
    "MADPOConfig",
    "MADPOIterConfig",
    "MADPOIterTrainer",
    "MADPOTrainer",
    "MARLHFConfig",
    "MARLHFIterConfig",
    "MARLHFIterTrainer",
    "MARLHFTrainer",
    "TaggedCentralizedComparatorAdapter",
]

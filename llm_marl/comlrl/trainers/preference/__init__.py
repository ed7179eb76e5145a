"""CoMLRL's ``comlrl.trainers.preference``: MADPO, MARLHF with its joint reward model, and the
centralized comparator adapters (see :mod:`llm_marl.comlrl`; docs/preference.md)."""

from llm_marl.comlrl.trainers.preference.centralized import (
    CentralizedComparatorAdapter,
    CentralizedComparatorParseError,
    TaggedCentralizedComparatorAdapter,
)
from llm_marl.comlrl.trainers.preference.madpo import MADPOConfig, MADPOTrainer
from llm_marl.comlrl.trainers.preference.marlhf import JointRewardModel, MARLHFConfig, MARLHFTrainer

__all__ = [
    "CentralizedComparatorAdapter",
    "CentralizedComparatorParseError",
    "JointRewardModel",
    "MADPOConfig",
    "MADPOTrainer",
    "MARLHFConfig",
    "MARLHFTrainer",
    "TaggedCentralizedComparatorAdapter",
]

"""CoMLRL's ``comlrl.trainers.preference.centralized``: the comparator adapters that turn every
role's prompt into one centralized prompt and split one centralized answer back into roles
(:mod:`llm_marl.learners.centralized`). The preference trainers here are decentralized; the
adapters serve :class:`~llm_marl.comlrl.trainers.reinforce.centralized_magrpo.CentralizedMAGRPOTrainer`
and scripts that use them directly."""

from llm_marl.learners.centralized import (
    CentralizedComparatorAdapter,
    CentralizedComparatorParseError,
    TaggedCentralizedComparatorAdapter,
    check_adapter,
)

__all__ = ["CentralizedComparatorAdapter", "CentralizedComparatorParseError", "TaggedCentralizedComparatorAdapter", "check_adapter"]

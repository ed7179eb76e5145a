"""CoMLRL's ``comlrl.trainers.preference.iterative``: MADPOIter and MARLHFIter on
:mod:`llm_marl.learners.preference.iterative` (only ``comparator_policy="current"`` is built;
docs/preference.md lists the differences)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llm_marl.comlrl.trainers.preference.centralized import centralized_keywords, check_adapter
from llm_marl.comlrl.trainers.preference.marlhf import CoMLRLJointText, RLPhaseKeywords
from llm_marl.learners.preference import iterative as _iter
from llm_marl.comlrl.anchor_compat import ADAMW_DEFAULT_WEIGHT_DECAY, CoMLRLTrain, normalize_comlrl_fields
from llm_marl.comlrl.trainer_surface import CoMLRLSurface


@dataclass
class MADPOIterConfig(_iter.MADPOIterConfig):
    """:class:`llm_marl.learners.preference.iterative.MADPOIterConfig` with CoMLRL's defaults."""

    weight_decay: float = ADAMW_DEFAULT_WEIGHT_DECAY
    """AdamW weight decay; CoMLRL's optimizer is torch AdamW with its default (0.01)."""
    dpo_reference: bool = False
    """CoMLRL 1.4.3's margin is reference-free (log pi(w) - log pi(l)); True: against a frozen copy."""

    def __post_init__(self) -> None:
        normalize_comlrl_fields(self)
        super().__post_init__()


@dataclass
class MARLHFIterConfig(_iter.MARLHFIterConfig):
    """:class:`llm_marl.learners.preference.iterative.MARLHFIterConfig` with CoMLRL's optimizer default."""

    weight_decay: float = ADAMW_DEFAULT_WEIGHT_DECAY
    """AdamW weight decay; CoMLRL's optimizers are torch AdamW with its default (0.01)."""
    dpo_reference: bool = False
    """Unused by MARLHF (pairs train the reward model); False as in CoMLRL's MADPO."""

    def __post_init__(self) -> None:
        normalize_comlrl_fields(self)
        super().__post_init__()


class MADPOIterTrainer(CoMLRLSurface, CoMLRLTrain, _iter.MADPOIterTrainer):
    """:class:`llm_marl.learners.preference.iterative.MADPOIterTrainer` with CoMLRL's keywords and ``train()``."""

    config_class = MADPOIterConfig

    def __init__(self, *args: Any, centralized_comparator_adapter: Any = None, **kwargs: Any):
        self.centralized_comparator_adapter = check_adapter(centralized_comparator_adapter)
        kwargs["centralized_comparator_adapter"] = self.centralized_comparator_adapter
        kwargs = centralized_keywords(args, kwargs)
        super().__init__(*args, **kwargs)


class MARLHFIterTrainer(CoMLRLSurface, CoMLRLJointText, RLPhaseKeywords, CoMLRLTrain, _iter.MARLHFIterTrainer):
    """:class:`llm_marl.learners.preference.iterative.MARLHFIterTrainer` with CoMLRL's keywords,
    ``train()`` and reward-model text
    (:class:`~llm_marl.comlrl.trainers.preference.marlhf.CoMLRLJointText`); ``metrics_callback``,
    ``critic_model`` and ``critics`` go to the IAC / MAAC RL phase
    (:class:`~llm_marl.comlrl.trainers.preference.marlhf.RLPhaseKeywords`)."""

    config_class = MARLHFIterConfig


@dataclass
class PreferenceReplayShard:
    """CoMLRL's record of one round's saved preference pairs (llm_marl's iterative trainers keep
    their replay in ``preference_replay_dir`` themselves and do not make these)."""

    iteration: int
    """The round."""
    path: str
    """The file holding the round's pairs."""
    num_pairs: int
    """How many pairs it holds."""


__all__ = ["MADPOIterConfig", "MADPOIterTrainer", "MARLHFIterConfig", "MARLHFIterTrainer", "PreferenceReplayShard"]

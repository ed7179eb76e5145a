"""CoMLRL's ``comlrl.trainers.reinforce.maremax``: MAReMax with a max baseline, on :mod:`llm_marl.learners`."""

from __future__ import annotations

from dataclasses import dataclass

from llm_marl.learners.reinforce import config as _config
from llm_marl.learners.reinforce import trainer as _reinforce
from llm_marl.comlrl.anchor_compat import ADAMW_DEFAULT_WEIGHT_DECAY, CoMLRLTrain, normalize_comlrl_fields
from llm_marl.comlrl.trainer_surface import CoMLRLSurface


@dataclass
class MAReMaxConfig(_config.MAReMaxConfig):
    """:class:`llm_marl.learners.reinforce.config.MAReMaxConfig` with CoMLRL's optimizer default."""

    weight_decay: float = ADAMW_DEFAULT_WEIGHT_DECAY
    """AdamW weight decay; CoMLRL's optimizer is torch AdamW with its default (0.01)."""

    def __post_init__(self) -> None:
        normalize_comlrl_fields(self)
        super().__post_init__()


class MAReMaxTrainer(CoMLRLSurface, CoMLRLTrain, _reinforce.MAReMaxTrainer):
    """:class:`llm_marl.learners.reinforce.trainer.MAReMaxTrainer` with CoMLRL's ``train()`` signature."""

    config_class = MAReMaxConfig


__all__ = ["MAReMaxConfig", "MAReMaxTrainer"]

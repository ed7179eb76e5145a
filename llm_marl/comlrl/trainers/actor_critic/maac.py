"""CoMLRL's ``comlrl.trainers.actor_critic.maac``: MAAC (one central critic for the team), on :mod:`llm_marl.learners`."""

from __future__ import annotations

from dataclasses import dataclass

from llm_marl.learners.actor_critic import trainer as _actor_critic
from llm_marl.learners.actor_critic import config as _config
from llm_marl.comlrl.anchor_compat import ADAMW_DEFAULT_WEIGHT_DECAY, CoMLRLTrain, normalize_comlrl_fields
from llm_marl.comlrl.trainer_surface import CoMLRLActorCriticSurface


@dataclass
class MAACConfig(_config.MAACConfig):
    """:class:`llm_marl.learners.actor_critic.config.MAACConfig` with CoMLRL's optimizer default and units
    (``rollout_buffer_size`` and ``train_batch_size`` count answers)."""

    weight_decay: float = ADAMW_DEFAULT_WEIGHT_DECAY
    """AdamW weight decay of actors and critics; CoMLRL's optimizers are torch AdamW with its default (0.01)."""
    sample_unit: str | None = "answer"
    """rollout_buffer_size and train_batch_size count answers, as in CoMLRL 1.4.3 ("group": G answers to one prompt)."""

    def __post_init__(self) -> None:
        normalize_comlrl_fields(self)
        super().__post_init__()


class MAACTrainer(CoMLRLActorCriticSurface, CoMLRLTrain, _actor_critic.MAACTrainer):
    """:class:`llm_marl.learners.actor_critic.trainer.MAACTrainer` with CoMLRL's ``train()`` signature."""

    config_class = MAACConfig


__all__ = ["MAACConfig", "MAACTrainer"]

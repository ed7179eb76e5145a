"""CoMLRL's ``comlrl.trainers.actor_critic``: IAC and MAAC configs and trainers (see
:mod:`llm_marl.comlrl`; the semantics and the anchor's quirks fixed on purpose are in
docs/actor_critic_learners.md)."""

from llm_marl.comlrl.trainers.actor_critic.iac import IACConfig, IACTrainer
from llm_marl.comlrl.trainers.actor_critic.maac import MAACConfig, MAACTrainer
from llm_marl.learners.actor_critic.trainer import ActorCriticTrainerBase, RolloutSample

__all__ = ["ActorCriticTrainerBase", "IACConfig", "IACTrainer", "MAACConfig", "MAACTrainer", "RolloutSample"]

"""CoMLRL's ``comlrl.trainers.actor_critic.ac_base``: the base class of the actor-critic trainers
(:class:`llm_marl.learners.actor_critic.trainer.ActorCriticTrainerBase`, which IAC and MAAC extend)."""

from llm_marl.learners.actor_critic.trainer import ActorCriticTrainerBase

__all__ = ["ActorCriticTrainerBase"]

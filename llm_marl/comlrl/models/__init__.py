"""CoMLRL's ``comlrl.models`` (see :mod:`llm_marl.comlrl.models.actor_critic`)."""

from llm_marl.comlrl.models.actor_critic import ActorCriticOutput, CausalLMWithValueHead, ValueHead

__all__ = ["ActorCriticOutput", "CausalLMWithValueHead", "ValueHead"]

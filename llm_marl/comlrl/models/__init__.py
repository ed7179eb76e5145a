"""CoMLRL's ``comlrl.models`` (see :mod:`llm_marl.comlrl.models.actor_critic`)."""

"""CoMLRL's ``comlrl.utils``: the reward processors (see :mod:`llm_marl.comlrl`)."""

from llm_marl.comlrl.utils.reward_processor import RewardProcessors

__all__ = ["RewardProcessors"]

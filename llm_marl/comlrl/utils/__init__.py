"""CoMLRL's ``comlrl.utils``: the reward processors, the formatter builder and the reward-call
helpers (see :mod:`llm_marl.comlrl`)."""

from llm_marl.comlrl.utils.formatters import build_formatters
from llm_marl.comlrl.utils.reward_processor import RewardProcessors
from llm_marl.comlrl.utils.reward_utils import call_reward_function, normalize_reward_lengths, resolve_reward_range, set_reward_range

__all__ = ["RewardProcessors", "build_formatters", "call_reward_function", "normalize_reward_lengths", "resolve_reward_range", "set_reward_range"]

"""The REINFORCE family: MAGRPO, MAREINFORCE, MARLOO and MAReMax on K-branch rollout trees
(:mod:`.trainer`, :mod:`.config`), and centralized MAGRPO (:mod:`.centralized`).

Until issue 38 ``llm_marl.learners.reinforce`` was the trainer module: its other names (such as
``default_optimizer``) still resolve here for one release, with a ``DeprecationWarning``.
"""

from llm_marl import _lazy_exports
from llm_marl._moved import forward_old_names

__all__, _getattr, __dir__ = _lazy_exports(
    __name__,
    {
        "llm_marl.learners.reinforce.config": ("MAGRPOConfig", "MAREINFORCEConfig", "MARLOOConfig", "MAReMaxConfig"),
        "llm_marl.learners.reinforce.trainer": ("MAGRPOTrainer", "MAREINFORCETrainer", "MARLOOTrainer", "MAReMaxTrainer"),
        "llm_marl.learners.reinforce.centralized": ("CentralizedMAGRPOConfig", "CentralizedMAGRPOTrainer"),
    },
)
__getattr__ = forward_old_names(__name__, "llm_marl.learners.reinforce.trainer", _getattr)

"""The actor-critic family: IAC and MAAC (:mod:`.trainer`, :mod:`.config`), their pure math
(:mod:`.math`: returns, GAE, critic targets).

Until issue 38 ``llm_marl.learners.actor_critic`` was the trainer module: its other names (such as
``ActorCriticTrainerBase``) still resolve here for one release, with a ``DeprecationWarning``.
"""

from llm_marl import _lazy_exports
from llm_marl._moved import forward_old_names

__all__, _getattr, __dir__ = _lazy_exports(
    __name__,
    {
        "llm_marl.learners.actor_critic.config": ("IACConfig", "MAACConfig"),
        "llm_marl.learners.actor_critic.trainer": ("IACTrainer", "MAACTrainer"),
    },
)
__getattr__ = forward_old_names(__name__, "llm_marl.learners.actor_critic.trainer", _getattr)

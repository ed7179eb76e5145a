"""The preference family: MADPO (:mod:`.madpo`), MARLHF and its joint reward model
(:mod:`.reward_model`), their iterative versions (:mod:`.iterative`) and the losses (:mod:`.math`).

Until issue 38 ``llm_marl.learners.preference`` was the MADPO module: its other names (such as
``PreferenceSample``) still resolve here for one release, with a ``DeprecationWarning``.
"""

from llm_marl import _lazy_exports
from llm_marl._moved import forward_old_names

__all__, _getattr, __dir__ = _lazy_exports(
    __name__,
    {
        "llm_marl.learners.preference.madpo": ("MADPOConfig", "MADPOTrainer"),
        "llm_marl.learners.preference.iterative": ("MADPOIterConfig", "MADPOIterTrainer", "MARLHFIterConfig", "MARLHFIterTrainer"),
        "llm_marl.learners.preference.reward_model": ("JointRewardModel", "MARLHFConfig", "MARLHFTrainer"),
    },
)
__getattr__ = forward_old_names(__name__, "llm_marl.learners.preference.madpo", _getattr)

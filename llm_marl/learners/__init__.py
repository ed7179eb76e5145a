"""What learns: the MAREINFORCE family on K-branch rollout trees, and the actor-critic learners.

The names below are imported on first use (see :mod:`llm_marl`), so that importing a light
submodule such as :mod:`llm_marl.learners.config` does not load torch. What a run leaves behind
(run folder, checkpoints, logs, recordings, interrupts, distributed helpers) moved to
:mod:`llm_marl.runs`, and the drop-in constructor to :mod:`llm_marl.comlrl.anchor_compat`; their
old paths under ``llm_marl.learners`` import for one release with a ``DeprecationWarning``.
"""

from llm_marl import _lazy_exports
from llm_marl._moved import alias_modules

alias_modules(
    {
        **{f"llm_marl.learners.{m}": f"llm_marl.runs.{m}"
           for m in ("checkpoint", "distributed", "interrupt", "logging", "recording", "run_dir", "run_folder")},
        "llm_marl.learners.anchor_compat": "llm_marl.comlrl.anchor_compat",
    }
)

__all__, __getattr__, __dir__ = _lazy_exports(
    __name__,
    {
        "llm_marl.learners.actor_critic": ("IACTrainer", "MAACTrainer"),
        "llm_marl.learners.actor_critic_config": ("IACConfig", "MAACConfig"),
        "llm_marl.learners.centralized": ("CentralizedMAGRPOConfig", "CentralizedMAGRPOTrainer"),
        "llm_marl.learners.preference": ("MADPOConfig", "MADPOTrainer"),
        "llm_marl.learners.preference_iter": ("MADPOIterConfig", "MADPOIterTrainer", "MARLHFIterConfig", "MARLHFIterTrainer"),
        "llm_marl.learners.reward_model": ("JointRewardModel", "MARLHFConfig", "MARLHFTrainer"),
        "llm_marl.learners.config": ("MAGRPOConfig", "MAREINFORCEConfig", "MARLOOConfig", "MAReMaxConfig"),
        "llm_marl.learners.reinforce": ("MAGRPOTrainer", "MAREINFORCETrainer", "MARLOOTrainer", "MAReMaxTrainer"),
    },
)

"""What learns, by family: :mod:`.reinforce` (MAGRPO, MAREINFORCE, MARLOO, MAReMax, centralized
MAGRPO), :mod:`.actor_critic` (IAC, MAAC) and :mod:`.preference` (MADPO, MARLHF, their iterative
versions), beside the core they share: rollout trees (:mod:`.tree`), samples and buffers
(:mod:`.buffer`), the joint update (:mod:`.update`), evaluation, checks, and the config base and
its typing (:mod:`.config`, :mod:`.config_types`, :mod:`.config_docs`).

The names below are imported on first use (see :mod:`llm_marl`), so that importing a light
submodule such as :mod:`llm_marl.learners.config` does not load torch. What a run leaves behind
(run folder, checkpoints, logs, recordings, interrupts, distributed helpers) moved to
:mod:`llm_marl.runs`, the drop-in constructor to :mod:`llm_marl.comlrl.anchor_compat`, and the
learners' modules into their family folders (issue 38); the advantage math is defined a floor
below, in :mod:`llm_marl.advantages` (:mod:`.advantages` re-exports it), beside
:mod:`llm_marl.rollouts`, so that :mod:`llm_marl.runs` needs nothing from here. The moved
modules' old paths under ``llm_marl.learners`` import for one release with a ``DeprecationWarning``.
"""

from llm_marl import _lazy_exports
from llm_marl._moved import alias_modules

alias_modules(
    {
        **{f"llm_marl.learners.{m}": f"llm_marl.runs.{m}"
           for m in ("checkpoint", "distributed", "interrupt", "logging", "recording", "run_dir", "run_folder")},
        "llm_marl.learners.anchor_compat": "llm_marl.comlrl.anchor_compat",
        "llm_marl.learners.centralized": "llm_marl.learners.reinforce.centralized",
        "llm_marl.learners.actor_critic_config": "llm_marl.learners.actor_critic.config",
        "llm_marl.learners.actor_critic_math": "llm_marl.learners.actor_critic.math",
        "llm_marl.learners.preference_iter": "llm_marl.learners.preference.iterative",
        "llm_marl.learners.preference_math": "llm_marl.learners.preference.math",
        "llm_marl.learners.reward_model": "llm_marl.learners.preference.reward_model",
    }
)

__all__, __getattr__, __dir__ = _lazy_exports(
    __name__,
    {
        "llm_marl.learners.actor_critic.trainer": ("IACTrainer", "MAACTrainer"),
        "llm_marl.learners.actor_critic.config": ("IACConfig", "MAACConfig"),
        "llm_marl.learners.reinforce.centralized": ("CentralizedMAGRPOConfig", "CentralizedMAGRPOTrainer"),
        "llm_marl.learners.preference.madpo": ("MADPOConfig", "MADPOTrainer"),
        "llm_marl.learners.preference.iterative": ("MADPOIterConfig", "MADPOIterTrainer", "MARLHFIterConfig", "MARLHFIterTrainer"),
        "llm_marl.learners.preference.reward_model": ("JointRewardModel", "MARLHFConfig", "MARLHFTrainer"),
        "llm_marl.learners.config": ("MAGRPOConfig",),
        "llm_marl.learners.reinforce.config": ("MAREINFORCEConfig", "MARLOOConfig", "MAReMaxConfig"),
        "llm_marl.learners.reinforce.trainer": ("MAGRPOTrainer", "MAREINFORCETrainer", "MARLOOTrainer", "MAReMaxTrainer"),
    },
)

r"""CoMLRL's import paths, served by llm_marl: run a CoMLRL 1.4.x training script unchanged
except for its imports.

Migrating a script (or a whole companion repository) is one mechanical rewrite, run at its root
(the README and docs/migrating.md have the same line)::

    grep -rlE '^\s*(from|import) comlrl([. ]|$)' --include='*.py' . | xargs -r sed -i -E 's/^(\s*)(from|import) comlrl([. ]|$)/\1\2 llm_marl.comlrl\3/'

which turns ``from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer`` into
``from llm_marl.comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer``.

What is here:

- :mod:`llm_marl.comlrl.trainers.reinforce` (and its modules ``magrpo``, ``mareinforce``,
  ``marloo``, ``maremax``): the four configs and trainers, with CoMLRL's defaults (the optimizer
  is torch AdamW with its default weight decay 0.01, as CoMLRL builds it) and its ``train()``
  signature. Every keyword of CoMLRL 1.4.0-1.4.3's constructor is accepted
  (:mod:`llm_marl.comlrl.anchor_compat` says how each is honoured).
- :mod:`llm_marl.comlrl.utils.reward_processor`: ``RewardProcessors.scale`` / ``.shift``.

- :mod:`llm_marl.comlrl.trainers.actor_critic` (and ``iac``, ``maac``): ``IACConfig`` /
  ``IACTrainer`` and ``MAACConfig`` / ``MAACTrainer``, adapted the same way.

- :mod:`llm_marl.comlrl.trainers.preference` (and ``madpo``, ``marlhf``, ``centralized``):
  ``MADPOConfig`` / ``MADPOTrainer``, ``MARLHFConfig`` / ``MARLHFTrainer``, ``JointRewardModel``,
  the centralized comparator adapters, ``madpo.AgentPreferenceTensors`` / ``PreferencePair``
  (docs/preference.md lists where they differ from CoMLRL); ``trainers.magrpo`` (the old path
  of MAGRPO); ``models.actor_critic`` (``CausalLMWithValueHead``, ``ValueHead``);
  ``utils.formatters``, ``utils.reward_utils``; ``runtime.configure_job_cuda_cache``;
  ``trainers.reinforce.centralized_magrpo`` (``CentralizedMAGRPOConfig`` / ``CentralizedMAGRPOTrainer``).

- ``trainers.preference.iterative``: ``MADPOIterConfig`` / ``MADPOIterTrainer``,
  ``MARLHFIterConfig`` / ``MARLHFIterTrainer`` (the "current" comparator only).

- every other ``__all__`` name of CoMLRL 1.4.3 and every public module path its tests and user
  guide import: ``schedulers`` (``DeviceScheduler``), ``utils.checkpoint``
  (``read_checkpoint_metadata`` reads llm_marl checkpoints), ``utils.reference_kl``,
  ``utils.distributed``, ``utils.wandb_utils``, ``utils.tokenizer_utils``,
  ``utils.model_loading``, ``trainers.actor_critic.ac_base``,
  ``trainers.preference.collaboration`` / ``checkpointing`` / ``output_paths``. CoMLRL's
  checkpoint internals raise one line naming the llm_marl way (docs/migrating.md).

Not here: the iterative learners' other comparators.

The classes are thin adapters over :mod:`llm_marl.learners`; the behaviour that deliberately
differs from CoMLRL (every answer token scored, ``discount`` honoured, ``joint_mode="crossed"``
the same as "cross") is listed in docs/migrating.md.
"""

__version__ = "1.4.3"
"""The CoMLRL release whose API this namespace serves (``comlrl.__version__`` is the installed CoMLRL's)."""

__all__ = ["__version__"]

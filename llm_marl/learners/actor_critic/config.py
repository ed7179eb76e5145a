"""Hyperparameters of the actor-critic learners IAC and MAAC (docs/actor_critic.md §1).

Both configs extend :class:`~llm_marl.learners.config.MAGRPOConfig` — so every field beyond the
specification (``seed``, ``output_dir``, ``save_steps``, ``items_per_step``, ``max_grad_norm``,
...) means the same here — with the anchor library's actor-critic fields and defaults. Where the
anchor's default is one of its quirks the default is fixed (docs/actor_critic.md §6;
docs/actor_critic_learners.md): ``early_termination_threshold`` is None (Q2), and MAAC has a
``value_clip_range`` too (None by default, as the anchor's MAAC never clips).

The REINFORCE-only fields ``joint_mode``, ``cross_aggregation`` and ``advantage_mode`` keep their
defaults: answer g of every agent forms joint action g, and the critic gives the baseline.

Sizes: ``rollout_buffer_size`` and ``train_batch_size`` count samples in ``sample_unit``: groups
(one agent's G answers to one prompt, the REINFORCE learners' unit) or answers (CoMLRL 1.4.3's:
the configs of :mod:`llm_marl.comlrl` and trainers built from the anchor keywords use it), so a
migrated script updates after as many answers as its author set (docs/actor_critic.md §4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Sequence

from llm_marl.learners.config import MAGRPOConfig

CRITIC_TYPES = ("v", "q")
SAMPLE_UNITS = (None, "group", "answer")


@dataclass
class IACConfig(MAGRPOConfig):
    """Configuration of :class:`~llm_marl.learners.actor_critic.trainer.IACTrainer` (a critic per agent)."""

    min_generations: ClassVar[int] = 1
    per_agent_rewards: ClassVar[bool] = True
    """Agents' rewards may differ (a per-agent dict from the env): each agent's critic output is
    trained on its own reward. The MAGRPO family's configs lack this and refuse them."""
    discounted_tree_returns: ClassVar[bool] = False
    """The rollout trees' returns are undiscounted (they are only logged; the TD targets use
    ``discount``), as are the logged returns (docs/actor_critic.md §5)."""

    # --- the anchor's defaults for shared fields ---
    num_train_epochs: int = 40
    """Passes over the train dataset."""
    logging_steps: int = 1
    """Log averaged training metrics every this many dataset batches."""
    num_generations: int = 1
    """G: answers per prompt per agent; answer g of every agent forms joint action g."""
    rollout_buffer_size: int = 8
    """Per agent, samples (in ``sample_unit``) that trigger an update once buffered."""
    train_batch_size: int | None = None
    """Samples (in ``sample_unit``) per agent per optimizer step; None means rollout_buffer_size."""
    top_k: int | None = None
    """Top-k sampling (None or 0 disables)."""
    early_termination_threshold: float | None = None
    """Stop an episode after a turn whose mean reward is strictly above this; None (default) disables."""

    # --- actor-critic fields ---
    critic_learning_rate: float | None = 5e-6
    """AdamW rate of the critics; None: agent_learning_rate. Shared critics train at the actor's rate."""
    value_clip_range: float | None = 0.2
    """PPO-style value clipping range around the rollout-time value (every critic placement); None disables."""
    value_loss_coef: float = 0.6
    """c_v: weight of the value loss."""
    use_separate_critic: bool = True
    """True: each critic is its own model; False: a value head on the agent's own model."""
    critic_type: str = "v"
    """"v": state values V(h); "q": action values Q(h, a) (with a V(h) baseline read from the same critic)."""
    critic_value_head_hidden_dim: int | None = None
    """Hidden width of a separate critic's value head; None: one linear layer."""
    value_head_hidden_dim: int | None = None
    """Hidden width of a shared (on-actor) value head; None: one linear layer."""
    critic_devices: Sequence[str] | str | None = None
    """Device of each critic (one string: the same for all); default: its agent's device."""
    sample_unit: str | None = None
    """Unit of rollout_buffer_size and train_batch_size: "group" (one agent's G answers to one prompt) or "answer" (CoMLRL's); None: "answer" from the anchor keywords, else "group"."""

    def normalize(self) -> None:
        """As :meth:`MAGRPOConfig.normalize`, and one critic_devices string -> one per critic."""
        super().normalize()
        if isinstance(self.critic_devices, str):
            self.critic_devices = [self.critic_devices] * self._critic_count()
        elif self.critic_devices is not None and not isinstance(self.critic_devices, list):
            self.critic_devices = list(self.critic_devices)

    def _critic_count(self) -> int:
        return self.num_agents

    def validate(self) -> None:
        super().validate()
        if self.sample_unit not in SAMPLE_UNITS:
            raise ValueError(f"sample_unit must be None, 'group' or 'answer'; got {self.sample_unit!r}")
        if self.critic_type not in CRITIC_TYPES:
            raise ValueError(f"critic_type must be 'v' or 'q'; got {self.critic_type!r}")
        if self.critic_learning_rate is not None and not self.critic_learning_rate > 0:
            raise ValueError(f"critic_learning_rate must be None or > 0, got {self.critic_learning_rate!r}")
        if not self.value_loss_coef >= 0:
            raise ValueError(f"value_loss_coef must be >= 0, got {self.value_loss_coef!r}")
        if self.value_clip_range is not None and not self.value_clip_range > 0:
            raise ValueError(f"value_clip_range must be None or > 0, got {self.value_clip_range!r}")
        for name in ("critic_value_head_hidden_dim", "value_head_hidden_dim"):
            value = getattr(self, name, None)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be None or an int >= 1, got {value!r}")
        if self.joint_mode != "aligned":
            raise ValueError(f"joint_mode must be 'aligned' for actor-critic learners (answer g of every agent forms joint action g); got {self.joint_mode!r}")
        if self.advantage_mode != "mean":
            raise ValueError(f"advantage_mode is a REINFORCE field: actor-critic advantages come from the critic; got {self.advantage_mode!r}")
        if self.critic_devices is not None and len(self.critic_devices) not in (1, self._critic_count()):
            raise ValueError(f"critic_devices must list one device per critic ({self._critic_count()}), got {self.critic_devices!r}")

    @property
    def critic_rate(self) -> float:
        """The critics' learning rate (critic_learning_rate, else agent_learning_rate)."""
        return self.agent_learning_rate if self.critic_learning_rate is None else self.critic_learning_rate


@dataclass
class MAACConfig(IACConfig):
    """Configuration of :class:`~llm_marl.learners.actor_critic.trainer.MAACTrainer` (one central critic).

    ``use_separate_critic`` must stay True (the central critic is its own model) and
    ``value_head_hidden_dim`` is unused; the central critic's head width is
    ``critic_value_head_hidden_dim``.
    """

    value_clip_range: float | None = None
    """PPO-style value clipping range around the rollout-time value; None (default) disables."""

    def _critic_count(self) -> int:
        return 1

    def validate(self) -> None:
        super().validate()
        if not self.use_separate_critic:
            raise ValueError("MAAC's central critic is its own model: use_separate_critic must be True")

"""CoMLRL's ``comlrl.trainers.preference.marlhf``: MARLHF and its joint reward model, on
:mod:`llm_marl.learners.preference.reward_model` (docs/preference.md lists the differences)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llm_marl.comlrl.trainers.preference.centralized import centralized_keywords, check_adapter
from llm_marl.learners.preference import reward_model as _reward_model
from llm_marl.comlrl.anchor_compat import ADAMW_DEFAULT_WEIGHT_DECAY, CoMLRLTrain, normalize_comlrl_fields
from llm_marl.comlrl.trainer_surface import CoMLRLSurface
from llm_marl.learners.preference.reward_model import JointRewardModel


@dataclass
class MARLHFConfig(_reward_model.MARLHFConfig):
    """:class:`llm_marl.learners.preference.reward_model.MARLHFConfig` with CoMLRL's optimizer default."""

    weight_decay: float = ADAMW_DEFAULT_WEIGHT_DECAY
    """AdamW weight decay; CoMLRL's optimizers are torch AdamW with its default (0.01)."""
    dpo_reference: bool = False
    """Unused by MARLHF (pairs train the reward model); False as in CoMLRL's MADPO."""

    def __post_init__(self) -> None:
        normalize_comlrl_fields(self)
        super().__post_init__()


class RLPhaseKeywords:
    """CoMLRL's MARLHF keywords (mixed in before a MARLHF trainer): ``centralized_comparator_adapter``,
    and ``metrics_callback``, ``critic_model`` and ``critics``, which go to the IAC / MAAC RL phase
    (rl_algorithm "iac"/"maac"); with the MAGRPO family critics are refused."""

    def __init__(self, *args: Any, centralized_comparator_adapter: Any = None, metrics_callback: Any = None,
                 critic_model: Any = None, critics: Any = None, **kwargs: Any):
        self.centralized_comparator_adapter = check_adapter(centralized_comparator_adapter)
        kwargs["centralized_comparator_adapter"] = self.centralized_comparator_adapter
        kwargs = centralized_keywords(args, kwargs)
        if getattr(self, "actor_critic", False):  # rl_algorithm "iac" / "maac": IAC's and MAAC's keywords
            kwargs.update(metrics_callback=metrics_callback, critic_model=critic_model, critics=critics)
        else:
            given = [name for name, value in (("critic_model", critic_model), ("critics", critics)) if value is not None]
            if given:
                raise ValueError(f"{', '.join(given)}: critics belong to rl_algorithm 'iac' or 'maac' (got {self.args_algorithm(args, kwargs)!r})")
            self.metrics_callback = metrics_callback
        super().__init__(*args, **kwargs)

    @staticmethod
    def args_algorithm(args: Any, kwargs: dict) -> Any:
        config = kwargs.get("args", args[2] if len(args) > 2 else None)
        return getattr(config, "rl_algorithm", None)


class CoMLRLJointText:
    """CoMLRL's reward-model input (mixed in before a MARLHF trainer): each agent's prompt
    followed by its response (:func:`~llm_marl.learners.preference.reward_model.comlrl_joint_text`), a
    text too long for the model cut from the right, as CoMLRL's tokenizer call does
    (``reward_max_length``, or the model's positions when None)."""

    reward_truncation_side = "right"

    def _joint_text(self, node: Any, j: int) -> str:
        acting = node.agents  # "" for an agent that does not act at this node (turn-based envs)
        answers = [node.completions[a][node.joint[j][acting.index(a)]].text if a in acting else "" for a in self.agent_ids]
        return _reward_model.comlrl_joint_text([str(node.observations[a]) for a in self.agent_ids], answers)


class MARLHFTrainer(CoMLRLSurface, CoMLRLJointText, RLPhaseKeywords, CoMLRLTrain, _reward_model.MARLHFTrainer):
    """:class:`llm_marl.learners.preference.reward_model.MARLHFTrainer` with CoMLRL's keywords,
    ``train()`` (:class:`RLPhaseKeywords`) and reward-model text (:class:`CoMLRLJointText`)."""

    config_class = MARLHFConfig


__all__ = ["CoMLRLJointText", "JointRewardModel", "MARLHFConfig", "MARLHFTrainer"]

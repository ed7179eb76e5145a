"""CoMLRL's ``comlrl.trainers.reinforce.magrpo``: MAGRPO with a group-mean baseline, on :mod:`llm_marl.learners`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llm_marl.learners.reinforce import config as _config
from llm_marl.learners.reinforce import trainer as _reinforce
from llm_marl.comlrl.anchor_compat import ADAMW_DEFAULT_WEIGHT_DECAY, CoMLRLTrain, normalize_comlrl_fields
from llm_marl.comlrl.trainer_surface import CoMLRLSurface


@dataclass
class MAGRPOConfig(_config.MAGRPOConfig):
    """:class:`llm_marl.learners.config.MAGRPOConfig` with CoMLRL's optimizer default."""

    weight_decay: float = ADAMW_DEFAULT_WEIGHT_DECAY
    """AdamW weight decay; CoMLRL's optimizer is torch AdamW with its default (0.01)."""

    def __post_init__(self) -> None:
        normalize_comlrl_fields(self)
        super().__post_init__()


class MAGRPOTrainer(CoMLRLSurface, CoMLRLTrain, _reinforce.MAGRPOTrainer):
    """:class:`llm_marl.learners.reinforce.trainer.MAGRPOTrainer` with CoMLRL's ``train()`` signature."""

    config_class = MAGRPOConfig


@dataclass
class NodeSample:
    """CoMLRL's record of one node of MAGRPO's rollout tree: one agent's answers at one turn.

    llm_marl's trainers record their tree as :class:`llm_marl.rollouts.RolloutNode` and do not
    make these; the class is here for scripts that build or read them.
    """

    agent_idx: int
    """The agent's position."""
    turn_idx: int
    """The turn (0-based)."""
    completions_data: dict[str, Any]
    """The prompt and answers of the node (token ids and text)."""
    returns: list[float]
    """One return per answer."""
    node_mean_reward: float
    """The mean immediate reward of the node's answers."""
    node_mean_return: float
    """The mean return of the node's answers."""
    node_env_step: int
    """The environment step at which the node was sampled."""


__all__ = ["MAGRPOConfig", "MAGRPOTrainer", "NodeSample"]

"""CoMLRL's ``comlrl.trainers.preference.madpo``: MADPO on :mod:`llm_marl.learners.preference.madpo`,
and CoMLRL's preference-pair records.

As in CoMLRL 1.4.3, the pairs are sampled once (in the first epoch) and trained on in every epoch
(``preference_refresh="once"``) with a reference-free margin (``dpo_reference=False``); unlike it,
``train_batch_size`` counts items and a later epoch replays the batches in their first order
(docs/preference.md lists the differences).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llm_marl.comlrl.trainers.preference.centralized import centralized_keywords, check_adapter
from llm_marl.learners.preference import madpo as _preference
from llm_marl.comlrl.anchor_compat import ADAMW_DEFAULT_WEIGHT_DECAY, CoMLRLTrain, normalize_comlrl_fields
from llm_marl.comlrl.trainer_surface import CoMLRLSurface


@dataclass
class AgentPreferenceTensors:
    """One agent's side of a pair, tokenized: the prompt and both answers' token ids."""

    prompt_input_ids: Any
    winner_completion_ids: Any
    loser_completion_ids: Any


@dataclass
class PreferencePair:
    """A preference pair of joint answers: prompts and answers per agent, rewards."""

    prompts: list[str]
    winner_completions: list[str]
    loser_completions: list[str]
    agent_tensors: list[AgentPreferenceTensors]
    winner_reward: float
    loser_reward: float
    candidate_reward_mean: float
    raw_rewards: list[float] | None = None
    target_raw_reward: float | None = None
    comparator_raw_reward: float | None = None


@dataclass
class MADPOConfig(_preference.MADPOConfig):
    """:class:`llm_marl.learners.preference.madpo.MADPOConfig` with CoMLRL's defaults."""

    weight_decay: float = ADAMW_DEFAULT_WEIGHT_DECAY
    """AdamW weight decay; CoMLRL's optimizer is torch AdamW with its default (0.01)."""
    dpo_reference: bool = False
    """CoMLRL 1.4.3's margin is reference-free (log pi(w) - log pi(l)); True: against a frozen copy."""
    preference_refresh: str = "once"
    """CoMLRL 1.4.3 samples its pairs once and trains every epoch on them; "epoch": new candidates every epoch."""

    def __post_init__(self) -> None:
        normalize_comlrl_fields(self)
        super().__post_init__()


class MADPOTrainer(CoMLRLSurface, CoMLRLTrain, _preference.MADPOTrainer):
    """:class:`llm_marl.learners.preference.madpo.MADPOTrainer` with CoMLRL's keywords and ``train()``."""

    config_class = MADPOConfig

    def __init__(self, *args: Any, centralized_comparator_adapter: Any = None, **kwargs: Any):
        self.centralized_comparator_adapter = check_adapter(centralized_comparator_adapter)
        kwargs["centralized_comparator_adapter"] = self.centralized_comparator_adapter
        kwargs = centralized_keywords(args, kwargs)
        super().__init__(*args, **kwargs)


__all__ = ["AgentPreferenceTensors", "MADPOConfig", "MADPOTrainer", "PreferencePair"]

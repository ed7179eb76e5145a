"""CoMLRL's ``comlrl.trainers.reinforce.centralized_magrpo``: one joint actor that writes every
role's answer, split per role for the reward, on :mod:`llm_marl.learners.reinforce.centralized`.

The keywords are CoMLRL's: ``centralized_adapter`` (required), ``num_agents`` (the roles, equal
to ``args.num_agents``), ``agent_model`` or ``agents=[one model]``, ``tokenizer`` (one),
``reward_func`` (called with one list per ROLE, as for decentralized agents), ``formatters``
(one per role, or one for all), ``train_dataset``, ``eval_dataset``, ``reward_processor``,
``model_config``. Not supported here, refused with an error: ``external_transition`` (one turn),
``eval_logger`` / ``eval_aggregator`` (their per-role split is not built); ``wandb_config`` is
ignored with a warning.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any

from llm_marl.envs.dialogue import DialogueEnv
from llm_marl.learners.reinforce import centralized as _centralized
from llm_marl.comlrl.anchor_compat import ADAMW_DEFAULT_WEIGHT_DECAY, CoMLRLTrain, anchor_policies, normalize_comlrl_fields
from llm_marl.comlrl.trainer_surface import CoMLRLSurface
from llm_marl.runs.run_dir import default_run_dir
from llm_marl.tasks.function_task import FunctionTask


@dataclass
class CentralizedMAGRPOConfig(_centralized.CentralizedMAGRPOConfig):
    """:class:`llm_marl.learners.reinforce.centralized.CentralizedMAGRPOConfig` with CoMLRL's optimizer default."""

    weight_decay: float = ADAMW_DEFAULT_WEIGHT_DECAY
    """AdamW weight decay; CoMLRL's optimizer is torch AdamW with its default (0.01)."""

    def __post_init__(self) -> None:
        normalize_comlrl_fields(self)
        super().__post_init__()


class CentralizedMAGRPOTrainer(CoMLRLSurface, CoMLRLTrain, _centralized.CentralizedMAGRPOTrainer):
    """Centralized MAGRPO with CoMLRL's keywords and ``train()`` (see the module docstring)."""

    config_class = CentralizedMAGRPOConfig

    def __init__(self, *, centralized_adapter: Any, args: CentralizedMAGRPOConfig | None = None, num_agents: int = 2, **keywords: Any):
        args = args if args is not None else CentralizedMAGRPOConfig(num_agents=num_agents)
        env, eval_env, policy, tokenizers, args = centralized_from_anchor_kwargs(args, num_agents=num_agents, **keywords)
        super().__init__(env=env, policy=policy, args=args, eval_env=eval_env, centralized_adapter=centralized_adapter)
        self.tokenizers = tokenizers


def centralized_from_anchor_kwargs(
    args: Any, *, num_agents: int = 2, agent_model: Any = None, agents: Any = None, tokenizer: Any = None, reward_func: Any = None,
    formatters: Any = None, train_dataset: Any = None, eval_dataset: Any = None, reward_processor: Any = None,
    model_config: dict | None = None, external_transition: Any = None, wandb_config: Any = None, eval_logger: Any = None,
    eval_aggregator: Any = None,
) -> tuple[DialogueEnv, DialogueEnv | None, Any, list[Any], Any]:
    """(env, eval env, the one policy, its tokenizers, args) from CoMLRL's keywords for a
    centralized learner (see the module docstring); ``args.output_dir`` None becomes a default
    run folder, ``save_final_checkpoint`` None becomes ``save_steps > 0``."""
    if num_agents != args.num_agents:
        raise ValueError(f"num_agents={num_agents} must equal args.num_agents={args.num_agents} (the number of roles)")
    if (agent_model is None) == (agents is None):
        raise ValueError("pass exactly one of agent_model= or agents=[one model]: the centralized actor is one model")
    if agents is not None and len(agents) != 1:
        raise ValueError(f"centralized collaboration trains exactly one actor model; agents= lists {len(agents)}")
    if isinstance(tokenizer, (list, tuple)):
        if len(tokenizer) != 1:
            raise ValueError(f"centralized collaboration needs one actor tokenizer; got {len(tokenizer)}")
        tokenizer = tokenizer[0]
    if not callable(reward_func):
        raise ValueError("reward_func must be callable: reward_func(answers_role_0, answers_role_1, ...) -> [float]")
    if train_dataset is None:
        raise ValueError("train_dataset is required")
    refused = [n for n, v in (("external_transition", external_transition), ("eval_logger", eval_logger), ("eval_aggregator", eval_aggregator)) if v is not None]
    if refused:
        raise ValueError(f"{', '.join(refused)}: not supported with centralized collaboration here (one turn; no per-role eval hooks)")
    if wandb_config is not None:
        warnings.warn("wandb_config is ignored with centralized collaboration here (metrics go to TensorBoard and metrics.jsonl)", stacklevel=3)
    if args.save_final_checkpoint is None:
        args = dataclasses.replace(args, save_final_checkpoint=args.save_steps > 0)
    if args.output_dir is None:
        args = dataclasses.replace(args, output_dir=default_run_dir("centralized"))
    source = agent_model if agent_model is not None else agents[0]
    actor_args = copy.copy(args)
    actor_args.lora_r = None  # the one actor is a full model, whatever lora_r says
    built = anchor_policies(actor_args, source, tokenizer, model_config, 1)
    policies, tokenizers = built.policies, built.tokenizers
    task = FunctionTask(reward_func, formatters if formatters is not None else (lambda item: item["prompt"]), None, train_dataset,
                        num_agents=args.num_agents, num_turns=1, eval_dataset=eval_dataset, reward_processor=reward_processor)
    eval_env = DialogueEnv(task, split="eval") if eval_dataset is not None and len(eval_dataset) else None
    return DialogueEnv(task, split="train"), eval_env, policies[0], tokenizers, args


__all__ = ["CentralizedMAGRPOConfig", "CentralizedMAGRPOTrainer"]

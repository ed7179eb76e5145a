"""The Hugging Face-compatible trainer constructor of the anchor library (docs/algorithms.md §7).

A script written for CoMLRL's ``MAGRPOTrainer(agent_model=..., reward_func=..., formatters=...,
train_dataset=..., args=...)`` runs here after changing only its imports. The keywords are turned
into a :class:`~llm_marl.tasks.FunctionTask`, a :class:`~llm_marl.envs.DialogueEnv` per split and
one :class:`~llm_marl.policies.CausalLMPolicy` per agent, so rollouts take the same code path as
the env-native constructor. The policies are built by :func:`llm_marl.assembly.make_policies`,
as the ``llm-marl`` command builds its own: a model source means the same in both.

Choices where the anchor library is silent or differs:

- ``formatters`` may be omitted: each agent's prompt is then ``item["prompt"]``.
- Generation settings (``max_new_tokens``, ``temperature``, ``top_p``, ``top_k``) come from
  ``args``; models are placed on ``args.agent_devices`` when given.
- ``agent_model`` given as a loaded model is deep-copied once per agent, so agents never share
  weights; ``num_agents`` (keyword) defaults to ``args.num_agents`` and must agree with it.
  ``agents=[m, m]`` (one loaded model object for several agents) raises ``ValueError`` naming
  the agents: they would train one set of weights; pass copies, or ``agent_model=m``.
- Without ``eval_dataset`` there is nothing to evaluate: ``evaluate()`` warns once and returns
  ``{}`` (CoMLRL returns nothing there); training items are never evaluated as eval items.
- ``model_config`` keys: ``dtype`` (or ``torch_dtype``), ``attn_implementation``,
  ``special_tokens`` (a dict passed to ``tokenizer.add_special_tokens``; embeddings are resized),
  and ``chat_template``: False by default, so the formatters' text reaches the model as is, as in
  CoMLRL, even when the tokenizer has a chat template; True (or None: when the tokenizer has
  one) renders each prompt as a user message in the template (``CausalLMPolicy(chat_template=)``).
- ``agent_model`` may be a named model (``"smollm2-135m"``, :mod:`llm_marl.policies.models`).
- ``wandb_config``: the same metrics also go to a W&B run built from it
  (:func:`llm_marl.runs.logging.open_wandb`; optional extra ``llm_marl[wandb]``).
- ``args.output_dir`` None (CoMLRL's config has no such field): the run still leaves a record,
  in a default run directory ``runs/<wandb name or algorithm>-<time>``
  (:func:`~llm_marl.runs.run_dir.default_run_dir`), printed when the trainer is built:
  TensorBoard logs, ``metrics.jsonl``, rollouts (the W&B files too, unless
  ``wandb_config["dir"]`` says otherwise).
- Model weights and optimizer states are written only when the script asks, as in CoMLRL:
  ``save_model(dir)``, or checkpoints with ``args.save_steps`` > 0 (then also one when training
  ends or a signal stops it). ``args.save_final_checkpoint`` None is resolved here to
  ``save_steps > 0``, whether or not ``output_dir`` is given; set it True for the env-native
  default (a resumable checkpoint at the end and on SIGINT/SIGTERM), False for none.
- The optimizer: each agent's AdamW with ``args.weight_decay``; the configs of
  :mod:`llm_marl.comlrl` default it to torch's 0.01, which is what CoMLRL's
  ``torch.optim.AdamW(params, lr=agent_learning_rate)`` uses.
- ``dataset_type=`` (CoMLRL 1.4.0-1.4.2; removed in 1.4.3) is accepted with a
  ``DeprecationWarning`` and only recorded in the W&B run's config, as 1.4.2 did.
- ``train_dataset`` is needed only by ``train()``: a trainer built with ``eval_dataset`` alone
  evaluates, and ``train()`` raises ``ValueError``.
- ``eval_logger`` is called in the form its signature asks for: CoMLRL 1.4.3's
  ``(agent_completions_turns=, batch_items=, prompts=)``, or 1.4.0-1.4.2's
  ``(agent_completions_turns=, test_cases=, entry_points=, prompts=)`` when it names
  ``test_cases`` or ``entry_points`` (each item's ``"test"`` and ``"entry_point"``, "" if absent).
- Actor-critic trainers (IAC, MAAC) built from these keywords count ``rollout_buffer_size`` and
  ``train_batch_size`` in answers, CoMLRL's unit, unless ``args.sample_unit`` is "group"
  (docs/actor_critic.md §4); a ``reward_func`` may return one value per agent (§3).
- ``args.lora_r`` set: ``agent_model`` is loaded once and every agent is a LoRA adapter on it
  (:class:`~llm_marl.policies.LoRATeam`, ``lora_alpha``, ``lora_target_modules``,
  ``gradient_checkpointing``, ``model_dtype``); ``agents=`` (one model per agent) is refused.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from llm_marl.assembly import Assembled, make_policies
from llm_marl.envs.dialogue import DialogueEnv
from llm_marl.runs.run_dir import default_run_dir
from llm_marl.tasks.function_task import FunctionTask


@dataclass
class AnchorBuild:
    """What the anchor library's keywords build."""

    args: Any
    """The config, with ``output_dir`` filled in when it was None."""
    env: DialogueEnv
    """The training env (the eval env when no train_dataset was given)."""
    eval_env: DialogueEnv | None
    """The eval env, when an eval_dataset was given."""
    policies: list[Any]
    """One CausalLMPolicy per agent."""
    tokenizers: list[Any]
    """One tokenizer per agent."""
    eval_logger: Callable[..., Any] | None
    """The eval logger, adapted to the 1.4.3 call form."""
    eval_aggregator: Callable[..., Any] | None
    """The eval aggregator."""
    wandb_config: dict[str, Any] | None = None
    """The W&B run's settings, when given."""
    run_config: dict[str, Any] = field(default_factory=dict)
    """Extra entries of the W&B run config (models, dataset_type)."""
    cannot_train: str | None = None
    """Why train() must refuse (no train_dataset), or None."""


def _default_formatter(item: Any) -> str:
    return item["prompt"]


_NO_DATA = [{"prompt": ""}]
"""The stand-in training split of a trainer built with neither dataset (CoMLRL builds one): it
only lets the env be built; ``train()`` refuses (``cannot_train``) and there is nothing to evaluate."""


def _user_stacklevel() -> int:
    """The ``warnings.warn`` stacklevel, called from here, of the first caller outside llm_marl
    (the script that built the trainer), however many llm_marl frames lie between."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] == "llm_marl":
        frame, level = frame.f_back, level + 1
    return level


def _agents_matching_model(agent_model: Any, agents: Sequence[Any], count: int) -> list[Any]:
    """``agents`` given together with ``agent_model``, accepted as CoMLRL accepts it: a list of
    ``count`` model names (or models) that each name ``agent_model``; ValueError otherwise."""
    if isinstance(agents, (str, bytes)) or not isinstance(agents, Sequence):
        raise ValueError(f"agent_model and agents given together: agents must be a list of {count} model names, got {type(agents).__name__}")
    if len(agents) != count:
        raise ValueError(f"agents length ({len(agents)}) must match num_agents ({count}) when agent_model is given too")
    wanted = _source_name(agent_model)
    names = [_source_name(source) for source in agents]
    if any(name != wanted for name in names):
        raise ValueError(f"agent_model and agents conflict: {wanted!r} != {names!r}; pass one of them")
    return list(agents)


def _source_name(source: Any) -> str:
    return source if isinstance(source, str) else _model_name(source)


def build_from_anchor_kwargs(
    args: Any,
    *,
    agent_model: Any = None,
    agents: Sequence[Any] | None = None,
    num_agents: int | None = None,
    tokenizer: Any = None,
    model_config: dict[str, Any] | None = None,
    train_dataset: Any = None,
    eval_dataset: Any = None,
    reward_func: Callable[..., Any] | None = None,
    reward_processor: Callable[[float], float] | None = None,
    formatters: Callable[..., str] | Sequence[Callable[..., str]] | None = None,
    external_transition: Callable[..., Sequence[str]] | None = None,
    wandb_config: dict[str, Any] | None = None,
    eval_logger: Callable[..., Any] | None = None,
    eval_aggregator: Callable[..., Any] | None = None,
    dataset_type: str | None = None,
    algorithm: str = "magrpo",
) -> AnchorBuild:
    """Build env, eval env and policies from the anchor library's keywords (see module doc)."""
    if agent_model is None and agents is None:
        raise ValueError("Either agent_model or agents must be provided: agent_model= (homogeneous agents) or agents= (a list, one per agent)")
    if reward_func is None:
        raise ValueError("reward_func is required: reward_func(answers_agent_0, answers_agent_1, ...) -> [float]")
    if args.num_turns > 1 and external_transition is None:  # before any model is loaded, as CoMLRL checks it
        raise ValueError(f"num_turns={args.num_turns} needs an external_transition to produce the next prompts")
    if agent_model is not None and agents is not None:
        agents = _agents_matching_model(agent_model, agents, num_agents if num_agents is not None else args.num_agents)
        agent_model = None
    if dataset_type is not None:
        warnings.warn(
            "dataset_type= was accepted by CoMLRL 1.4.0-1.4.2 and removed in 1.4.3; it is only recorded "
            "in the W&B run config (as dataset_type). Drop it from the trainer call.",
            DeprecationWarning,
            stacklevel=_user_stacklevel(),
        )
    if wandb_config is not None and not isinstance(wandb_config, Mapping):
        raise TypeError(f"wandb_config must be a dict (project, entity, name, dir, tags, ...), got {type(wandb_config).__name__}")
    count = len(agents) if agents is not None else (num_agents if num_agents is not None else args.num_agents)
    if args.num_agents != count:
        raise ValueError(f"args.num_agents is {args.num_agents} but {count} agents were given")
    if agents is not None and num_agents is not None and num_agents != len(agents):
        raise ValueError(f"num_agents={num_agents} but agents= lists {len(agents)} models")
    if getattr(args, "lora_r", None) is not None and agents is not None:
        raise ValueError("args.lora_r makes the agents adapters of ONE base model: pass agent_model=, not agents=")
    sources = list(agents) if agents is not None else [agent_model] * count
    built = anchor_policies(args, sources if agents is not None else agent_model, tokenizer, model_config, count)
    policies, tokenizers = built.policies, built.tokenizers
    no_data = train_dataset is None and eval_dataset is None
    task = FunctionTask(
        reward_func,
        formatters if formatters is not None else _default_formatter,
        external_transition,
        _NO_DATA if no_data else train_dataset,
        num_agents=count,
        num_turns=args.num_turns,
        eval_dataset=eval_dataset,
        reward_processor=reward_processor,
        external_prompt_passthrough=args.external_prompt_passthrough,
    )
    eval_env = DialogueEnv(task, split="eval") if eval_dataset is not None and len(eval_dataset) else None
    env = DialogueEnv(task, split="train") if train_dataset is not None or no_data else (eval_env or DialogueEnv(task, split="eval"))
    cannot_train = None if train_dataset is not None else "train_dataset is required to train: pass train_dataset= to the trainer"
    if args.save_final_checkpoint is None:  # CoMLRL writes weights only when asked: save_model or save_steps
        args = dataclasses.replace(args, save_final_checkpoint=args.save_steps > 0)
    if args.output_dir is None:
        name = (wandb_config or {}).get("name") or (wandb_config or {}).get("run_name") or algorithm
        args = dataclasses.replace(args, output_dir=default_run_dir(name))
        if os.environ.get("RANK", "0") == "0":
            saved = "checkpoints" if args.save_steps or args.save_final_checkpoint else "no weights unless save_model() or save_steps"
            print(
                f"[llm_marl] no output_dir given: this run is recorded in {args.output_dir} "
                f"(TensorBoard logs, metrics.jsonl, {saved}; tensorboard --logdir {args.output_dir}/logs)",
                flush=True,
            )
    run_config = {
        "algorithm": algorithm,
        "models": [source if isinstance(source, str) else _model_name(source) for source in sources],
    }
    if dataset_type is not None:
        run_config["dataset_type"] = dataset_type
    return AnchorBuild(
        args,
        env,
        eval_env,
        policies,
        tokenizers,
        adapt_eval_logger(eval_logger),
        eval_aggregator,
        wandb_config=dict(wandb_config) if wandb_config is not None else None,
        run_config=run_config,
        cannot_train=cannot_train,
    )


def adapt_eval_logger(logger: Callable[..., Any] | None) -> Callable[..., Any] | None:
    """``logger`` as a callable of the 1.4.3 form ``(agent_completions_turns=, batch_items=,
    prompts=)``, calling it in the form its signature asks for (see the module docstring)."""
    if logger is None:
        return None
    if not callable(logger):
        raise TypeError(f"eval_logger must be callable, got {type(logger).__name__}")
    try:
        params = inspect.signature(logger).parameters
    except (TypeError, ValueError):
        return logger
    star_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    legacy = ("test_cases" in params or "entry_points" in params) and "batch_items" not in params

    def accepts(name: str) -> bool:
        return name in params or star_kwargs

    def call(*, agent_completions_turns: Any, batch_items: list[Any], prompts: list[str]) -> Any:
        kwargs: dict[str, Any] = {"agent_completions_turns": agent_completions_turns}
        if legacy:
            kwargs["test_cases"] = [_field(item, "test") for item in batch_items]
            kwargs["entry_points"] = [_field(item, "entry_point") for item in batch_items]
        elif accepts("batch_items"):
            kwargs["batch_items"] = batch_items
        if accepts("prompts"):
            kwargs["prompts"] = prompts
        return logger(**kwargs)

    call.form = "1.4.2" if legacy else "1.4.3"  # type: ignore[attr-defined]
    call.wrapped = logger  # type: ignore[attr-defined]
    return call


def _field(item: Any, key: str) -> Any:
    return item.get(key, "") if isinstance(item, Mapping) else ""


def _model_name(model: Any) -> str:
    config = getattr(model, "config", None)
    return str(getattr(config, "_name_or_path", "") or type(model).__name__)


def anchor_policies(args: Any, model: Any, tokenizer: Any, model_config: dict[str, Any] | None, count: int) -> Assembled:
    """The policies of agents ``agent_0 ... agent_{count-1}`` from the model keywords
    (:func:`llm_marl.assembly.make_policies`); prompts are the formatters' raw text unless
    ``model_config["chat_template"]`` says otherwise."""
    config = dict(model_config or {})
    return make_policies(
        "lm",
        [f"agent_{i}" for i in range(count)],
        args,
        model=model,
        tokenizer=tokenizer,
        model_config=config,
        chat_template=config.get("chat_template", False),  # CoMLRL sends the formatters' raw text
        label="agents" if isinstance(model, (list, tuple)) else "agent_model",
    )


ADAMW_DEFAULT_WEIGHT_DECAY: float = inspect.signature(__import__("torch").optim.AdamW).parameters["weight_decay"].default
"""torch AdamW's default weight decay (0.01): what CoMLRL's optimizers use, as it builds
``torch.optim.AdamW(params, lr=agent_learning_rate)``."""


def normalize_comlrl_fields(config: Any) -> None:
    """A :mod:`llm_marl.comlrl` config as CoMLRL 1.4.3's ``__post_init__`` takes it, before
    llm_marl's validation (docs/migrating.md, *Accepted and refused as CoMLRL*).

    Spellings: ``parallel_training`` None, "" or "null" (any case) means "none"; an
    ``agent_devices`` / ``reference_devices`` of "auto" (or ["auto"]) means cuda:0 when CUDA is
    available, else cpu; ``joint_mode`` and ``advantage_mode`` in any case, "align" for
    "aligned", and with one agent any ``joint_mode`` (one agent has no joint choice: "aligned");
    ``critic_type`` in any case, None for "v"; ``train_batch_size`` None is filled with
    ``rollout_buffer_size``.

    Refused with ValueError, as CoMLRL refuses them: ``num_train_epochs`` < 1 (the actor-critic
    configs accept any, as CoMLRL's do); for IAC and MAAC, ``parallel_training="mp"`` without
    ``critic_devices`` (IAC: when ``use_separate_critic``) and ``num_turns`` > 1 with
    ``num_generations`` != 1; for MARLHF, ``critic_learning_rate``, ``value_loss_coef`` or
    ``value_clip_range`` <= 0.
    """
    mode = config.parallel_training
    if mode is None or isinstance(mode, str):
        mode = (mode or "none").strip().lower()
        config.parallel_training = "none" if mode in ("null", "") else mode
    for name in ("agent_devices", "reference_devices"):
        devices = getattr(config, name)
        if devices == "auto" or (isinstance(devices, (list, tuple)) and list(devices) == ["auto"]):
            import torch

            setattr(config, name, "cuda:0" if torch.cuda.is_available() else "cpu")
    for name in ("joint_mode", "advantage_mode", "critic_type"):
        if isinstance(getattr(config, name, None), str):
            setattr(config, name, getattr(config, name).strip().lower())
    if config.joint_mode == "align" or (config.num_agents == 1 and isinstance(config.num_agents, int)):
        config.joint_mode = "aligned"
    if hasattr(config, "critic_type") and config.critic_type in (None, ""):
        config.critic_type = "v"
    if config.train_batch_size is None:
        config.train_batch_size = config.rollout_buffer_size
    actor_critic = hasattr(config, "_critic_count")  # IAC, MAAC (by shape: importing them here would be an import circle)
    if not actor_critic and _is_int(config.num_train_epochs) and config.num_train_epochs < 1:
        raise ValueError(f"num_train_epochs must be an int >= 1 (CoMLRL refuses 0), got {config.num_train_epochs!r}")
    if actor_critic:
        name = type(config).__name__.removesuffix("Config")
        # MAAC's central critic is always its own model (its config refuses use_separate_critic=False)
        if config.parallel_training == "mp" and config.use_separate_critic and config.critic_devices is None:
            raise ValueError(f'parallel_training="mp" needs critic_devices (one device per critic) for {name}')
        if _is_int(config.num_turns) and config.num_turns > 1 and config.num_generations != 1:
            raise ValueError(
                f"{name} with num_turns={config.num_turns} takes num_generations=1 (as CoMLRL), got {config.num_generations!r}"
            )
    if hasattr(config, "rl_algorithm"):  # MARLHF and MARLHFIter
        if config.critic_type not in ("v", "q"):
            raise ValueError(f"critic_type must be 'v' or 'q', got {config.critic_type!r}")
        for name in ("critic_learning_rate", "value_loss_coef", "value_clip_range"):
            value = getattr(config, name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0:
                raise ValueError(f"{name} must be > 0{' or None' if name != 'value_loss_coef' else ''}, got {value!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class CoMLRLTrain:
    """``train()`` with CoMLRL 1.4.3's signature, for the trainers of :mod:`llm_marl.comlrl`."""

    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        checkpoint_dir: str | None = None,
        checkpoint_interval: int = 1,
        checkpoint_total_limit: int | None = None,
    ) -> Any:
        """Train (see :meth:`llm_marl.learners.reinforce.trainer.MAGRPOTrainer.train`).

        ``checkpoint_total_limit`` sets ``save_total_limit``. CoMLRL's epoch-based
        ``checkpoint_dir`` / ``checkpoint_interval`` have no counterpart: checkpoints go to
        ``output_dir`` every ``save_steps`` optimizer steps, and passing either raises ValueError
        — except ``checkpoint_dir`` equal to ``output_dir``, which asks for checkpoints: training
        then also ends with one (``save_final_checkpoint``).
        """
        if checkpoint_dir is not None and os.path.abspath(checkpoint_dir) != os.path.abspath(str(self.args.output_dir)):
            raise ValueError(
                f"checkpoint_dir={checkpoint_dir!r}: llm_marl writes checkpoints into the run directory "
                f"(output_dir={self.args.output_dir!r}); set the config's output_dir instead"
            )
        if checkpoint_interval != 1:
            raise ValueError(
                f"checkpoint_interval={checkpoint_interval!r} (epochs) is not supported: set the config's "
                "save_steps (a checkpoint every that many optimizer steps)"
            )
        if checkpoint_dir is not None and not self.args.save_final_checkpoint:
            self.args.save_final_checkpoint = True  # the script asked for checkpoints
        if checkpoint_total_limit is not None:
            self.args.save_total_limit = checkpoint_total_limit
            self.args.validate()
        return super().train(resume_from_checkpoint=resume_from_checkpoint)  # type: ignore[misc]

"""The shared hyperparameters: :class:`MAGRPOConfig`, the base of every learner's config
(docs/algorithms.md §6), one dataclass field each.

The REINFORCE variants (MAREINFORCE, MARLOO, MAReMax) differ from it only in the default
``advantage_mode`` and live in :mod:`llm_marl.learners.reinforce.config`. Fields
beyond the specification follow Hugging Face ``TrainingArguments`` names where one exists
(``seed``, ``output_dir``, ``save_steps``, ``save_total_limit``, ``max_grad_norm``,
``weight_decay``). Invalid values raise ``ValueError`` naming the field at construction time,
and again when a trainer is built (:meth:`MAGRPOConfig.validate`), so a config changed after
construction (``args.x = ...`` or ``dataclasses.replace``) is checked too. A value of the wrong
type is reported first (``config_types.py``: the same rules that read flags and YAML), then a
value out of range.

``train_batch_size=None`` stays None in the config and means "``rollout_buffer_size``" wherever
it is used (:attr:`MAGRPOConfig.resolved_train_batch_size`), so
``dataclasses.replace(cfg, rollout_buffer_size=8)`` gets mini-batches of 8.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

from llm_marl.learners.config_types import check_types

JOINT_MODES = ("aligned", "cross", "crossed")
ADVANTAGE_MODES = ("mean", "max", "rloo", "raw", "best")
CROSS_AGGREGATIONS = ("sum", "mean", "max")
TREE_RETURN_AGGREGATIONS = ("mean", "max", "softmax")
PARALLEL_MODES = ("none", "mp")
LOGPROB_REDUCTIONS = ("sum", "mean")
ERROR_POLICIES = ("raise", "skip")
MODEL_DTYPES = ("float32", "bfloat16", "float16")
OPTIMIZERS = ("adamw_torch", "sgd")


@dataclass
class MAGRPOConfig:
    """Configuration of :class:`~llm_marl.learners.reinforce.MAGRPOTrainer` (baseline: group mean)."""

    min_generations: ClassVar[int] = 2
    """The smallest num_generations allowed (a group baseline needs two answers)."""

    # --- the specification's fields (docs/algorithms.md §6) ---
    num_agents: int = 2
    """Number of agents; must match the trainer's agents."""
    num_turns: int = 2
    """Turns per episode (horizon H)."""
    num_train_epochs: int = 20
    """Passes over the train dataset."""
    agent_learning_rate: float = 5e-6
    """Learning rate of every agent's optimizer."""
    logging_steps: int = 50
    """Log averaged training metrics every this many dataset batches."""
    num_generations: int = 4
    """K: samples per observation per agent (>= 2)."""
    max_new_tokens: int = 256
    """Generation length cap of language-model policies."""
    temperature: float = 0.6
    """Sampling temperature of language-model policies."""
    top_p: float = 0.6
    """Nucleus sampling threshold (1.0 disables)."""
    top_k: int | None = 50
    """Top-k sampling (None or 0 disables)."""
    discount: float = 1.0
    """gamma in G_j = r_j + gamma * mean(G of child_j)."""
    joint_mode: str = "aligned"
    """"aligned" (K joint actions) or "cross" (K^N joint actions; alias "crossed")."""
    cross_aggregation: str = "sum"
    """Cross mode: an answer's return is the sum, mean or max of the joint returns containing it."""
    early_termination_threshold: float | None = -0.2
    """A node whose mean immediate reward is strictly above this gets no children; None disables."""
    rollout_buffer_size: int = 2
    """Samples per agent collected before an update."""
    train_batch_size: int | None = None
    """Samples per optimizer step; None means rollout_buffer_size."""
    advantage_normalization: bool = True
    """Centre and scale each group's advantages by its population std (floored at 1e-6)."""
    advantage_mode: str = "mean"
    """Baseline: "mean" (MAGRPO), "rloo", "max" (MAReMax), "raw" (MAREINFORCE) or "best" (imitate each group's best answers)."""
    eval_interval: int = 16
    """Evaluate before dataset batch b whenever b % eval_interval == 0; 0 disables."""
    eval_num_samples: int = 4
    """Eval items played per evaluation (one answer per agent per turn)."""
    eval_batch_size: int = 1
    """Eval items played together in one batched rollout."""
    external_prompt_passthrough: bool = False
    """Use the transition's text as the next prompt verbatim (drop-in constructor only)."""
    parallel_training: str = "none"
    """"none", or "mp": each agent on its own device, agents run concurrently."""
    agent_devices: Sequence[str] | str | None = None
    """Device of each agent's model (one string, or a one-entry list: the same for all); required for parallel_training="mp"."""
    reference_kl_enabled: bool = False
    """Subtract a frozen-reference KL penalty from each answer's return."""
    reference_kl_coef: float = 0.1
    """Weight of the reference KL penalty (>= 0)."""
    reference_devices: Sequence[str] | str | None = None
    """Device of each agent's frozen reference model (one entry: the same for all; default: the agent's device)."""
    fsdp: bool = False
    """Under torchrun: shard each full-model agent per decoder layer across the ranks (FSDP2), with its gradients and AdamW state (docs/scaling.md)."""
    fsdp_shard_size: int | None = None
    """With fsdp: ranks per sharding group (shard within, replicate across, a 2-D mesh); None: all ranks shard."""
    fsdp_gather: str = "model"
    """With fsdp, how sampling reads the sharded weights: "model" gathers each model whole once per rollout; "layer" one layer per forward pass (the ranks' passes kept in step)."""
    mixed_precision: bool = False
    """With fsdp: forward and backward on bfloat16 copies of the gathered weights, gradients reduced in float32 into the float32 shards (FSDP2's MixedPrecisionPolicy; for GPUs)."""

    # --- beyond the specification ---
    seed: int = 42
    """Seeds Python, NumPy and torch at the start of training (and the env's row draws)."""
    output_dir: str | None = None
    """Run directory: TensorBoard logs, metrics.jsonl, checkpoints, saved models. None: no files."""
    overwrite_output_dir: bool = False
    """A new run in a non-empty output_dir: False refuses; True moves the old contents aside (never deletes)."""
    save_steps: int = 0
    """Write a checkpoint every this many optimizer steps (at the end of that batch); 0: none but the closing one (save_final_checkpoint)."""
    save_total_limit: int | None = 2
    """Keep at most this many checkpoints (oldest deleted first); None keeps all."""
    save_final_checkpoint: bool | None = None
    """Checkpoint output_dir when train() ends or a signal stops it; None: yes, except drop-in runs without save_steps."""
    logprob_reduction: str = "sum"
    """log pi(answer): "sum" over its tokens (docs/algorithms.md §4) or their "mean" (length-normalized)."""
    max_grad_norm: float | None = None
    """Clip each agent's gradient norm to this before the step; None disables clipping."""
    max_sampler_gap: float | None = None
    """Stop the run (SamplerGapError) when an agent's train/<agent>/sampler_gap, the mean |log p_sampler - log p_scorer| per token, exceeds this; None: warn once past the sampler dtype's default threshold."""
    weight_decay: float = 0.0
    """AdamW weight decay of the default optimizers."""
    max_steps: int | None = None
    """Stop after exactly this many optimizer steps (checked before every step; the rest of a cut update is checkpointed, and resuming finishes it as if never stopped; distributed: after the update); None: run all epochs."""
    items_per_step: int = 1
    """Dataset items rolled out together in one batched tree collection."""
    generation_batch_size: int | None = None
    """Drop-in constructor: at most this many sequences (prompts x answers) per sampling call and
    rows per scoring pass of each agent's model (CausalLMPolicy.max_batch_size); None: no cap."""
    lora_r: int | None = None
    """LoRA rank: the drop-in constructor and the CLI make the agents adapters of one frozen base (LoRATeam); None: full models."""
    lora_alpha: float = 16.0
    """LoRA scaling numerator (an adapter's update is scaled by lora_alpha / lora_r)."""
    lora_target_modules: Sequence[str] | str | None = None
    """Module names that get adapters (a list, or "q_proj,v_proj"); None: peft's default for the architecture."""
    gradient_checkpointing: bool = False
    """Adapter teams: recompute each layer in the backward pass instead of storing its activations."""
    model_dtype: str | None = None
    """Adapter teams: the base model's weight dtype (e.g. "bfloat16"); None: as saved."""
    sample_dtype: str | None = None
    """Adapter teams (and CausalLMPolicy(sample_dtype=)): decode with a copy of the weights in this dtype (e.g. "bfloat16"), refreshed after every update; scoring stays exact on the model's own weights. None: sample with the model itself."""
    choice_answers: bool = False
    """Language-model agents answer by choosing one of the moves their prompt lists ("Choose one of: a, b, c.", as OpenSpiel text prompts do): a softmax over the moves' whole-answer log-probabilities (ChoicePolicy), not free text. False: free text."""
    reward_error_policy: str = "raise"
    """A task error while rolling out an item: "raise" stops training; "skip" drops the item, counts and logs it."""
    progress_bar: bool = True
    """Show a tqdm progress bar during training."""
    num_threads: int | None = None
    """CPU threads of torch's operations (CLI --threads N), fixed; None: torch's default count, kept to the CPUs other work leaves free while the run goes (llm_marl/threads.py)."""
    report_to: Sequence[str] | str | None = None
    """Extra metric destinations: "wandb" also sends every logged metric to a W&B run (learners/logging.py)."""
    rollout_log_steps: int = 10
    """Record the trees of the first batch and every this many batches to output_dir/rollouts; 0: off."""

    # --- against collapsed groups (docs/algorithms.md §3.9) ---
    tree_return_aggregation: str = "mean"
    """An inner node's return credits its children's returns by their "mean", their "max" (optimistic credit) or their "softmax" (tree_return_temperature * log mean exp(G / tree_return_temperature))."""
    tree_return_temperature: float = 1.0
    """Temperature of tree_return_aggregation="softmax" (> 0; small: near the max, large: near the mean)."""
    dynamic_sampling: bool = False
    """Replace each group whose advantages are all zero by a group with signal from the batch's items rolled out again (DAPO's dynamic sampling), up to dynamic_sampling_budget re-rolls per batch."""
    dynamic_sampling_budget: int = 4
    """With dynamic_sampling: the most times a batch's items are rolled out again to replace groups without signal; what is still without signal after that is trained on as it is."""
    entropy_coef: float = 0.0
    """Entropy bonus: subtract entropy_coef x the mean entropy per token of the policy at the sampled answers' positions from each agent's loss (>= 0; 0 disables)."""
    entropy_coef_final: float | None = None
    """Annealed entropy bonus: the coefficient goes linearly from entropy_coef at the run's first dataset batch to this at its last (>= 0); None: entropy_coef throughout."""
    agent_learning_rates: Sequence[float] | None = None
    """Learning rate of each agent's optimizer, in the env's agent order (e.g. 0.03,0.3: the second agent learns ten times faster, two timescales); None: agent_learning_rate for every agent."""
    agent_advantage_normalization: Sequence[bool] | None = None
    """advantage_normalization of each agent, in the env's agent order (e.g. false,true: the first agent's groups keep their returns' scale, the second's are divided by their std); None: advantage_normalization for every agent."""
    agent_rollout_buffer_sizes: Sequence[int] | None = None
    """rollout_buffer_size of each agent, in the env's agent order (e.g. 16,64 in a two-player turn-based tree with K = 4, where the second player gets K groups for each of the first's: both then step once a batch of 16 items); with train_batch_size None each agent's mini-batches are its own size; None: rollout_buffer_size for every agent."""
    optim: str = "adamw_torch"
    """The agents' default optimizer (and the critics'): "adamw_torch" (AdamW) or "sgd" (plain stochastic gradient descent, weight_decay as L2)."""
    natural_gradient: bool = False
    """Precondition each agent's gradient by its policy's Fisher matrix, computed exactly in the menu logits of the step's prompts, so that a step moves one-token-apart prompts as a table's natural gradient would (llm_marl/learners/natural_gradient.py): for menu policies (tabular, choice_answers), with optim "sgd"; max_grad_norm then clips the preconditioned gradient."""
    natural_gradient_damping: float = 1e-5
    """With natural_gradient: the damping lam, as a fraction of the mean diagonal of the logits' kernel J J^T (> 0; smaller follows the table's natural gradient more closely and takes larger weight steps; a language model's choice answers want 1e-3, where a step stays in the regime its linearization describes: docs/games.md, "Damping 1e-3")."""

    def __post_init__(self) -> None:
        self.validate()

    def learning_rate_of(self, position: int) -> float:
        """The learning rate of the agent at ``position`` in the env's agent order:
        ``agent_learning_rates[position]``, or ``agent_learning_rate`` when that is None."""
        return self.agent_learning_rate if self.agent_learning_rates is None else self.agent_learning_rates[position]

    def rollout_buffer_size_of(self, position: int) -> int:
        """The buffer size of the agent at ``position`` in the env's agent order:
        ``agent_rollout_buffer_sizes[position]``, or ``rollout_buffer_size`` when that is None."""
        return self.rollout_buffer_size if self.agent_rollout_buffer_sizes is None else self.agent_rollout_buffer_sizes[position]

    def advantage_normalization_of(self, position: int) -> bool:
        """Whether the groups of the agent at ``position`` in the env's agent order are divided by
        their std: ``agent_advantage_normalization[position]``, or ``advantage_normalization``."""
        return self.advantage_normalization if self.agent_advantage_normalization is None else self.agent_advantage_normalization[position]

    @property
    def entropy_bonus_used(self) -> bool:
        """Whether any dataset batch has a non-zero entropy coefficient (entropy_coef or entropy_coef_final)."""
        return self.entropy_coef > 0 or bool(self.entropy_coef_final)

    @property
    def resolved_train_batch_size(self) -> int:
        """Samples per optimizer step: ``train_batch_size``, or ``rollout_buffer_size`` when None."""
        return self.rollout_buffer_size if self.train_batch_size is None else self.train_batch_size

    def normalize(self) -> None:
        """Spell values canonically: "crossed" -> "cross", one device (a string or a one-entry list) -> one per agent;
        "a,b" lora_target_modules -> ["a", "b"]."""
        if self.joint_mode == "crossed":
            self.joint_mode = "cross"
        if isinstance(self.lora_target_modules, str):
            self.lora_target_modules = [m for m in self.lora_target_modules.split(",") if m]
        elif self.lora_target_modules is not None and not isinstance(self.lora_target_modules, list):
            self.lora_target_modules = list(self.lora_target_modules)
        for name in ("agent_devices", "reference_devices"):
            devices = getattr(self, name)
            if isinstance(devices, str):
                setattr(self, name, [devices] * self.num_agents)
            elif devices is not None:
                devices = list(devices)
                setattr(self, name, devices * self.num_agents if len(devices) == 1 else devices)

    def validate(self) -> None:
        """Check field types (config_types.py), normalize (see :meth:`normalize`), then raise
        ValueError naming the first invalid field."""
        check_types(self)
        self.normalize()
        _at_least(self, "num_agents", 1)
        _at_least(self, "num_turns", 1)
        _at_least(self, "num_train_epochs", 0)
        _at_least(self, "logging_steps", 1)
        _at_least(self, "num_generations", self.min_generations)
        _at_least(self, "max_new_tokens", 1)
        _at_least(self, "rollout_buffer_size", 1)
        if self.train_batch_size is not None:
            _at_least(self, "train_batch_size", 1)
        _at_least(self, "eval_interval", 0)
        _at_least(self, "eval_num_samples", 0)
        _at_least(self, "eval_batch_size", 1)
        _at_least(self, "save_steps", 0)
        _at_least(self, "items_per_step", 1)
        _at_least(self, "rollout_log_steps", 0)
        if self.generation_batch_size is not None:
            _at_least(self, "generation_batch_size", 1)
        if self.num_threads is not None:
            _at_least(self, "num_threads", 1)
        if self.max_steps is not None:
            _at_least(self, "max_steps", 1)
        if self.lora_r is not None:
            _at_least(self, "lora_r", 1)
        _positive(self, "lora_alpha")
        if self.model_dtype is not None and self.model_dtype not in MODEL_DTYPES:
            raise ValueError(f"model_dtype must be None or one of {', '.join(MODEL_DTYPES)}; got {self.model_dtype!r}")
        if self.sample_dtype is not None and self.sample_dtype not in MODEL_DTYPES:
            raise ValueError(f"sample_dtype must be None or one of {', '.join(MODEL_DTYPES)}; got {self.sample_dtype!r}")
        if self.save_total_limit is not None:
            _at_least(self, "save_total_limit", 1)
        _one_of(self, "joint_mode", JOINT_MODES)
        _one_of(self, "advantage_mode", ADVANTAGE_MODES)
        _one_of(self, "cross_aggregation", CROSS_AGGREGATIONS)
        _one_of(self, "tree_return_aggregation", TREE_RETURN_AGGREGATIONS)
        _positive(self, "tree_return_temperature")
        _at_least(self, "dynamic_sampling_budget", 0)
        _finite(self, "entropy_coef")
        if self.entropy_coef < 0:
            raise ValueError(f"entropy_coef must be >= 0, got {self.entropy_coef!r}")
        if self.entropy_coef_final is not None:
            _finite(self, "entropy_coef_final")
            if self.entropy_coef_final < 0:
                raise ValueError(f"entropy_coef_final must be None or >= 0, got {self.entropy_coef_final!r}")
        _one_per_agent(self, "agent_learning_rates", "rate")
        if self.agent_learning_rates is not None:
            for i, rate in enumerate(self.agent_learning_rates):
                if not (math.isfinite(rate) and rate > 0):
                    raise ValueError(f"agent_learning_rates[{i}] must be a number > 0, got {rate!r}")
        _one_per_agent(self, "agent_advantage_normalization", "true/false")
        _one_per_agent(self, "agent_rollout_buffer_sizes", "size")
        for i, size in enumerate(self.agent_rollout_buffer_sizes or []):
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(f"agent_rollout_buffer_sizes[{i}] must be an int >= 1, got {size!r}")
        _one_of(self, "optim", OPTIMIZERS)
        _positive(self, "natural_gradient_damping")
        _finite(self, "natural_gradient_damping")
        if self.natural_gradient and self.fsdp:
            raise ValueError("natural_gradient=True needs each agent's whole gradient on every rank; fsdp=True shards it: choose one")
        _one_of(self, "parallel_training", PARALLEL_MODES)
        _one_of(self, "logprob_reduction", LOGPROB_REDUCTIONS)
        _one_of(self, "reward_error_policy", ERROR_POLICIES)
        _positive(self, "agent_learning_rate")
        _positive(self, "temperature")
        if self.early_termination_threshold is not None:
            _finite(self, "early_termination_threshold")
        for name in ("discount", "top_p", "reference_kl_coef", "weight_decay"):
            _finite(self, name)
        if self.max_sampler_gap is not None:
            _finite(self, "max_sampler_gap")
            if self.max_sampler_gap < 0:
                raise ValueError(f"max_sampler_gap must be None or a number >= 0, got {self.max_sampler_gap!r}")
        if self.max_grad_norm is not None:
            _finite(self, "max_grad_norm")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 0):
            raise ValueError(f"top_k must be None or an int >= 0, got {self.top_k!r}")
        if not 0.0 <= self.discount <= 1.0:
            raise ValueError(f"discount must be in [0, 1], got {self.discount!r}")
        if self.reference_kl_coef < 0:
            raise ValueError(f"reference_kl_coef must be >= 0, got {self.reference_kl_coef!r}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be None or > 0, got {self.max_grad_norm!r}")
        if self.fsdp and self.parallel_training == "mp":
            raise ValueError('fsdp=True shards each agent across torchrun ranks; parallel_training="mp" places whole agents on devices: choose one')
        if self.fsdp_shard_size is not None:
            _at_least(self, "fsdp_shard_size", 1)
        _one_of(self, "fsdp_gather", ("model", "layer"))
        if self.mixed_precision and not self.fsdp:
            raise ValueError("mixed_precision=True is FSDP2's bf16 compute with fp32 reduction: it needs fsdp=True (without fsdp, load the model in bf16 or set sample_dtype)")
        if self.parallel_training == "mp" and not self.agent_devices:
            raise ValueError('parallel_training="mp" needs agent_devices (one device per agent)')
        for name in ("agent_devices", "reference_devices"):
            _one_per_agent(self, name, "device")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]


def _at_least(config: Any, name: str, low: int) -> None:
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def _one_per_agent(config: Any, name: str, what: str) -> None:
    """A per-agent list field (None allowed) must have one entry per agent."""
    values = getattr(config, name)
    if values is not None and len(values) != config.num_agents:
        raise ValueError(f"{name} must list one {what} per agent ({config.num_agents}); {name} length is {len(values)}: {values!r}")


def _finite(config: Any, name: str) -> None:
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


def _positive(config: Any, name: str) -> None:
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a number > 0, got {value!r}")


def _one_of(config: Any, name: str, allowed: Sequence[str]) -> None:
    value = getattr(config, name)
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}")


_MOVED = ("MAREINFORCEConfig", "MARLOOConfig", "MAReMaxConfig")


def __getattr__(name: str) -> Any:
    """The REINFORCE variants' old home: they import from here for one release, with a warning."""
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import warnings

    warnings.warn(f"{__name__}.{name} moved to llm_marl.learners.reinforce.config; import it from there "
                  "(the old path will be removed)", DeprecationWarning, stacklevel=2)
    # by name, not an import statement: a deprecated re-export, not a dependency of this module
    return getattr(importlib.import_module("llm_marl.learners.reinforce.config"), name)

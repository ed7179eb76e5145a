"""The Hugging Face-compatible trainer constructor of the anchor library (SPEC.md §7).

A script written for CoMLRL's ``MAGRPOTrainer(agent_model=..., reward_func=..., formatters=...,
train_dataset=..., args=...)`` runs here after changing only its imports. The keywords are turned
into a :class:`~llm_marl.tasks.FunctionTask`, a :class:`~llm_marl.envs.DialogueEnv` per split and
one :class:`~llm_marl.policies.CausalLMPolicy` per agent, so rollouts take the same code path as
the env-native constructor.

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
- ``model_config`` keys: ``dtype`` (or ``torch_dtype``), ``attn_implementation``, and
  ``special_tokens`` (a dict passed to ``tokenizer.add_special_tokens``; embeddings are resized).
- ``wandb_config`` is accepted and ignored with a warning: runs log to TensorBoard in
  ``args.output_dir``.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from llm_marl.envs.dialogue import DialogueEnv
from llm_marl.tasks.function_task import FunctionTask


@dataclass
class AnchorBuild:
    env: DialogueEnv
    eval_env: DialogueEnv | None
    policies: list[Any]
    tokenizers: list[Any]
    eval_logger: Callable[..., Any] | None
    eval_aggregator: Callable[..., Any] | None


def _default_formatter(item: Any) -> str:
    return item["prompt"]


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
) -> AnchorBuild:
    """Build env, eval env and policies from the anchor library's keywords (see module doc)."""
    if (agent_model is None) == (agents is None):
        raise ValueError("pass exactly one of agent_model= (homogeneous agents) or agents= (a list, one per agent)")
    if reward_func is None:
        raise ValueError("reward_func is required: reward_func(answers_agent_0, answers_agent_1, ...) -> [float]")
    if train_dataset is None:
        raise ValueError("train_dataset is required to train")
    if wandb_config is not None:
        warnings.warn("wandb_config is ignored: llm_marl logs to TensorBoard under args.output_dir", stacklevel=3)
    count = len(agents) if agents is not None else (num_agents if num_agents is not None else args.num_agents)
    if args.num_agents != count:
        raise ValueError(f"args.num_agents is {args.num_agents} but {count} agents were given")
    if agents is not None and num_agents is not None and num_agents != len(agents):
        raise ValueError(f"num_agents={num_agents} but agents= lists {len(agents)} models")
    sources = list(agents) if agents is not None else [agent_model] * count
    if agents is not None:
        _check_distinct_models(sources)
    tokenizers = _tokenizers(tokenizer, sources)
    models = [_load_model(source, i, model_config or {}, shared=agents is None) for i, source in enumerate(sources)]
    _add_special_tokens(models, tokenizers, (model_config or {}).get("special_tokens"))

    from llm_marl.policies.causal_lm import CausalLMPolicy

    devices = args.agent_devices or [None] * count
    policies = [
        CausalLMPolicy(
            model,
            tok,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            max_batch_size=args.generation_batch_size,
            device=devices[i],
        )
        for i, (model, tok) in enumerate(zip(models, tokenizers))
    ]
    task = FunctionTask(
        reward_func,
        formatters if formatters is not None else _default_formatter,
        external_transition,
        train_dataset,
        num_agents=count,
        num_turns=args.num_turns,
        eval_dataset=eval_dataset,
        reward_processor=reward_processor,
        external_prompt_passthrough=args.external_prompt_passthrough,
    )
    env = DialogueEnv(task, split="train")
    eval_env = DialogueEnv(task, split="eval") if eval_dataset is not None and len(eval_dataset) else None
    return AnchorBuild(env, eval_env, policies, tokenizers, eval_logger, eval_aggregator)


def _check_distinct_models(sources: list[Any]) -> None:
    first: dict[int, int] = {}
    for i, source in enumerate(sources):
        if isinstance(source, str):
            continue
        j = first.setdefault(id(source), i)
        if j != i:
            raise ValueError(
                f"agents[{j}] and agents[{i}] (agent_{j} and agent_{i}) are the same model object: they would "
                f"train one set of weights; pass a copy per agent (copy.deepcopy), or agent_model= (copied per agent)"
            )


def _tokenizers(tokenizer: Any, sources: list[Any]) -> list[Any]:
    from transformers import AutoTokenizer

    if isinstance(tokenizer, (list, tuple)):
        if len(tokenizer) != len(sources):
            raise ValueError(f"tokenizer: got {len(tokenizer)} tokenizers for {len(sources)} agents")
        return [copy.deepcopy(t) for t in tokenizer]
    if tokenizer is not None:
        return [copy.deepcopy(tokenizer) for _ in sources]
    loaded = []
    for i, source in enumerate(sources):
        if not isinstance(source, str):
            raise ValueError(f"agent {i} is a loaded model: pass tokenizer= (one, or a list with one per agent)")
        loaded.append(AutoTokenizer.from_pretrained(source))
    return loaded


def _load_model(source: Any, index: int, model_config: dict[str, Any], shared: bool) -> Any:
    from transformers import AutoModelForCausalLM

    if isinstance(source, str):
        kwargs = {}
        dtype = model_config.get("dtype", model_config.get("torch_dtype"))
        if dtype is not None:
            kwargs[_dtype_keyword()] = dtype
        if model_config.get("attn_implementation") is not None:
            kwargs["attn_implementation"] = model_config["attn_implementation"]
        return AutoModelForCausalLM.from_pretrained(source, **kwargs)
    if not hasattr(source, "generate"):
        raise TypeError(f"agent {index}: expected a model id/path or a causal LM, got {type(source).__name__}")
    return copy.deepcopy(source) if shared else source


def _dtype_keyword() -> str:
    """``from_pretrained``'s dtype keyword: ``dtype`` from transformers 4.56 on, ``torch_dtype``
    before (older versions would silently store an unknown ``dtype=`` in the config)."""
    import transformers
    from packaging.version import Version

    return "dtype" if Version(transformers.__version__).release >= (4, 56) else "torch_dtype"


def _add_special_tokens(models: list[Any], tokenizers: list[Any], special: dict[str, Any] | None) -> None:
    if not special:
        return
    for model, tok in zip(models, tokenizers):
        if tok.add_special_tokens(dict(special)):
            model.resize_token_embeddings(len(tok))

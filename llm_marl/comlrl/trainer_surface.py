"""The public attributes of CoMLRL 1.4.3's trainers, on the trainers of :mod:`llm_marl.comlrl`.

A script written for CoMLRL reads ``trainer.agents[0]``, ``trainer.optimizers[0]``,
``trainer.num_agents`` ... after building or training. llm_marl's own trainers keep agents by
name (``trainer.agents`` is the list of names, ``trainer.optimizers`` and ``trainer.critics`` are
dicts keyed by name); the CoMLRL-namespace classes answer CoMLRL's names with CoMLRL's types,
every one a view of the object llm_marl trains, by agent position:

- ``agents``: each agent's model (``policy.model``; the policy itself where it has no model),
  ``num_agents`` their number (1 for the centralized trainers: the one actor);
- ``optimizers`` (and ``agent_optimizers``, the actor-critic trainers' name): the optimizer that
  steps each agent, None where an agent has none (frozen); assigning a list replaces them;
- ``critics`` (IAC, MAAC): the critics that have their own model, in agent order: one per agent
  for IAC with ``use_separate_critic``, none for value heads on the agents' own models, MAAC's one
  central critic; each is the llm_marl critic object (model and value head) the critic optimizer
  steps, not CoMLRL's ``CausalLMWithValueHead``;
- ``reference_models``: the frozen reference copies when ``reference_kl_enabled``, else ``[]``;
- ``tokenizer`` (the first agent's) and ``tokenizers``; ``model_name`` (``agent_model`` when it is
  a name, else the first model's ``name_or_path`` or class name); ``reward_func``,
  ``reward_processor`` (identity when none was given), ``formatters`` (one per agent),
  ``external_transition``, ``train_dataset``, ``eval_dataset``, ``model_config``,
  ``wandb_config`` as given; ``agent_devices`` (``torch.device`` per agent), ``device`` (the first),
  ``parallel_training``, ``advantage_mode``; ``critic_type`` (IAC, MAAC);
- ``env_step``: joint actions rewarded in training rollouts so far (CoMLRL's counter), 0 before
  training. It counts in this process: a resumed run starts it again from 0.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from llm_marl.rollouts import iter_nodes


def _identity(value: Any) -> Any:
    return value


class CoMLRLSurface:
    """CoMLRL's public trainer attributes (see the module docstring); mixed in before llm_marl's trainer."""

    env_step: int = 0
    """Joint actions rewarded in training rollouts so far."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        task_keywords = {name: kwargs.get(name) for name in ("train_dataset", "eval_dataset", "model_config", "wandb_config")}
        agent_model = kwargs.get("agent_model")
        super().__init__(*args, **kwargs)
        self.env_step = 0
        for name, value in task_keywords.items():
            setattr(self, name, value if value is not None or name != "model_config" else {})
        task = _task_of(getattr(self, "env", None))
        self.reward_func: Callable[..., Any] | None = getattr(task, "reward_func", None)
        self.reward_processor: Callable[[float], float] = getattr(task, "reward_processor", None) or _identity
        formatters = getattr(task, "formatters", None)
        self.formatters: list[Callable[..., Any]] = list(formatters) if formatters is not None else []
        self.external_transition: Callable[..., Any] | None = getattr(task, "external_transition", None)
        self.model_name: str | None = agent_model if isinstance(agent_model, str) else _model_name(self.agents)

    # --- views by agent position ---------------------------------------------------------------

    @property
    def agents(self) -> list[Any]:  # type: ignore[override]
        """Each agent's model, by agent position (the policy itself where it has no ``model``)."""
        return [getattr(self.policies[a], "model", self.policies[a]) for a in self.agent_ids]

    @property
    def num_agents(self) -> int:
        """The number of trained agents (1 for a centralized trainer's actor)."""
        return len(self.agent_ids)

    @property
    def optimizers(self) -> list[torch.optim.Optimizer | None]:  # type: ignore[override]
        """The optimizer that steps each agent, by agent position (None: the agent has none)."""
        return [self.optimizer_by_agent.get(a) for a in self.agent_ids]

    @optimizers.setter
    def optimizers(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        optimizers = list(optimizers)
        if len(optimizers) != len(self.agent_ids):
            raise ValueError(f"optimizers must list one optimizer per agent ({len(self.agent_ids)}), got {len(optimizers)}")
        self.optimizer_by_agent = {a: o for a, o in zip(self.agent_ids, optimizers) if o is not None}

    @property
    def reference_models(self) -> list[Any]:
        """The frozen reference models by agent position; [] without reference KL."""
        references = getattr(self, "reference_policies", None)
        if not references:
            return []
        return [getattr(references[a], "model", references[a]) for a in self.agent_ids]

    @property
    def tokenizer(self) -> Any:
        """The first agent's tokenizer (None where the agents have none)."""
        tokenizers = self.tokenizers
        return tokenizers[0] if tokenizers else None

    @property
    def tokenizers(self) -> list[Any]:
        """Each agent's tokenizer, by agent position."""
        return list(self.__dict__.get("tokenizers") or [getattr(self.policies[a], "tokenizer", None) for a in self.agent_ids])

    @tokenizers.setter
    def tokenizers(self, tokenizers: Sequence[Any]) -> None:
        self.__dict__["tokenizers"] = list(tokenizers)

    @property
    def agent_devices(self) -> list[torch.device]:
        """The device of each agent's model."""
        return [_device_of(model) for model in self.agents]

    @property
    def device(self) -> torch.device:
        """The first agent's device."""
        return self.agent_devices[0]

    @property
    def parallel_training(self) -> str:
        return self.args.parallel_training

    @property
    def advantage_mode(self) -> str:
        return self.args.advantage_mode

    @property
    def verbose(self) -> bool:
        """Print progress (CoMLRL's flag): the config's ``progress_bar``."""
        return bool(self.args.progress_bar)

    @verbose.setter
    def verbose(self, value: bool) -> None:
        self.args.progress_bar = bool(value)

    # --- counting env steps -------------------------------------------------------------------

    def _collect(self, indices: list[int]) -> Any:
        roots, samples, elapsed = super()._collect(indices)  # type: ignore[misc]
        self.env_step += sum(len(node.rewards) for node in iter_nodes(roots))
        return roots, samples, elapsed


class CoMLRLActorCriticSurface(CoMLRLSurface):
    """CoMLRL's actor-critic attributes too: ``critics`` as a list, ``agent_optimizers``, ``critic_type``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        config = kwargs.get("args")
        given = [name for name in ("critics", "critic_model") if kwargs.get(name) is not None]
        if config is not None and not config.use_separate_critic and given:  # before any model is loaded, as CoMLRL
            raise ValueError(f"use_separate_critic=False puts the value head on each agent's own model: pass no {' or '.join(given)}=")
        super().__init__(*args, **kwargs)

    @property
    def critics(self) -> list[Any]:  # type: ignore[override]
        """The critics with their own model, in agent order (MAAC: its one central critic)."""
        return [critic for critic in self.critic_by_agent.values() if not getattr(critic, "shared", False)]

    @property
    def agent_optimizers(self) -> list[torch.optim.Optimizer | None]:
        """CoMLRL's actor-critic name for :attr:`optimizers`."""
        return self.optimizers

    @property
    def critic_type(self) -> str:
        return self.args.critic_type


def _task_of(env: Any) -> Any:
    """The FunctionTask under ``env`` and its wrappers (a centralized env wraps the dialogue env)."""
    for _ in range(8):
        if env is None or hasattr(env, "task"):
            break
        env = getattr(env, "env", None)
    return getattr(env, "task", None)


def _model_name(models: Sequence[Any]) -> str | None:
    if not models:
        return None
    config = getattr(models[0], "config", None)
    return str(getattr(config, "_name_or_path", "") or type(models[0]).__name__)


def _device_of(model: Any) -> torch.device:
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration, TypeError):
        return torch.device("cpu")

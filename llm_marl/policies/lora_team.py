"""A team of agents as LoRA adapters on one frozen base model.

``LoRATeam.from_pretrained(path_or_id, agents=("a", "b"), r=8, alpha=16)`` loads one causal LM,
freezes it and gives every agent its own LoRA adapter (the ``peft`` library's adapters, saved in
its format). ``team.policies`` maps each agent to a :class:`AdapterPolicy`, a
:class:`~llm_marl.policies.CausalLMPolicy` whose rows run through its own adapter and whose
``parameters()`` are that adapter's alone: any trainer takes them as ``policies=``. N agents
cost one copy of the weights plus N small adapters and their optimizer states.

One pass for the whole team. The team's :class:`TeamRunner` routes every batch row through its
own agent's adapter: the frozen base layer runs once over all rows, and each adapter adds its
low-rank update to its agent's rows (contiguous runs of rows, so a slice each). So
:meth:`LoRATeam.sample` answers every agent's prompts in ONE decode loop and
:meth:`LoRATeam.token_log_probs` scores every agent's answers in one forward; each row's result
is the one its agent gets alone (up to float rounding of batch-size dependent kernels), and each
agent's loss reaches only its own adapter. The rollout tree asks a team once per depth
(:func:`llm_marl.learners.tree.grow_trees`) and the trainers score a team in one forward per
optimizer step. Team sampling needs the members' sampling settings to agree; where they differ
(or ``use_hf_generate`` is set) each agent samples alone.

Reference KL for free: :meth:`LoRATeam.reference_policy` is the base with adapters disabled
(rows routed to ``"__base__"``), no frozen copy. An untrained adapter (``lora_B = 0``, peft's
initialisation) adds exact zeros, so its reference KL is exactly 0.

Saving: :meth:`LoRATeam.save_pretrained` writes ``dir/<agent>/`` per agent
(``adapter_config.json`` + ``adapter_model.safetensors``), which
``peft.PeftModel.from_pretrained(base_model, dir/<agent>)`` reads; ``from_pretrained(...,
adapters=dir)`` loads a saved team back. Checkpoints of the trainers hold each adapter's weights
(``AdapterPolicy.state_dict``) and its optimizer; the base is not copied.

Real model sizes: ``dtype="bfloat16"`` loads the base in bfloat16 (half the weight memory;
adapters stay float32, as peft keeps them, and log-probs are computed in float32);
``gradient_checkpointing=True`` keeps only each layer's input for the backward pass and
recomputes the rest (activation memory of one layer instead of all; the model is put in train
mode, since transformers checkpoints only there, and scoring then runs without a KV cache). It
changes memory, never the math: the agents' policies switch the model's dropout off
(``disable_dropout=True``, the default, LoRA dropout included; see
:func:`~llm_marl.policies.causal_lm.disable_dropout`), so a model with dropout scores the same
log-probs and gradients with and without checkpointing, and the sampler's.
``sample_dtype="bfloat16"`` decodes with a bfloat16 copy of the team's model (base and adapters,
:meth:`LoRATeam.sampling_runner`; the adapters are copied again after every update, the frozen
base never) while scoring stays on the model itself: exact log-probs, faster sampling on CPUs
with bf16 matmul units, for the copy's memory (half an fp32 base's weights).
"""

from __future__ import annotations

import json
import os
import types
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch

from llm_marl.policies import scoring
from llm_marl.policies.base import Completion
from llm_marl.policies.causal_lm import _SETTING_NAMES, SETTINGS_FILE, CausalLMPolicy
from llm_marl.policies.lm_runner import LowPrecisionShadow, ModelRunner, model_name
from llm_marl.policies.weight_changes import weights_changed

__all__ = ["AdapterPolicy", "LoRATeam", "TeamRunner", "BASE_ROUTE"]

BASE_ROUTE = "__base__"
"""The route of rows that run through the base model with every adapter disabled."""
TEAM_FILE = "llm_marl_team.json"

SHARED_SAMPLING = (
    "max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k", "max_batch_size", "sample_dtype",
    "packed_weights", "eos_token_ids", "context_length",
)
"""The settings a team's shared decode loop takes from its first agent: agents must agree on them."""


def _segments(routes: Sequence[str]) -> list[tuple[str, int, int]]:
    """Consecutive runs of equal routes as ``(route, start, stop)``."""
    runs: list[tuple[str, int, int]] = []
    start = 0
    for row in range(1, len(routes) + 1):
        if row == len(routes) or routes[row] != routes[start]:
            runs.append((routes[start], start, row))
            start = row
    return runs


def _lora_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    from peft.tuners.lora import LoraLayer
    from peft.tuners.lora.layer import Linear as LoraLinear

    layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
    wrong = [type(m).__name__ for m in layers if not isinstance(m, LoraLinear)]
    if wrong:
        raise ValueError(
            f"LoRATeam routes rows through linear LoRA layers only; target_modules hit {sorted(set(wrong))}"
        )
    return layers


def adapter_parameters(model: torch.nn.Module, adapter: str) -> Iterator[tuple[str, torch.nn.Parameter]]:
    """``(name, parameter)`` of one LoRA adapter of ``model`` (its ``lora_A`` and ``lora_B`` weights)."""
    marks = (f".lora_A.{adapter}.", f".lora_B.{adapter}.")
    return ((n, p) for n, p in model.named_parameters() if any(m in n for m in marks))


def save_adapter(model: Any, adapter: str, directory: str | os.PathLike[str]) -> Path:
    """Write one adapter of a peft ``model`` in peft's format (``adapter_model.safetensors`` and
    ``adapter_config.json``): ``peft.PeftModel.from_pretrained(base_model, directory)`` reads it."""
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    weights = get_peft_model_state_dict(model, adapter_name=adapter)
    save_file({k: v.detach().contiguous().cpu() for k, v in weights.items()}, str(path / "adapter_model.safetensors"))
    model.peft_config[adapter].save_pretrained(str(path))
    return path


class TeamRunner(ModelRunner):
    """A :class:`ModelRunner` whose rows each carry the adapter (agent) they run through."""

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        self.segments: list[tuple[str, int, int]] | None = None
        for layer in _lora_layers(model):
            layer.forward = types.MethodType(_routed_forward(self, type(layer).forward), layer)

    def forward(self, inputs: dict[str, Any], routes: Sequence[str] | None = None) -> Any:
        """``model(**inputs)`` with row ``i`` through adapter ``routes[i]`` (``"__base__"``: none)."""
        if routes is None:
            raise ValueError("a team's forward needs one route (agent) per row")
        if len(routes) != inputs["input_ids"].shape[0]:
            raise ValueError(f"{len(routes)} routes for {inputs['input_ids'].shape[0]} rows")
        previous, self.segments = self.segments, _segments(list(routes))
        try:
            return self.model(**inputs)
        finally:
            self.segments = previous

    def checkpoint_contexts(self) -> tuple[Any, Any]:
        """``torch.utils.checkpoint``'s ``context_fn``: called as a checkpointed layer runs, it
        captures the routing of that forward, so the layer's recompute in the backward pass runs
        each row through the same adapter, whichever forward (scoring chunk, critic) came last."""
        return nullcontext(), _Routing(self, self.segments)


class _Routing:
    """Sets a :class:`TeamRunner`'s routing for the duration of a ``with`` block (re-enterable)."""

    def __init__(self, runner: TeamRunner, segments: list[tuple[str, int, int]] | None) -> None:
        self.runner, self.segments, self.saved = runner, segments, []

    def __enter__(self) -> None:
        self.saved.append(self.runner.segments)
        self.runner.segments = self.segments

    def __exit__(self, *exc: Any) -> None:
        self.runner.segments = self.saved.pop()


def _routed_forward(runner: TeamRunner, plain: Any) -> Any:
    def forward(layer: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        segments = runner.segments
        if segments is None or layer.disable_adapters or layer.merged:
            return plain(layer, x, *args, **kwargs)
        if x.shape[0] != segments[-1][2]:
            raise RuntimeError(f"routing for {segments[-1][2]} rows, but a LoRA layer got {x.shape[0]}")
        result = layer.base_layer(x, *args, **kwargs)
        parts = []
        for route, start, stop in segments:
            part = result[start:stop]
            if route != BASE_ROUTE:
                if route not in layer.lora_A:
                    raise KeyError(f"no adapter {route!r} in the team (adapters: {sorted(layer.lora_A)})")
                lora_a, lora_b = layer.lora_A[route], layer.lora_B[route]
                rows = x[start:stop].to(lora_a.weight.dtype)
                update = lora_b(lora_a(layer.lora_dropout[route](rows))) * layer.scaling[route]
                part = part + update.to(result.dtype)
            parts.append(part)
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)

    return forward


class AdapterPolicy(CausalLMPolicy):
    """One agent of a :class:`LoRATeam`: a :class:`CausalLMPolicy` whose rows run through the
    agent's adapter and whose parameters are that adapter's alone."""

    def __init__(self, team: "LoRATeam", adapter: str, **settings: Any) -> None:
        self.team = team
        self.adapter = adapter
        settings.pop("fused_activations", None)  # the team fuses the shared model once
        super().__init__(team.model, team.tokenizer, fused_activations=False, **settings)
        self.name = f"{self.name}[{adapter}]"

    def _make_runner(self, model: Any) -> ModelRunner:
        return self.team.runner

    def _routes(self, rows: int) -> list[str]:
        return [self.adapter] * rows

    def _samplers(self, routes: Sequence[str | None]) -> list[Any]:
        """Rows routed through another agent's adapter (the team's one decode loop) were sampled by that agent."""
        return [self if route is None else self.team.policies.get(route, self) for route in routes]

    def _sampling_runner(self) -> ModelRunner:
        """The team's sampling runner (:meth:`LoRATeam.sampling_runner`); ``model.generate``
        (``use_hf_generate``) always runs on the model itself."""
        self._sampled_with = None
        if self.use_hf_generate or self.generation_kwargs:
            return self.runner
        runner = self.team.sampling_runner(self.sample_dtype)
        self._sampled_with = self.team.sampled_with  # the answers' weights version (None: the adapters' own)
        return runner

    def sample(self, observations: Sequence[str], num_samples: int) -> list[list[Completion]]:
        if self.use_hf_generate or self.generation_kwargs:
            with self.team.only(self.adapter):
                return super().sample(observations, num_samples)
        return super().sample(observations, num_samples)

    def named_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        return adapter_parameters(self.model, self.adapter)

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return (p for _, p in self.named_parameters())

    def state_dict(self) -> dict[str, torch.Tensor]:
        """This adapter's weights (the frozen base is not part of an agent's state)."""
        return {n: p.detach() for n, p in self.named_parameters()}

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor], strict: bool = True) -> Any:
        own = dict(self.named_parameters())
        missing, unexpected = sorted(set(own) - set(state_dict)), sorted(set(state_dict) - set(own))
        if strict and (missing or unexpected):
            raise KeyError(f"adapter {self.adapter!r}: missing {missing[:3]}, unexpected {unexpected[:3]}")
        with torch.no_grad():
            for name, value in state_dict.items():
                if name in own:
                    own[name].copy_(value)
        weights_changed(own.values())
        return types.SimpleNamespace(missing_keys=missing, unexpected_keys=unexpected)

    def save_pretrained(self, directory: str | os.PathLike[str]) -> Path:
        """Write this adapter in peft's format (plus the tokenizer and the policy settings):
        ``peft.PeftModel.from_pretrained(base_model, directory)`` reads it."""
        path = save_adapter(self.model, self.adapter, directory)
        self.tokenizer.save_pretrained(path)
        with open(path / SETTINGS_FILE, "w", encoding="utf-8") as handle:
            json.dump(self.settings(), handle, indent=2)
        return path

    def reference_policy(self) -> "BasePolicy":
        """The base model with adapters disabled, under this agent's settings (no copy)."""
        return BasePolicy(self.team, BASE_ROUTE, **self.settings())

    def to(self, device: str | torch.device) -> "AdapterPolicy":
        self.team.to(device)
        return self

    def __repr__(self) -> str:
        return f"AdapterPolicy({self.adapter!r} of {self.team.name!r}, max_new_tokens={self.max_new_tokens})"


class BasePolicy(AdapterPolicy):
    """The team's base with adapters disabled: a frozen reference with no parameters of its own."""

    def named_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        return iter(())

    def save_pretrained(self, directory: str | os.PathLike[str]) -> Path:  # pragma: no cover - not a trained agent
        raise TypeError("the base reference of a LoRATeam is not saved; save the team's adapters instead")


class LoRATeam:
    """N agents as N LoRA adapters on one frozen base model (see the module docstring).

    Args:
        model: a ``peft.PeftModel`` holding one LoRA adapter per agent (named after the agent).
        tokenizer: the base model's tokenizer.
        agents: the agent names, in order.
        gradient_checkpointing: recompute each layer in the backward pass instead of storing it.
        **settings: :class:`CausalLMPolicy` settings shared by every agent (``max_new_tokens``,
            ``temperature``, ...).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        agents: Sequence[str],
        *,
        gradient_checkpointing: bool = False,
        **settings: Any,
    ) -> None:
        agents = _check_agents(agents)
        missing = [a for a in agents if a not in getattr(model, "peft_config", {})]
        if missing:
            raise ValueError(f"the model has no LoRA adapter for agent(s) {missing}")
        self.model = model
        self.tokenizer = tokenizer
        self.agents = agents
        self.trainable_adapters: list[str] = list(agents)
        """The adapters that train: the agents', and value adapters (:meth:`add_adapter`)."""
        self._set_trainable()
        if settings.pop("fused_activations", True):
            from llm_marl.policies.causal_lm import fuse_activations

            fuse_activations(model)
        self.runner = TeamRunner(model)
        self.gradient_checkpointing = bool(gradient_checkpointing)
        if self.gradient_checkpointing:
            inner = model.get_base_model()
            options = {"use_reentrant": False, "context_fn": self.runner.checkpoint_contexts}
            if hasattr(inner, "activation_checkpointing_enable"):  # transformers >= 5.x's name
                inner.activation_checkpointing_enable(activation_checkpointing_kwargs=options)
            else:
                inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)
            model.train()
        self._shadow: LowPrecisionShadow | None = None
        self.policies: dict[str, AdapterPolicy] = {a: AdapterPolicy(self, a, **settings) for a in agents}
        self.name = model_name(model.get_base_model())

    def sampling_runner(self, sample_dtype: str | None) -> ModelRunner:
        """The runner the team's decode loop uses: :attr:`runner`, or for a ``sample_dtype`` that
        is not every parameter's dtype a :class:`TeamRunner` over a copy of the model in that
        dtype, refreshed from the current weights (only changed parameters are copied)."""
        dtype = _dtype(sample_dtype) if sample_dtype else None
        self.sampled_with: int | None = None
        """The version of the weights the last runner returned holds (None: the model's own)."""
        if dtype is None or all(p.dtype == dtype for p in self.model.parameters() if p.is_floating_point()):
            return self.runner
        if self._shadow is None or self._shadow.dtype != dtype:
            self._shadow = LowPrecisionShadow(self.model, dtype, TeamRunner)
        runner = self._shadow.current()
        self.sampled_with = self._shadow.weights
        return runner

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_pretrained(
        cls,
        path_or_id: str | os.PathLike[str],
        agents: Sequence[str] = ("agent_0", "agent_1"),
        r: int = 8,
        alpha: float = 16,
        target_modules: Sequence[str] | str | None = None,
        *,
        dropout: float = 0.0,
        adapters: str | os.PathLike[str] | Mapping[str, str | os.PathLike[str]] | None = None,
        dtype: str | torch.dtype | None = None,
        gradient_checkpointing: bool = False,
        init_seed: int = 0,
        model_kwargs: Mapping[str, Any] | None = None,
        tokenizer_kwargs: Mapping[str, Any] | None = None,
        **settings: Any,
    ) -> "LoRATeam":
        """Load the base with the ``Auto*`` classes and give each agent a new LoRA adapter
        (``r``, ``alpha``, ``target_modules``: None lets peft pick the attention projections of
        known architectures), or with ``adapters=dir`` the saved adapters ``dir/<agent>/`` (or
        ``adapters={agent: folder}``, e.g. a run's ``final/<agent>``), which keep their own ``r``,
        ``alpha`` and target modules.
        ``dtype`` (e.g. ``"bfloat16"``) is the base's weight dtype; agent ``i``'s new adapter is
        initialised from seed ``init_seed + i`` (the global RNG is untouched); ``settings`` are
        those of :class:`CausalLMPolicy`."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from llm_marl.policies.models import resolve_model

        path_or_id = resolve_model(path_or_id)  # a named model (``smollm2-135m``): its cached folder
        kwargs = dict(model_kwargs or {})
        if dtype is not None:
            kwargs["dtype"] = _dtype(dtype)
        base = AutoModelForCausalLM.from_pretrained(path_or_id, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(path_or_id, **dict(tokenizer_kwargs or {}))
        return cls.from_model(
            base,
            tokenizer,
            agents,
            r=r,
            alpha=alpha,
            target_modules=target_modules,
            dropout=dropout,
            adapters=adapters,
            gradient_checkpointing=gradient_checkpointing,
            init_seed=init_seed,
            **settings,
        )

    @classmethod
    def from_model(
        cls,
        base: Any,
        tokenizer: Any,
        agents: Sequence[str],
        *,
        r: int = 8,
        alpha: float = 16,
        target_modules: Sequence[str] | str | None = None,
        dropout: float = 0.0,
        adapters: str | os.PathLike[str] | Mapping[str, str | os.PathLike[str]] | None = None,
        gradient_checkpointing: bool = False,
        init_seed: int = 0,
        **settings: Any,
    ) -> "LoRATeam":
        """As :meth:`from_pretrained`, around an already loaded base model (wrapped in place)."""
        from peft import LoraConfig, PeftModel, get_peft_model

        agents = _check_agents(agents)
        if adapters is None:
            if not isinstance(r, int) or isinstance(r, bool) or r < 1:
                raise ValueError(f"r (lora_r) must be an int >= 1, got {r!r}")
            if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or alpha <= 0:
                raise ValueError(f"alpha (lora_alpha) must be a number > 0, got {alpha!r}")
        for p in base.parameters():
            p.requires_grad_(False)
        if adapters is not None:  # the saved adapters keep their own r, alpha and target modules
            if isinstance(adapters, Mapping):
                folders = {a: Path(adapters[a]) for a in agents if a in adapters}
            else:
                folders = {a: Path(adapters) / a for a in agents}
            saved = folders[agents[0]] / SETTINGS_FILE if agents[0] in folders else None
            if saved is not None and saved.is_file():
                with open(saved, encoding="utf-8") as handle:
                    stored = json.load(handle)
                settings = {**{k: v for k, v in stored.items() if k in _SETTING_NAMES}, **settings}
            absent = [a for a in agents if a not in folders or not (folders[a] / "adapter_config.json").is_file()]
            if absent:
                raise FileNotFoundError(f"{adapters}: no saved adapter for agent(s) {absent} (expected <folder>/<agent>/adapter_config.json)")
            with _quiet_peft():
                model = PeftModel.from_pretrained(base, str(folders[agents[0]]), adapter_name=agents[0], is_trainable=True)
            for agent in agents[1:]:
                model.load_adapter(str(folders[agent]), adapter_name=agent, is_trainable=True)
        else:
            modules = [target_modules] if isinstance(target_modules, str) else target_modules
            config = LoraConfig(
                r=r,
                lora_alpha=alpha,
                lora_dropout=dropout,
                target_modules=list(modules) if modules else None,
                task_type="CAUSAL_LM",
                fan_in_fan_out=getattr(getattr(base, "config", None), "model_type", "") == "gpt2",
            )
            # Each adapter's initial lora_A is drawn from its own seed, not the global RNG: a
            # team built twice is the same team (and a resumed run starts where the first did).
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(init_seed)
                with _quiet_peft():
                    model = get_peft_model(base, config, adapter_name=agents[0])
                for i, agent in enumerate(agents[1:], start=1):
                    torch.manual_seed(init_seed + i)
                    model.add_adapter(agent, config)
        return cls(model, tokenizer, agents, gradient_checkpointing=gradient_checkpointing, **settings)

    # ------------------------------------------------------------------ state

    def save_pretrained(self, directory: str | os.PathLike[str]) -> Path:
        """Write ``directory/<agent>/`` (peft adapter format) for every agent, and the team's
        settings; ``from_pretrained(base, agents=..., adapters=directory)`` loads them back."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        for agent, policy in self.policies.items():
            policy.save_pretrained(path / agent)
        with open(path / TEAM_FILE, "w", encoding="utf-8") as handle:
            json.dump({"agents": self.agents, "gradient_checkpointing": self.gradient_checkpointing}, handle, indent=2)
        return path

    def reference_policy(self) -> BasePolicy:
        """The base with adapters disabled (the reference of every agent's KL)."""
        return self.policies[self.agents[0]].reference_policy()

    def to(self, device: str | torch.device) -> "LoRATeam":
        self.model.to(device)
        return self

    @contextmanager
    def only(self, adapter: str) -> Iterator[None]:
        """Within: plain forwards (e.g. ``model.generate``) run through ``adapter`` alone."""
        previous = self.model.active_adapter
        self.model.set_adapter(adapter)
        try:
            yield
        finally:
            self.model.set_adapter(previous)
            self._set_trainable()  # set_adapter freezes the others

    def _set_trainable(self) -> None:
        """Only the adapters in :attr:`trainable_adapters` require gradients; the base never does."""
        marks = [f".lora_{ab}.{a}." for a in self.trainable_adapters for ab in "AB"]
        for name, parameter in self.model.named_parameters():
            parameter.requires_grad_(any(m in name for m in marks))

    def add_adapter(self, name: str, like: str) -> None:
        """A new trainable adapter ``name`` on the team's base, with agent ``like``'s LoRA config
        and a copy of its current weights, routed like an agent's (e.g. a critic's value adapter,
        :class:`~llm_marl.policies.adapter_critic.AdapterCritic`). The base is not copied."""
        import copy

        if not isinstance(name, str) or not name or "." in name or name == BASE_ROUTE:
            raise ValueError(f"adapter name must be a non-empty string without '.', not {BASE_ROUTE!r}; got {name!r}")
        if name in self.model.peft_config:
            raise ValueError(f"the team already has an adapter named {name!r} (adapters: {sorted(self.model.peft_config)})")
        if like not in self.model.peft_config:
            raise KeyError(f"no adapter {like!r} in the team (adapters: {sorted(self.model.peft_config)})")
        layers = _lora_layers(self.model)
        self.model.add_adapter(name, copy.deepcopy(self.model.peft_config[like]))
        if len(_lora_layers(self.model)) != len(layers):  # pragma: no cover - same config, same layers
            raise RuntimeError(f"adapter {name!r} added LoRA layers that the team's runner does not route")
        with torch.no_grad():
            for layer in layers:
                for weights in (layer.lora_A, layer.lora_B):
                    weights[name].weight.copy_(weights[like].weight)
        self.trainable_adapters.append(name)
        self._set_trainable()

    # ------------------------------------------------------------------ one pass for the team

    def _batchable(self, agents: Sequence[str]) -> bool:
        """Whether the agents can share one decode loop: they agree on everything the loop reads
        from its lead policy. Prompt encoding (``system_prompt``, ``add_special_tokens``) is each
        agent's own, so agents with different system prompts still sample together."""
        first = self.policies[agents[0]]
        same = all(getattr(self.policies[a], s) == getattr(first, s) for a in agents for s in SHARED_SAMPLING)
        return same and not any(self.policies[a].use_hf_generate or self.policies[a].generation_kwargs for a in agents)

    def sample(self, requests: Mapping[str, Sequence[str]], num_samples: int) -> dict[str, list[list[Completion]]]:
        """``num_samples`` answers per observation for every agent in ``requests`` (agent ->
        observations), from ONE decode loop whose rows carry their agent's adapter (chunked only
        by ``max_batch_size``)."""
        agents = list(requests)
        unknown = [a for a in agents if a not in self.policies]
        if unknown:
            raise KeyError(f"agent(s) {unknown} are not in this team {self.agents}")
        if not agents:
            return {}
        if not self._batchable(agents):
            return {a: self.policies[a].sample(list(requests[a]), num_samples) for a in agents}
        if not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be an int >= 1, got {num_samples!r}")
        lead = self.policies[agents[0]]
        prompts: list[list[int]] = []
        routes: list[str] = []
        for agent in agents:
            encoded = self.policies[agent].encode_prompts(list(requests[agent]))
            prompts += encoded
            routes += [agent] * len(encoded)
        answers = lead.sample_encoded(prompts, num_samples, routes)
        result, start = {}, 0
        for agent in agents:
            count = len(requests[agent])
            result[agent] = answers[start : start + count]
            start += count
        return result

    def token_log_probs(
        self, requests: Mapping[str, tuple[Sequence[str], Sequence[Completion]]]
    ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Per-token log-probs ``(values, mask)`` of every agent's answers (agent ->
        (observations, completions)) from one forward whose rows carry their agent's adapter
        (chunked only by ``max_batch_size`` / ``max_batch_tokens``). Differentiable; each
        agent's values depend on its own adapter only."""
        agents = list(requests)
        if not agents:
            return {}
        first = self.policies[agents[0]]
        scoring_settings = ("score_temperature", "temperature", "score_prompts_once", "max_batch_size", "max_batch_tokens")
        if any(getattr(self.policies[a], s) != getattr(first, s) for a in agents for s in scoring_settings):
            return {a: self.policies[a].token_log_probs(*requests[a]) for a in agents}
        prompts, answers, routes, counts = [], [], [], []
        for agent in agents:
            observations, completions = list(requests[agent][0]), list(requests[agent][1])
            if len(observations) != len(completions):
                raise ValueError(f"agent {agent!r}: {len(observations)} observations but {len(completions)} completions")
            policy = self.policies[agent]
            prompts += policy.encode_prompts(observations)
            answers += [policy._answer_ids(c) for c in completions]
            routes += [agent] * len(completions)
            counts.append(len(completions))
        values, mask = scoring.token_log_probs(
            self.runner,
            prompts,
            answers,
            pad_token_id=first.pad_token_id,
            temperature=first.effective_score_temperature,
            prompts_once=first.score_prompts_once,
            max_batch_size=first.max_batch_size,
            max_batch_tokens=first.max_batch_tokens,
            routes=routes,
            entropy_out=(entropy := []),
            entropy_grad=any(getattr(self.policies[a], "entropy_grad", False) for a in agents),
        )
        result, start = {}, 0
        for agent, count in zip(agents, counts):
            rows = slice(start, start + count)
            width = max((len(a) for a in answers[rows]), default=0)
            result[agent] = (values[rows, :width], mask[rows, :width])
            self.policies[agent].last_token_entropy = (entropy[0][rows, :width], mask[rows, :width])
            self.policies[agent]._measure_gap(list(requests[agent][1]), *result[agent])
            start += count
        return result

    def log_probs(
        self, requests: Mapping[str, tuple[Sequence[str], Sequence[Completion]]], reduction: str = "sum"
    ) -> dict[str, torch.Tensor]:
        """Each agent's whole-answer log-probs (sum or mean of token log-probs), one forward."""
        if reduction not in ("sum", "mean"):
            raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
        totals = {}
        for agent, (values, mask) in self.token_log_probs(requests).items():
            total = values.sum(dim=-1)
            totals[agent] = total / mask.sum(dim=-1).clamp(min=1) if reduction == "mean" else total
        return totals

    def __repr__(self) -> str:
        return f"LoRATeam({self.name!r}, agents={self.agents})"


def policy_options(args: Any) -> dict[str, Any]:
    """The :class:`CausalLMPolicy` sampling settings a trainer config carries (``max_new_tokens``,
    ``temperature``, ``top_p``, ``top_k``, ``generation_batch_size`` as ``max_batch_size``,
    ``sample_dtype``): for full-model agents and adapter agents alike."""
    return dict(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_batch_size=args.generation_batch_size,
        sample_dtype=getattr(args, "sample_dtype", None),
    )


def team_options(args: Any) -> dict[str, Any]:
    """The :meth:`LoRATeam.from_model` keywords a trainer config carries: the adapter shape
    (``lora_r``, ``lora_alpha``, ``lora_target_modules``), ``gradient_checkpointing`` and
    :func:`policy_options`."""
    return dict(
        r=args.lora_r,
        alpha=args.lora_alpha,
        target_modules=args.lora_target_modules,
        gradient_checkpointing=args.gradient_checkpointing,
        **policy_options(args),
    )


@contextmanager
def _quiet_peft() -> Iterator[None]:
    """Wrapping a model, peft reads transformers' deprecated ``is_gradient_checkpointing``; its
    FutureWarning says nothing about this library's use and is not shown."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*is_gradient_checkpointing.*deprecated", category=FutureWarning)
        yield


def _check_agents(agents: Sequence[str]) -> list[str]:
    names = [str(a) for a in agents]
    if not names or len(set(names)) != len(names):
        raise ValueError(f"agents must be distinct names, at least one; got {names}")
    if BASE_ROUTE in names:
        raise ValueError(f"{BASE_ROUTE!r} is reserved for the base model")
    return names


def _dtype(value: str | torch.dtype) -> torch.dtype:
    if isinstance(value, torch.dtype):
        return value
    resolved = getattr(torch, str(value), None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"dtype must be a torch dtype or its name (e.g. 'bfloat16'), got {value!r}")
    return resolved

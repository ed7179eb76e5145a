"""A language-model critic on a LoRA team's one frozen base: no copy of the base.

:class:`AdapterCritic` is a :class:`~llm_marl.policies.lm_critic.CausalLMCritic` (same readout
positions, same left padding, same value head) whose rows run through ONE adapter of a
:class:`~llm_marl.policies.LoRATeam`, routed by the team's runner. peft's "active adapter" (the
first agent's) plays no part, so every critic reads what its own route gives:

* shared (``use_separate_critic=False``): the agent's own adapter. ``parameters()`` is the head;
  the value loss's gradient reaches that agent's adapter (trained by the agent's optimizer) and
  no other agent's.
* separate (the default): a value adapter of its own, ``name``, added to the team's model with the
  agent's LoRA config and a copy of its current weights (:meth:`LoRATeam.add_adapter`).
  ``parameters()`` are that adapter's and the head's; no agent's adapter is touched.

Memory: the head (hidden × outputs floats), plus for a separate critic one adapter —
r × (in + out) floats per target layer, e.g. 0.46 M floats (1.8 MB) at r 8 on SmolLM2-135M's
q/v projections — and its AdamW moments. A plain separate critic costs a whole second model.
:meth:`owned_parameters` counts what a critic adds. Gradient checkpointing and chunked scoring
work as for the team's agents (the routing is captured per checkpointed forward).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch

from llm_marl.policies.lm_critic import HEAD_FILE, CausalLMCritic, actor_prompt_encoder
from llm_marl.policies.lm_runner import ModelRunner
from llm_marl.policies.lora_team import AdapterPolicy, LoRATeam, adapter_parameters, save_adapter

__all__ = ["AdapterCritic"]


class AdapterCritic(CausalLMCritic):
    """A critic reading a :class:`LoRATeam`'s base through the adapter ``adapter`` (module docstring).

    Args:
        team: the team whose base the critic reads.
        adapter: the adapter the rows run through: an agent's (``shared=True``) or the critic's
            own value adapter (``shared=False``; it must exist, see :meth:`for_agent`).
        shared: the adapter is an agent's and trains with that agent's optimizer.
        **kwargs: :class:`CausalLMCritic` settings (``num_outputs``, ``hidden_dim``, ``seed``, ...).
    """

    def __init__(self, team: LoRATeam, adapter: str, *, shared: bool, **kwargs: Any) -> None:
        if adapter not in team.model.peft_config:
            raise KeyError(f"no adapter {adapter!r} in the team (adapters: {sorted(team.model.peft_config)})")
        self.team = team
        self.adapter = adapter
        super().__init__(team.model, team.tokenizer, shared=shared, **kwargs)

    @classmethod
    def for_agent(
        cls,
        policy: AdapterPolicy,
        *,
        shared: bool,
        name: str | None = None,
        **kwargs: Any,
    ) -> "AdapterCritic":
        """The critic of ``policy``'s agent: its own adapter (``shared``), or a new value adapter
        ``name`` (default ``"<adapter>_critic"``) copied from it."""
        team = policy.team
        adapter = policy.adapter
        if not shared:
            adapter = name or f"{policy.adapter}_critic"
            if adapter in team.model.peft_config:
                raise ValueError(f"the team already has an adapter named {adapter!r} (the critic of an earlier trainer on "
                                 "this team?): pass that trainer's critics as critics=, or build the trainer on a new team")
            team.add_adapter(adapter, like=policy.adapter)
        kwargs.setdefault("max_batch_size", policy.max_batch_size)
        if kwargs.pop("actor_prompts", True):  # read an observation as the agent reads it (chat template included)
            kwargs.setdefault("encode_prompt", actor_prompt_encoder(policy))
        return cls(team, adapter, shared=shared, **kwargs)

    def _make_runner(self, model: Any) -> ModelRunner:
        return self.team.runner

    def _routes(self, rows: int) -> list[str]:
        return [self.adapter] * rows

    # ------------------------------------------------------------------ protocol

    def named_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        """The value adapter's weights (separate) and the head's; a shared critic: the head's."""
        if not self.shared:
            yield from adapter_parameters(self.team.model, self.adapter)
        for n, p in self.head.named_parameters():
            yield f"head.{n}", p

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return (p for _, p in self.named_parameters())

    def owned_parameters(self) -> int:
        """How many parameters this critic adds to the team (head, and a value adapter)."""
        return sum(p.numel() for p in self.parameters())

    # ------------------------------------------------------------------ state

    def to(self, device: str | torch.device) -> "AdapterCritic":
        """Critics of a team run where its base is; any other device is refused."""
        if torch.device(device) != self._model_device():
            raise ValueError(f"critic on adapter {self.adapter!r} reads the team's base on {self._model_device()}, not {device}")
        return self

    def train(self, mode: bool = True) -> "AdapterCritic":
        """The head's mode only: the team's model keeps the mode the team set (e.g. for gradient checkpointing)."""
        self.head.train(mode)
        return self

    def state_dict(self) -> dict[str, Any]:
        """The head's weights, and the value adapter's (a shared critic's adapter is the agent's)."""
        state: dict[str, Any] = {"head": self.head.state_dict()}
        if not self.shared:
            state["adapter"] = {n: p.detach().clone() for n, p in adapter_parameters(self.team.model, self.adapter)}
        return state

    def load_state_dict(self, state: Mapping[str, Any], strict: bool = True) -> None:
        self.head.load_state_dict(state["head"], strict=strict)
        if self.shared:
            return
        own = dict(adapter_parameters(self.team.model, self.adapter))
        saved = dict(state.get("adapter") or {})
        if strict and set(saved) != set(own):
            raise KeyError(f"value adapter {self.adapter!r}: missing {sorted(set(own) - set(saved))[:3]}, "
                           f"unexpected {sorted(set(saved) - set(own))[:3]}")
        with torch.no_grad():
            for key, value in saved.items():
                if key in own:
                    own[key].copy_(value)

    def save_pretrained(self, directory: str | os.PathLike[str]) -> Path:
        """The head as ``value_head.pt`` and, for a separate critic, its value adapter in peft's format."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        if not self.shared:
            save_adapter(self.team.model, self.adapter, path)
        torch.save({"state": self.head.state_dict(), "num_outputs": self.num_outputs, "hidden_dim": self.hidden_dim}, path / HEAD_FILE)
        return path

    def __repr__(self) -> str:
        kind = "agent adapter" if self.shared else "value adapter"
        return f"AdapterCritic({kind} {self.adapter!r} of {self.team.name!r}, {self.owned_parameters():,} parameters of its own)"

"""CoMLRL's ``comlrl.models.actor_critic``: a causal LM with a scalar value head.

llm_marl's own critics are :class:`~llm_marl.policies.CausalLMCritic` (docs/actor_critic.md);
these classes serve scripts that build CoMLRL's wrapper themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class ActorCriticOutput:
    """What :class:`CausalLMWithValueHead` returns."""

    logits: torch.Tensor
    values: torch.Tensor | None
    hidden_states: Any
    past_key_values: Any


class ValueHead(nn.Module):
    """hidden -> value: a linear layer, after a tanh projection to ``hidden_dim`` when given;
    weights drawn from N(0, 0.02), biases 0."""

    def __init__(self, input_dim: int, hidden_dim: int | None = None) -> None:
        super().__init__()
        self.pre_projection = nn.Sequential(nn.Linear(input_dim, hidden_dim), nn.Tanh()) if hidden_dim else None
        self.value_projection = nn.Linear(hidden_dim or input_dim, 1)
        for layer in self.modules():
            if isinstance(layer, nn.Linear):
                nn.init.normal_(layer.weight, mean=0.0, std=0.02)
                nn.init.zeros_(layer.bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.pre_projection is not None:
            hidden_states = self.pre_projection(hidden_states)
        return self.value_projection(hidden_states)


class CausalLMWithValueHead(nn.Module):
    """``base_model`` (its config has ``hidden_size`` or ``n_embd``) plus a :class:`ValueHead` on
    the final hidden states (one value per position); ``attach_value_head=False`` gives logits only."""

    def __init__(self, base_model: nn.Module, value_head_hidden_dim: int | None = None, attach_value_head: bool = True) -> None:
        super().__init__()
        self.model = base_model
        config = getattr(base_model, "config", None)
        hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None)
        if hidden is None:
            raise ValueError(f"{type(base_model).__name__}: its config has no hidden_size or n_embd")
        self.value_head = ValueHead(hidden, value_head_hidden_dim) if attach_value_head else None
        first = next(base_model.parameters(), None)
        if self.value_head is not None and first is not None:
            self.value_head.to(dtype=first.dtype)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                past_key_values: Any = None, use_cache: bool | None = None, output_values: bool = True, **kwargs: Any) -> ActorCriticOutput:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, past_key_values=past_key_values,
                         use_cache=use_cache, output_hidden_states=True, return_dict=True, **kwargs)
        if output_values and self.value_head is not None:
            last = out.hidden_states[-1]
            return ActorCriticOutput(out.logits, self.value_head(last).squeeze(-1), last, out.past_key_values)
        return ActorCriticOutput(out.logits, None, out.hidden_states, out.past_key_values)

    def generate(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The base model's ``generate``."""
        return self.model.generate(*args, **kwargs)


__all__ = ["ActorCriticOutput", "CausalLMWithValueHead", "ValueHead"]

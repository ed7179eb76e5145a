"""A language-model critic: a value head on a causal LM's last hidden state.

:class:`CausalLMCritic` runs a Hugging Face causal LM over the critic's input and applies a
:class:`ValueHead` to the final hidden state (the last entry of ``hidden_states``, after the
model's final layer norm) at ONE position, the readout position:

* V(h) — ``values(observations)``: the last token of the prompt (index P−1 of a prompt of P
  tokens);
* Q(h, a) — ``values(observations, completions)``: the last token of prompt ⊕ answer (index
  P+L−1 of an answer of L tokens, its end-of-sequence token included, so the value of "having
  stopped" is learned — docs/actor_critic.md §6 Q3);
* MAAC: the last token of the joint text (:func:`~llm_marl.policies.critic.joint_observation`).

Sequences are left-padded with ``position_ids = cumsum(attention_mask) − 1`` (as the policies
sample and score), so the readout is the last column and a padded row reads exactly what the same
sequence alone reads at that index (tested). Inputs longer than the model's context are cut from
the left (the end of a prompt, where the readout is, matters most).

Two placements:

* separate (``shared=False``): the critic owns its model (e.g. a copy of the actor's); its
  ``parameters()`` are the model's and the head's. Memory: a second copy of the weights, their
  gradients and AdamW's two moments — about 4× the model's size per critic.
* shared (``shared=True``): ``model`` is the actor's own model object; ``parameters()`` yields the
  head only (the backbone is trained by the actor's optimizer, which the learner gives the head
  too, and receives the value loss's gradient as well). Memory: the head alone (hidden × outputs
  weights, plus hidden × hidden_dim with a hidden layer), plus the activations of one extra
  forward pass.

The head runs in float32 whatever the backbone's dtype (§6 Q12): the hidden state is cast up.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
from torch import nn

from llm_marl.policies.base import Completion
from llm_marl.policies.lm_runner import ModelRunner

HEAD_FILE = "value_head.pt"


def hidden_size_of(model: Any) -> int:
    """The width of ``model``'s hidden states (``hidden_size``, or GPT-2's ``n_embd``)."""
    config = getattr(model, "config", None)
    for name in ("hidden_size", "n_embd", "d_model"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    raise ValueError(f"cannot find the hidden size of {type(model).__name__} (no hidden_size / n_embd in its config)")


def actor_prompt_encoder(policy: Any) -> Callable[[Any], list[int]] | None:
    """observation -> its prompt's token ids as ``policy`` reads them (``encode_prompts``), or
    None for a policy without it."""
    encode = getattr(policy, "encode_prompts", None)
    if not callable(encode):
        return None
    return lambda observation: encode([observation])[0]


class ValueHead(nn.Module):
    """An optional ``Linear(hidden, hidden_dim) + tanh``, then ``Linear(·, num_outputs)``; weights
    drawn from N(0, 0.02²), biases 0; float32. With ``seed`` the weights come from a generator of
    that seed (the global RNG is untouched): two heads of one seed are equal."""

    def __init__(self, hidden_size: int, num_outputs: int = 1, hidden_dim: int | None = None, seed: int | None = None):
        super().__init__()
        generator = torch.Generator().manual_seed(int(seed)) if seed is not None else None
        layers: list[nn.Module] = []
        width = hidden_size
        if hidden_dim:
            layers += [nn.Linear(hidden_size, hidden_dim), nn.Tanh()]
            width = hidden_dim
        layers.append(nn.Linear(width, num_outputs))
        self.net = nn.Sequential(*layers)
        for module in self.net:
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02, generator=generator)
                nn.init.zeros_(module.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.net(hidden.float())


class CausalLMCritic:
    """A :class:`~llm_marl.policies.critic.Critic` over a causal LM (see the module docstring).

    Args:
        model: any ``AutoModelForCausalLM``; with ``shared=True`` the actor's own model.
        tokenizer: its tokenizer (a missing pad token becomes the eos token).
        num_outputs: values per input (1; MAAC: one per agent).
        hidden_dim: width of the head's hidden layer; None: a single linear layer.
        shared: the backbone belongs to an actor (see the module docstring).
        use_token_ids: Q(h, a) reads an answer's generated token ids when the completion has them
            (the critic shares the actor's vocabulary); False: the answer's text is tokenized and
            an eos appended.
        max_batch_size: at most this many rows per forward pass; None: all at once.
        head: a ready :class:`ValueHead` (e.g. loaded); default: a fresh one.
        seed: the fresh head's initialisation seed (None: the global RNG).
        encode_prompt: observation -> the prompt's token ids (e.g. its actor's
            ``encode_prompts``: chat template and system prompt included, so critic and actor
            read the same ids); None: the tokenizer on ``str(observation)``.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        num_outputs: int = 1,
        hidden_dim: int | None = None,
        shared: bool = False,
        use_token_ids: bool = True,
        max_batch_size: int | None = None,
        head: ValueHead | None = None,
        device: str | torch.device | None = None,
        seed: int | None = None,
        encode_prompt: Callable[[Any], Sequence[int]] | None = None,
    ) -> None:
        self.model = model
        self.encode_prompt = encode_prompt
        self.tokenizer = tokenizer
        self.num_outputs = num_outputs
        self.hidden_dim = hidden_dim
        self.shared = shared
        self.use_token_ids = use_token_ids
        self.max_batch_size = max_batch_size
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.eos_token_id = int(tokenizer.eos_token_id)
        self.head = head if head is not None else ValueHead(hidden_size_of(model), num_outputs, hidden_dim, seed=seed)
        self.head.to(self._model_device())
        self.runner = self._make_runner(model)
        self.context_length: int | None = self.runner.context_length
        if device is not None:
            self.to(device)

    @classmethod
    def for_policy(
        cls,
        policy: Any,
        *,
        shared: bool,
        num_outputs: int = 1,
        hidden_dim: int | None = None,
        seed: int | None = None,
        actor_prompts: bool = True,
    ) -> "CausalLMCritic":
        """A critic for a :class:`~llm_marl.policies.CausalLMPolicy`: a head on its model
        (``shared``) or on a deep copy of it. ``seed`` initialises the head. ``actor_prompts``:
        an observation is read as the policy reads it (``policy.encode_prompts``: chat template
        and system prompt included); False (a central critic's joint text): raw text.

        An agent of a :class:`~llm_marl.policies.LoRATeam` is refused: its critic reads the
        team's one base through an adapter, :meth:`~llm_marl.policies.adapter_critic.AdapterCritic.for_agent`."""
        import copy

        if hasattr(policy, "team") and hasattr(policy, "adapter"):
            raise TypeError(f"{policy!r} is an agent of a LoRA team: build its critic with AdapterCritic.for_agent "
                            "(llm_marl.policies.adapter_critic), which reads the team's base instead of copying it")
        model = policy.model if shared else copy.deepcopy(policy.model)
        return cls(model, policy.tokenizer, num_outputs=num_outputs, hidden_dim=hidden_dim, shared=shared,
                   max_batch_size=getattr(policy, "max_batch_size", None), seed=seed, encode_prompt=actor_prompt_encoder(policy) if actor_prompts else None)

    # ------------------------------------------------------------------ protocol

    def parameters(self) -> Iterator[nn.Parameter]:
        if not self.shared:
            yield from self.model.parameters()
        yield from self.head.parameters()

    def values(self, observations: Sequence[Any], completions: Sequence[Completion] | None = None) -> torch.Tensor:
        """``[batch, num_outputs]`` values read at the readout position (module docstring)."""
        observations = list(observations)
        if completions is not None and len(completions) != len(observations):
            raise ValueError(f"{len(observations)} observations but {len(completions)} completions")
        rows = [self.input_ids(o, None if completions is None else completions[i]) for i, o in enumerate(observations)]
        if not rows:
            return torch.zeros((0, self.num_outputs), device=self._model_device())
        size = self.max_batch_size or len(rows)
        return torch.cat([self._forward(rows[start : start + size]) for start in range(0, len(rows), size)])

    def input_ids(self, observation: Any, completion: Completion | None = None) -> list[int]:
        """The tokens the critic reads; the value is read at the last of them."""
        if self.encode_prompt is not None:
            ids = [int(t) for t in self.encode_prompt(observation)] or [self.eos_token_id]
        else:
            ids = list(self.tokenizer(str(observation), verbose=False)["input_ids"]) or [self.eos_token_id]
        if completion is not None:
            if self.use_token_ids and completion.token_ids is not None:
                ids += [int(t) for t in completion.token_ids]
            else:
                ids += list(self.tokenizer(completion.text, add_special_tokens=False, verbose=False)["input_ids"])
                ids.append(self.eos_token_id)
        if self.context_length and len(ids) > self.context_length:
            ids = ids[-self.context_length :]
        return ids

    def _forward(self, rows: list[list[int]]) -> torch.Tensor:
        device = self._model_device()
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), int(self.tokenizer.pad_token_id), dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, ids in enumerate(rows):
            input_ids[i, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[i, width - len(ids) :] = 1
        inputs: dict[str, Any] = {
            "input_ids": input_ids.to(device),
            "attention_mask": attention_mask.to(device),
            "output_hidden_states": True,
            "use_cache": False,
        }
        if self.runner.takes_position_ids:
            inputs["position_ids"] = (inputs["attention_mask"].cumsum(-1) - 1).clamp(min=0)
        if self.runner.takes_logits_to_keep:
            inputs["logits_to_keep"] = 1
        hidden = self.runner.forward(inputs, self._routes(len(rows))).hidden_states[-1][:, -1]
        return self.head(hidden)

    def _make_runner(self, model: Any) -> ModelRunner:
        return ModelRunner(model)

    def _routes(self, rows: int) -> list[str] | None:
        """What each row runs through (a plain model: one route, None)."""
        return None

    # ------------------------------------------------------------------ state

    def _model_device(self) -> torch.device:
        try:
            return next(self.model.parameters()).device
        except StopIteration:  # pragma: no cover
            return torch.device("cpu")

    def to(self, device: str | torch.device) -> "CausalLMCritic":
        if not self.shared:
            self.model.to(device)
        self.head.to(device)
        return self

    def train(self, mode: bool = True) -> "CausalLMCritic":
        if not self.shared:
            self.model.train(mode)
        self.head.train(mode)
        return self

    def state_dict(self) -> dict[str, Any]:
        """The head's weights, and the model's unless it is shared (then it is the actor's)."""
        state = {"head": self.head.state_dict()}
        if not self.shared:
            state["model"] = self.model.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any], strict: bool = True) -> None:
        self.head.load_state_dict(state["head"], strict=strict)
        if not self.shared and "model" in state:
            self.model.load_state_dict(state["model"], strict=strict)

    def save_pretrained(self, directory: str | os.PathLike[str], state_dict: Mapping[str, torch.Tensor] | None = None) -> Path:
        """Model and tokenizer (unless shared) with ``save_pretrained``, the head as ``value_head.pt``.
        ``state_dict``: the model's weights to write instead of its own (e.g. gathered from FSDP shards)."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        if not self.shared:
            self.model.save_pretrained(path, state_dict=state_dict)
            self.tokenizer.save_pretrained(path)
        torch.save({"state": self.head.state_dict(), "num_outputs": self.num_outputs, "hidden_dim": self.hidden_dim}, path / HEAD_FILE)
        return path

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str], **kwargs: Any) -> "CausalLMCritic":
        """Load a critic written by :meth:`save_pretrained` (separate placement); a named model
        (``"smollm2-135m"``, :mod:`llm_marl.policies.models`) gives a new value head on that base."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from llm_marl.policies.models import is_model_name, resolve_model

        named = is_model_name(path)
        path = resolve_model(path)
        model = AutoModelForCausalLM.from_pretrained(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
        if named:
            return cls(model, tokenizer, **kwargs)
        saved = torch.load(Path(path) / HEAD_FILE, weights_only=False)
        head = ValueHead(hidden_size_of(model), saved["num_outputs"], saved["hidden_dim"])
        head.load_state_dict(saved["state"])
        return cls(model, tokenizer, num_outputs=saved["num_outputs"], hidden_dim=saved["hidden_dim"], head=head, **kwargs)

"""CoMLRL's ``comlrl.utils.reference_kl``: the reference-KL settings, frozen reference models, and
the sampled KL of a response against its reference.

llm_marl's trainers do this themselves when ``reference_kl_enabled`` is set (the per-answer k3
estimate :func:`llm_marl.advantages.k3_kl`, reference copies from
:func:`llm_marl.policies.reference.frozen_references`); these are CoMLRL's functions for scripts
that call them directly, computed with the same estimator.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from llm_marl.advantages import k3_kl
from llm_marl.comlrl.schedulers.device_scheduler import DeviceScheduler
from llm_marl.comlrl.utils.distributed import unwrap_model
from llm_marl.comlrl.utils.model_loading import freeze_model


def reference_kl_enabled(args: Any) -> bool:
    """``args.reference_kl_enabled`` (False when absent)."""
    return bool(getattr(args, "reference_kl_enabled", False))


def reference_kl_coef(args: Any) -> float:
    """``args.reference_kl_coef`` (0.1 when absent)."""
    return float(getattr(args, "reference_kl_coef", 0.1))


def validate_reference_kl_config(args: Any, expected_count: int) -> None:
    """``ValueError`` for a negative coefficient, or (when enabled) ``reference_devices`` that do not fit ``expected_count`` models."""
    if reference_kl_coef(args) < 0:
        raise ValueError("reference_kl_coef must be >= 0.")
    devices = getattr(args, "reference_devices", None)
    if reference_kl_enabled(args) and devices is not None:
        DeviceScheduler.resolve_devices(devices, expected_count, kind="reference_devices")


def resolve_reference_devices(args: Any, fallback_devices: Sequence[torch.device], expected_count: int) -> list[torch.device]:
    """The reference models' devices: ``args.reference_devices``, else ``fallback_devices``."""
    devices = getattr(args, "reference_devices", None)
    if devices is None:
        return list(fallback_devices)
    return DeviceScheduler.resolve_devices(devices, expected_count, kind="reference_devices")


def clone_reference_models(policy_models: Sequence[Any], *, devices: Sequence[torch.device]) -> list[Any]:
    """A frozen deep copy of each policy model, on its device."""
    return [freeze_model(copy.deepcopy(model).to(devices[i])) for i, model in enumerate(policy_models)]


def load_reference_models_from_sources(model_sources: Sequence[str], *, devices: Sequence[torch.device],
                                       model_kwargs: Mapping[str, Any] | None = None) -> list[Any]:
    """A frozen model loaded from each source (``from_pretrained(source, **model_kwargs)``), on its device."""
    from transformers import AutoModelForCausalLM

    kwargs = dict(model_kwargs or {})
    return [freeze_model(AutoModelForCausalLM.from_pretrained(src, **kwargs).to(devices[i])) for i, src in enumerate(model_sources)]


def response_token_logprobs(model: Any, sequences: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int, response_len: int) -> torch.Tensor:
    """Log-probabilities of the ``response_len`` tokens after the first ``prompt_len``: shape (batch, response_len)."""
    module = unwrap_model(model)
    try:  # a value-head model takes output_values
        logits = module(input_ids=sequences, attention_mask=attention_mask, output_values=False).logits
    except TypeError:
        logits = module(input_ids=sequences, attention_mask=attention_mask, return_dict=True).logits
    logps = F.log_softmax(logits[:, :-1, :], dim=-1).gather(-1, sequences[:, 1:].unsqueeze(-1)).squeeze(-1)
    start = max(int(prompt_len) - 1, 0)
    return logps[:, start:start + int(response_len)]


def reference_kl_for_sequence(policy_model: Any, reference_model: Any, sequences: torch.Tensor, attention_mask: torch.Tensor,
                              prompt_len: int, response_len: int) -> torch.Tensor:
    """The k3 KL estimate (sum over response tokens of exp(r - p) - (r - p) - 1) per sequence, on CPU, without gradients.

    Both models are evaluated in eval mode on their own devices; their train/eval modes are restored.
    """
    policy, reference = unwrap_model(policy_model), unwrap_model(reference_model)
    ref_device = next(reference.parameters()).device
    modes = (policy.training, reference.training)
    policy.eval()
    reference.eval()
    try:
        with torch.no_grad():
            pol_device = next(policy.parameters()).device
            p = response_token_logprobs(policy_model, sequences.to(pol_device), attention_mask.to(pol_device), prompt_len, response_len)
            r = response_token_logprobs(reference_model, sequences.to(ref_device), attention_mask.to(ref_device), prompt_len, response_len)
            kl = k3_kl(p.to(ref_device), r, torch.ones_like(r, dtype=torch.bool))
    finally:
        policy.train(modes[0])
        reference.train(modes[1])
    return kl.detach().cpu()


__all__ = [
    "clone_reference_models",
    "load_reference_models_from_sources",
    "reference_kl_coef",
    "reference_kl_enabled",
    "reference_kl_for_sequence",
    "resolve_reference_devices",
    "response_token_logprobs",
    "validate_reference_kl_config",
]

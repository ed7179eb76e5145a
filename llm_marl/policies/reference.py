"""The frozen reference of each policy, for the reference-KL penalty.

:func:`frozen_references` gives each agent the policy its KL is measured against: the policy's
own ``reference_policy()`` where it has one (a LoRA agent: the team's base with adapters
disabled, no copy), else a deep copy of the policy whose parameters never require gradients,
placed on ``reference_devices[i]`` when given.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping, Sequence

import torch

from llm_marl.advantages import k3_kl
from llm_marl.policies.base import Completion, Policy, token_log_probs_of

__all__ = ["frozen_references"]


def frozen_references(policies: Mapping[str, Policy], agents: Sequence[str], devices: Sequence[str] | None = None) -> dict[str, Policy]:
    """agent -> its frozen reference policy (module docstring)."""
    references = {}
    for i, agent in enumerate(agents):
        policy = policies[agent]
        own = getattr(policy, "reference_policy", None)
        if own is not None:
            references[agent] = own()
            continue
        reference = copy.deepcopy(policy)
        if devices is not None and hasattr(reference, "to"):
            reference = reference.to(devices[i]) or reference
        for p in reference.parameters():
            p.requires_grad_(False)
        references[agent] = reference
    return references


def kl_to_reference(policy: Policy, reference: Policy, observations: Sequence[Any], completions: Sequence[Completion]) -> list[float]:
    """The k3 estimate of KL(policy || reference) of each completion (no gradient; :func:`llm_marl.advantages.k3_kl`)."""
    with torch.no_grad():
        policy_values, mask = token_log_probs_of(policy, observations, completions)
        reference_values, _ = token_log_probs_of(reference, observations, completions)
        kl = k3_kl(policy_values, reference_values.to(policy_values.device), mask)
    return kl.tolist()

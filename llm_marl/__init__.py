"""llm_marl: train teams of language models to cooperate with reinforcement learning.

The names below are imported on first use (PEP 562), so that ``import llm_marl.cli`` — the
``llm-marl`` command — starts without loading torch and transformers, and a Ctrl-C while they
load is the command's own clean exit (130), not a traceback.

The package sets no OpenMP wait policy: torch's threads spin while they wait (OpenMP's default,
the fastest on a quiet machine), and a trainer keeps their count equal to the CPUs that other
work leaves free, so that a run does not slow down many times over beside other busy processes
(:mod:`llm_marl.cpu`, :mod:`llm_marl.threads`). ``OMP_WAIT_POLICY=PASSIVE``, set before torch
loads, makes waiting threads sleep instead.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any

_HOMES = {
    "llm_marl.envs": ("DialogueEnv", "make", "register"),
    "llm_marl.learners": (
        "CentralizedMAGRPOConfig",
        "CentralizedMAGRPOTrainer",
        "IACConfig",
        "IACTrainer",
        "JointRewardModel",
        "MAACConfig",
        "MAACTrainer",
        "MADPOConfig",
        "MADPOIterConfig",
        "MADPOIterTrainer",
        "MADPOTrainer",
        "MAGRPOConfig",
        "MAGRPOTrainer",
        "MAREINFORCEConfig",
        "MAREINFORCETrainer",
        "MARLOOConfig",
        "MARLOOTrainer",
        "MAReMaxConfig",
        "MAReMaxTrainer",
        "MARLHFConfig",
        "MARLHFIterConfig",
        "MARLHFIterTrainer",
        "MARLHFTrainer",
    ),
    "llm_marl.policies": (
        "CausalLMCritic",
        "CausalLMPolicy",
        "ChoicePolicy",
        "Completion",
        "Critic",
        "LoRATeam",
        "Policy",
        "ScriptedPolicy",
        "TabularCritic",
        "TabularPolicy",
    ),
    "llm_marl.tasks": ("CooperativeTask", "FunctionTask", "Turn"),
}


def _lazy_exports(package: str, homes: dict[str, tuple[str, ...]]) -> tuple[list[str], Any, Any]:
    """``(__all__, __getattr__, __dir__)`` for ``package``: each name of ``homes`` (module ->
    names) is imported from its module on first access, then kept in the package; any other name
    that is a submodule is imported (``llm_marl.envs.dialogue`` after ``import llm_marl.envs``)."""
    home_of = {name: module for module, names in homes.items() for name in names}

    def getattr_(name: str) -> Any:
        if name not in home_of:
            if not name.startswith("__") and importlib.util.find_spec(f"{package}.{name}") is not None:
                return importlib.import_module(f"{package}.{name}")  # a submodule, as an eager package had it
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home_of[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    def dir_() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(home_of))

    return sorted(home_of), getattr_, dir_


__all__, __getattr__, __dir__ = _lazy_exports(__name__, _HOMES)

"""The REINFORCE variants' configs: :class:`~llm_marl.learners.config.MAGRPOConfig` (the
shared base, re-exported here) with another default ``advantage_mode`` (docs/algorithms.md §6)."""

from __future__ import annotations

from dataclasses import dataclass

from llm_marl.learners.config import MAGRPOConfig

__all__ = ["MAGRPOConfig", "MAREINFORCEConfig", "MARLOOConfig", "MAReMaxConfig"]


@dataclass
class MAREINFORCEConfig(MAGRPOConfig):
    """MAREINFORCE: no baseline (advantage_mode="raw")."""

    advantage_mode: str = "raw"


@dataclass
class MARLOOConfig(MAGRPOConfig):
    """MARLOO: leave-one-out baseline (advantage_mode="rloo")."""

    advantage_mode: str = "rloo"


@dataclass
class MAReMaxConfig(MAGRPOConfig):
    """MAReMax: max baseline (advantage_mode="max")."""

    advantage_mode: str = "max"

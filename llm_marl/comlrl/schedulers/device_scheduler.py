"""CoMLRL's ``comlrl.schedulers.device_scheduler``: turn a device spec into one torch device per model.

A spec is ``None`` or ``"auto"`` (one CUDA device per model while there are enough, all on
``cuda:0`` when there are fewer, CPU without CUDA), one device string for every model, or a
list with one entry (for every model) or one entry per model. llm_marl's trainers read the same
specs from ``agent_devices`` / ``critic_devices`` / ``reference_devices`` themselves; this class
is for scripts that call CoMLRL's scheduler directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional, Union

import torch

DeviceSpec = Union[str, Sequence[str]]


def _auto(count: int) -> list[torch.device]:
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < 1:
        return [torch.device("cpu")] * count
    if gpus < count:
        return [torch.device("cuda:0")] * count
    return [torch.device(f"cuda:{i}") for i in range(count)]


class DeviceScheduler:
    """CoMLRL's static device helpers (no state)."""

    @staticmethod
    def resolve_devices(spec: Optional[DeviceSpec], num_devices: int, *, kind: str = "devices") -> list[torch.device]:
        """``num_devices`` devices from ``spec``; ``kind`` names the setting in errors."""
        if num_devices < 1:
            raise ValueError(f"{kind} count must be >= 1.")
        if spec is None or (isinstance(spec, str) and spec.lower() == "auto"):
            return _auto(num_devices)
        if isinstance(spec, str):
            return [torch.device(spec)] * num_devices
        if not isinstance(spec, Sequence):
            raise ValueError(f"Unsupported {kind} spec: {spec!r}.")
        if not spec:
            raise ValueError(f"{kind} must be a non-empty list or 'auto'.")
        if len(spec) == 1:
            return [torch.device(spec[0])] * num_devices
        if len(spec) != num_devices:
            raise ValueError(f"{kind} length ({len(spec)}) must be 1 or {num_devices}.")
        return [torch.device(entry) for entry in spec]

    @staticmethod
    def assign_devices(num_agents: int, agent_devices: Optional[DeviceSpec], critic_devices: Optional[DeviceSpec], *,
                       use_separate_critic: bool) -> tuple[list[torch.device], list[torch.device]]:
        """The agents' devices, and the critics' (``critic_devices``, else the agents' spec; the agents' own without separate critics)."""
        agents = DeviceScheduler.resolve_devices(agent_devices, num_agents, kind="agent_devices")
        if not use_separate_critic:
            return agents, list(agents)
        spec = agent_devices if critic_devices is None else critic_devices
        return agents, DeviceScheduler.resolve_devices(spec, num_agents, kind="critic_devices")

    @staticmethod
    def assign_shared_critic_device(agent_devices: Sequence[torch.device], critic_devices: Optional[DeviceSpec]) -> torch.device:
        """A shared critic's device: the first of ``critic_devices``, else the first agent's."""
        if critic_devices is None:
            return agent_devices[0]
        return DeviceScheduler.resolve_devices(critic_devices, 1, kind="critic_devices")[0]

    @staticmethod
    def resolve_single_device(*specs: Optional[DeviceSpec]) -> torch.device:
        """The device of the first spec given (a list's first entry), ``"auto"`` resolved; auto when none is."""
        for spec in specs:
            if spec is None:
                continue
            if isinstance(spec, Sequence) and not isinstance(spec, str):
                if not spec:
                    raise ValueError("Device spec list must be non-empty.")
                spec = spec[0]
            if not isinstance(spec, str):
                raise ValueError(f"Unsupported device spec: {spec!r}.")
            return _auto(1)[0] if spec.lower() == "auto" else torch.device(spec)
        return _auto(1)[0]


__all__ = ["DeviceScheduler"]

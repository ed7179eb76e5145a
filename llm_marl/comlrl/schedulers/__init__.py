"""CoMLRL's ``comlrl.schedulers``: :class:`DeviceScheduler` (see :mod:`llm_marl.comlrl.schedulers.device_scheduler`)."""

from llm_marl.comlrl.schedulers.device_scheduler import DeviceScheduler

__all__ = ["DeviceScheduler"]

"""The settings of ``llm-marl serve`` (each is a flag of the command)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

__all__ = ["ServeConfig", "is_loopback"]


@dataclass
class ServeConfig:
    """How the endpoint listens and what it accepts."""

    host: str = "127.0.0.1"
    """Address to listen on; anything but a loopback address needs ``api_key``."""
    port: int = 8000
    """Port to listen on (0: any free port)."""
    api_key: str | None = None
    """When set, every request must send ``Authorization: Bearer <api_key>`` (else 401)."""
    max_queue: int = 256
    """Requests waiting or decoding at most; more get a 429."""
    max_batch_rows: int = 64
    """Answers decoded together at most (one decode step serves them all)."""
    max_body_bytes: int = 1_048_576
    """Largest request body accepted, in bytes; a larger one gets a 413."""
    request_timeout: float = 300.0
    """Seconds a request may wait and decode; past it, it ends with a 504."""

    def __post_init__(self) -> None:
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"port must be an int in [0, 65535], got {self.port!r}")
        for name in ("max_queue", "max_batch_rows", "max_body_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not isinstance(self.request_timeout, (int, float)) or not self.request_timeout > 0:
            raise ValueError(f"request_timeout must be a number of seconds > 0, got {self.request_timeout!r}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key must not be empty")
        if not is_loopback(self.host) and not self.api_key:
            raise ValueError(
                f"host {self.host}: serving beyond this machine needs --api-key (or LLM_MARL_API_KEY); "
                "without one, listen on 127.0.0.1"
            )


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

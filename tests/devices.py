"""The device tests run on: ``LLM_MARL_TEST_DEVICE`` (default ``cpu``).

Tests marked ``@pytest.mark.device`` take the ``device`` fixture (tests/conftest.py) and put their
models there; every other test runs on the CPU whatever the variable says. So the same files prove
the CUDA paths on a GPU machine::

    LLM_MARL_TEST_DEVICE=cuda python -m pytest -m device tests/test_devices.py tests/test_option_matrix.py

(``benchmarks/gpu_check.py`` runs exactly that, with the other GPU checks). Without the variable
the marked tests run on the CPU as before.
"""

from __future__ import annotations

import os
import re
from typing import Callable, Mapping

VARIABLE = "LLM_MARL_TEST_DEVICE"
"""The environment variable that names the device of the tests marked ``device``."""

DEVICE_FILES = ("tests/test_devices.py", "tests/test_option_matrix.py")
"""The test files whose ``device``-marked tests take the device (what ``benchmarks/gpu_check.py`` runs)."""

_SPELLING = re.compile(r"^(cpu|cuda(:\d+)?)$")


def test_device(environ: Mapping[str, str] | None = None, cuda_available: Callable[[], bool] | None = None) -> str:
    """The device named by :data:`VARIABLE` in ``environ`` (default ``os.environ``): ``cpu`` when
    unset; ``cuda`` or ``cuda:N`` only where CUDA is available (``cuda_available``, default
    ``torch.cuda.is_available``). Anything else raises ValueError naming the variable."""
    environ = os.environ if environ is None else environ
    value = (environ.get(VARIABLE) or "cpu").strip().lower()
    if not _SPELLING.match(value):
        raise ValueError(f"{VARIABLE}={value!r}: expected cpu, cuda or cuda:N")
    if value.startswith("cuda"):
        if cuda_available is None:
            import torch

            cuda_available = torch.cuda.is_available
        if not cuda_available():
            raise ValueError(f"{VARIABLE}={value}: this torch sees no CUDA device (torch.cuda.is_available() is False)")
    return value


test_device.__test__ = False  # a helper, not a test (its name starts with "test")

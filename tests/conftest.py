"""Test-wide settings: one torch thread, so runs are steady on a shared 2-core machine (CI runs
one pytest process; torch's default of one thread per core slows everything down as soon as
another process holds a core).

The ``device`` fixture: the device of the tests marked ``@pytest.mark.device`` (their models go
there), ``cpu`` unless ``LLM_MARL_TEST_DEVICE`` names another (tests/devices.py)."""

import pytest
import torch

from devices import test_device

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def device() -> str:
    """The device named by ``LLM_MARL_TEST_DEVICE`` (default ``cpu``); a bad value fails the test
    that asks, in one line."""
    try:
        return test_device()
    except ValueError as exc:
        pytest.fail(str(exc), pytrace=False)

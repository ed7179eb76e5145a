"""Test-wide settings: one torch thread, so runs are steady on a shared 2-core machine (CI runs
one pytest process; torch's default of one thread per core slows everything down as soon as
another process holds a core).

The ``device`` fixture: the device of the tests marked ``@pytest.mark.device`` (their models go
there), ``cpu`` unless ``LLM_MARL_TEST_DEVICE`` names another (tests/devices.py).

The ``tiny_model_dir`` fixture: the tiny GPT-2 most language-model test modules use
(``build_tiny_model(..., pretrain_steps=20, batch_size=8)``), built once a session instead of once
a module. Its build leaves the global RNG untouched, and no test writes into its folder."""

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


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The tiny GPT-2 pretrained for 20 steps of 8 passages (seed 0), shared by the test modules
    whose ``model_dir`` it is; a test never writes into it (it saves elsewhere)."""
    from llm_marl.policies.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", pretrain_steps=20, batch_size=8)

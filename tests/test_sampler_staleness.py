"""Staleness measured exactly (issue 43.3): every answer carries the version of the weights that
drew it, and the trainer logs ``train/<agent>/sampler_staleness``, the optimizer steps between
those weights and the ones the update started from. An on-policy learner stops at anything but 0.
A sampler one step behind (planted here: the bf16 copy always holds the weights from before the
latest change) is caught by the staleness and, with that check off, warned about by the gap,
whose threshold follows the run's own healthy gap."""

from __future__ import annotations

import warnings

import pytest
import torch

from llm_marl.learners import MAGRPOTrainer
from llm_marl.learners.staleness import SamplerStalenessError
from llm_marl.policies import CausalLMPolicy
from llm_marl.policies.lm_runner import LowPrecisionShadow
from test_sampler_gap import SETTINGS, gaps, lm_config, lm_env

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir  # tests/conftest.py: built once a session


def one_step_behind(monkeypatch):
    """An off-by-one refresh: each time the copy is asked for, it holds the weights (and reports
    their version) of the previous request, and keeps the current ones for the next."""
    current = LowPrecisionShadow.current

    def lagging(self):
        runner = current(self)
        now = ([weight.detach().to(twin.dtype).clone() for weight, twin in self._pairs], self.weights)
        held, self._held = getattr(self, "_held", None), now
        if held is not None:
            with torch.no_grad():
                for (_, twin), old in zip(self._pairs, held[0]):
                    twin.copy_(old)
            self.weights = held[1]
        return runner

    monkeypatch.setattr(LowPrecisionShadow, "current", lagging)


def logged(trainer, name):
    trainer._flush_metrics(force=True)
    return [m[name] for _, m in trainer.logger.history if name in m]


def trainer_of(model_dir, lr=0.05):
    policies = [CausalLMPolicy.from_pretrained(model_dir, sample_dtype="bfloat16", packed_weights=False, **SETTINGS) for _ in range(2)]
    return MAGRPOTrainer(env=lm_env(), policies=policies, args=lm_config(agent_learning_rate=lr, num_train_epochs=2))


def test_a_healthy_bf16_run_logs_zero_staleness_and_no_warning(model_dir):
    trainer = trainer_of(model_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        trainer.train()
    for agent in trainer.agents:
        found = logged(trainer, f"train/{agent}/sampler_staleness")
        assert len(found) == trainer.state.global_step >= 4 and set(found) == {0.0}, (agent, found)


def test_a_sampler_one_step_behind_stops_an_on_policy_run(model_dir, monkeypatch):
    one_step_behind(monkeypatch)
    trainer = trainer_of(model_dir)
    with pytest.raises(SamplerStalenessError, match=r"agent 'agent_0', optimizer step 2: answers drawn with weights 1 optimizer step\(s\) older"):
        trainer.train()
    assert trainer.state.global_step == 1  # stopped before the step: nothing trained on the stale answers
    assert logged(trainer, "train/agent_0/sampler_staleness") == [0.0]  # step 1's answers: drawn before any change


def test_a_sampler_one_step_behind_is_warned_about_by_the_gap(model_dir, monkeypatch):
    one_step_behind(monkeypatch)
    trainer = trainer_of(model_dir, lr=1e-4)  # a small step: the lagged gap stays under the fixed default
    trainer.on_policy = False  # logged, not refused: the gap is the check left
    with pytest.warns(UserWarning, match=r"differ from the scorer's by .* past the threshold .* x this run's running gap") as caught:
        trainer.train()
    assert any("sampler" in str(w.message) for w in caught)
    staleness = logged(trainer, "train/agent_0/sampler_staleness")
    assert staleness[0] == 0.0 and set(staleness[1:]) == {1.0}
    found = gaps(trainer, "agent_0")
    assert max(found) < 0.15  # under the fixed bf16 default: only the calibrated threshold sees it

"""The writing task's default run, trained once per test session for the tests that measure it.

``llm_marl.cli.DEFAULT_RUN`` on 48 train items (6 batches of 8, 6 optimizer steps per agent) with
the default full tiny models is what tests/test_lm_training.py asserts learns (seed 0) and what
tests/test_lora_learning.py measures an adapter team against (seeds 0-2): the same options, so the
same numbers. :func:`default_run` trains each seed once per pytest session and keeps its result.

The reward before training is one number for every seed: the models load the same weights
whatever the seed (it draws the samples), and evaluation draws from generators seeded by the eval
seed and set aside, leaving what training draws unchanged (``llm_marl.learners.evaluation``).
So it is measured once, on the first run, and leaving it out of the other runs changes none of
their numbers.
"""

from __future__ import annotations

import functools
import time

EVAL_SEEDS = (5000, 5001, 5002, 5003)
TRAIN_ITEMS = 48
_UNTRAINED: list[float] = []


def mean_eval_reward(trainer) -> float:
    """Mean eval reward over EVAL_SEEDS (each: one batched rollout of the 32 eval items)."""
    values = []
    for seed in EVAL_SEEDS:
        values.append(trainer.evaluate(seed=seed)["eval/turn_1/reward_mean"])
    return sum(values) / len(values)


def default_run_options(seed: int) -> dict:
    """The default run's options on TRAIN_ITEMS items, quiet, with ``seed``."""
    from llm_marl.cli import DEFAULT_RUN

    return {**DEFAULT_RUN, "train_items": TRAIN_ITEMS, "progress_bar": False, "seed": seed}


@functools.lru_cache(maxsize=None)
def default_run(seed: int) -> tuple[float, float, float]:
    """``(before, after, seconds)``: the mean eval reward of the default run with ``seed`` before
    and after training, and its seconds of training. Trained once per session and seed."""
    from llm_marl.cli import build_trainer

    trainer = build_trainer(default_run_options(seed))
    # the settings the tests' margins were measured with: a change of DEFAULT_RUN needs new measurements
    assert trainer.args.reference_kl_enabled and trainer.args.num_generations == 4
    assert trainer.args.agent_learning_rate == 3e-4 and trainer.args.eval_num_samples == 32
    if not _UNTRAINED:
        _UNTRAINED.append(mean_eval_reward(trainer))
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    assert trainer.state.global_step == 6
    return _UNTRAINED[0], mean_eval_reward(trainer), seconds

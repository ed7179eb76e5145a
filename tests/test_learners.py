"""The trainers' contract (docs/algorithms.md §2, §4, §5, §6): buffers and optimizer steps, optimizers,
fixed partners, config validation, evaluation and its schedule, eval hooks, error reporting,
run logs, and training on a plain PettingZoo env that knows nothing of llm_marl."""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import re

import datasets
import numpy as np
import pytest
import torch

torch.set_num_threads(1)

from gymnasium.spaces import Box, Discrete  # noqa: E402
from pettingzoo import ParallelEnv  # noqa: E402

from llm_marl.envs import DialogueEnv, make  # noqa: E402
from llm_marl.runs import logging as run_logging  # noqa: E402
from llm_marl.learners.reinforce.config import (  # noqa: E402
    MAGRPOConfig,
    MAREINFORCEConfig,
    MARLOOConfig,
    MAReMaxConfig,
)
from llm_marl.learners.reinforce.trainer import (  # noqa: E402
    MAGRPOTrainer,
    MAREINFORCETrainer,
    MARLOOTrainer,
    MAReMaxTrainer,
)
from llm_marl.policies.scripted import ScriptedPolicy  # noqa: E402
from llm_marl.policies.tabular import TabularPolicy  # noqa: E402
from llm_marl.tasks import CooperativeTask  # noqa: E402
from controls import reward_blind  # noqa: E402

FAST = dict(eval_interval=0, progress_bar=False, early_termination_threshold=None)


class Ledger(CooperativeTask):
    """Agents a, b answer "x" or "y". Train items n = 0..items-1, eval items n = 100..104.
    Reward at turn t: n + 10 t + (1 if a and b agree). Prompts record item, turn and last answers."""

    agents = ("a", "b")

    def __init__(self, items: int = 2, num_turns: int = 2):
        self.items = items
        self.num_turns = num_turns

    def dataset(self, split):
        rows = range(self.items) if split == "train" else range(100, 105)
        return datasets.Dataset.from_list([{"n": n} for n in rows])

    def initial_observations(self, item):
        return {agent: f"{agent} n={item['n']} t=0" for agent in self.agents}

    def reward(self, item, actions, history):
        return float(item["n"] + 10 * len(history) + (actions["a"] == actions["b"]))

    def transition(self, item, actions, history):
        t = len(history)
        return {agent: f"{agent} n={item['n']} t={t} prev={actions['a']},{actions['b']}" for agent in self.agents}


class RecordingTabular(TabularPolicy):
    """A TabularPolicy that records the observations of every log_probs call (= optimizer step)."""

    def __init__(self, actions):
        super().__init__(actions)
        self.scored: list[list[str]] = []

    def log_probs(self, observations, completions, reduction="sum"):
        self.scored.append(list(observations))
        return super().log_probs(observations, completions, reduction)


class CountingScripted(ScriptedPolicy):
    def __init__(self, fn):
        super().__init__(fn)
        self.scored = 0

    def log_probs(self, observations, completions, reduction="sum"):
        self.scored += 1
        return super().log_probs(observations, completions, reduction)


def always(word):
    return lambda observation, n: [word] * n


def count_steps(trainer):
    counts = {a: 0 for a in trainer.optimizers}

    def hook_for(agent):
        def hook(optimizer, args, kwargs):
            counts[agent] += 1

        return hook

    for agent, optimizer in trainer.optimizers.items():
        optimizer.register_step_post_hook(hook_for(agent))
    return counts


# --- buffers and optimizer steps (docs/algorithms.md §4) -----------------------------------------------------


def expected_steps_per_epoch(samples, buffer_size, batch_size):
    full, rest = divmod(samples, buffer_size)
    return full * math.ceil(buffer_size / batch_size) + math.ceil(rest / batch_size)


@pytest.mark.parametrize(
    "items, buffer_size, batch_size",
    [(2, 4, 3), (2, 2, None), (2, 6, 2), (2, 5, 5), (2, 1, 1), (3, 4, 4), (3, 4, 1), (1, 8, None)],
)
def test_optimizer_steps_per_epoch(items, buffer_size, batch_size):
    # aligned, K=2, 2 turns, no early termination: 3 nodes per item -> 3 samples per agent per item
    epochs = 2
    args = MAGRPOConfig(
        num_turns=2,
        num_generations=2,
        num_train_epochs=epochs,
        rollout_buffer_size=buffer_size,
        train_batch_size=batch_size,
        agent_learning_rate=0.01,
        **FAST,
    )
    policies = {a: RecordingTabular(["x", "y"]) for a in ("a", "b")}
    trainer = MAGRPOTrainer(env=DialogueEnv(Ledger(items)), policies=policies, args=args)
    counts = count_steps(trainer)
    trainer.train()
    per_epoch = expected_steps_per_epoch(3 * items, buffer_size, args.resolved_train_batch_size)
    assert trainer.state.global_step == epochs * per_epoch
    assert counts == {"a": epochs * per_epoch, "b": epochs * per_epoch}
    for policy in policies.values():
        assert len(policy.scored) == epochs * per_epoch
        # every sample is consumed exactly once per epoch, in mini-batches of <= train_batch_size
        sizes = [len(obs) // 2 for obs in policy.scored]
        assert sum(sizes) == epochs * 3 * items
        assert max(sizes) <= args.resolved_train_batch_size


def _item_turn(observation):
    match = re.match(r"\w n=(\d+) t=(\d+)", observation)
    return int(match.group(1)), int(match.group(2))


def test_buffer_order_and_partial_buffer_at_epoch_end():
    # 2 items x 3 nodes = 6 samples per agent per epoch; buffer 4, mini-batch 3:
    # item 0 gives 3 samples (no update); item 1's root makes 4 -> update: steps of 3 and 1 samples;
    # item 1's two children stay in the buffer and are consumed at the end of the epoch: 1 step.
    args = MAGRPOConfig(
        num_turns=2, num_generations=2, num_train_epochs=2, rollout_buffer_size=4, train_batch_size=3, **FAST
    )
    policies = {a: RecordingTabular(["x", "y"]) for a in ("a", "b")}
    trainer = MAGRPOTrainer(env=DialogueEnv(Ledger(2)), policies=policies, args=args)
    trainer.train()
    epoch = [[(0, 0), (0, 1), (0, 1)], [(1, 0)], [(1, 1), (1, 1)]]
    for agent, policy in policies.items():
        batches = [[_item_turn(o) for o in obs[::2]] for obs in policy.scored]  # K=2 copies per sample
        assert batches == epoch + epoch
        assert all(o.startswith(f"{agent} ") for obs in policy.scored for o in obs)
    assert all(len(buffer) == 0 for buffer in trainer.buffers.values())


# --- optimizers and fixed partners --------------------------------------------------------------


def test_one_adamw_per_agent_with_agent_learning_rate():
    policies = {a: TabularPolicy(["alpha", "beta", "gamma"]) for a in ("row", "column")}
    trainer = MAGRPOTrainer(
        env=make("ClimbingGame-v0"), policies=policies, args=MAGRPOConfig(num_turns=1, agent_learning_rate=0.0123)
    )
    assert list(trainer.optimizers) == ["row", "column"]
    assert trainer.optimizers["row"] is not trainer.optimizers["column"]
    for agent, optimizer in trainer.optimizers.items():
        assert isinstance(optimizer, torch.optim.AdamW)
        assert [g["lr"] for g in optimizer.param_groups] == [0.0123]
        assert optimizer.defaults["fused"]  # torch's fused AdamW kernel on CPU
        params = [p for g in optimizer.param_groups for p in g["params"]]
        assert len(params) == 1 and params[0] is policies[agent].logits


def test_user_optimizers_are_used():
    policies = [TabularPolicy(["alpha", "beta", "gamma"]) for _ in range(2)]
    optimizers = [torch.optim.SGD(p.parameters(), lr=0.5) for p in policies]
    args = MAGRPOConfig(num_turns=1, num_train_epochs=3, **FAST)
    trainer = MAGRPOTrainer(env=make("ClimbingGame-v0"), policies=policies, args=args, optimizers=optimizers)
    assert trainer.optimizers == {"row": optimizers[0], "column": optimizers[1]}
    counts = count_steps(trainer)
    trainer.train()
    assert counts == {"row": 3, "column": 3}


def test_scripted_partner_is_never_updated():
    row = TabularPolicy(["alpha", "beta", "gamma"])
    column = CountingScripted(always("alpha"))
    args = MAGRPOConfig(num_turns=1, num_train_epochs=25, agent_learning_rate=0.3, **FAST)
    trainer = MAGRPOTrainer(env=make("ClimbingGame-v0"), policies={"row": row, "column": column}, args=args)
    assert list(trainer.optimizers) == ["row"]
    counts = count_steps(trainer)
    trainer.train()
    assert column.scored == 0
    assert counts == {"row": 25} and trainer.state.global_step == 25
    observation = make("ClimbingGame-v0").reset(options={"index": 0})[0]["row"]
    # against a partner that always says alpha, alpha pays 11 (beta -30, gamma 0)
    assert row.probabilities(observation)[0] > 0.9


# --- configuration (docs/algorithms.md §6) -------------------------------------------------------------------

SPEC_DEFAULTS = dict(
    num_agents=2,
    num_turns=2,
    num_train_epochs=20,
    agent_learning_rate=5e-6,
    logging_steps=50,
    num_generations=4,
    max_new_tokens=256,
    temperature=0.6,
    top_p=0.6,
    top_k=50,
    discount=1.0,
    joint_mode="aligned",
    cross_aggregation="sum",
    early_termination_threshold=-0.2,
    rollout_buffer_size=2,
    train_batch_size=None,  # means rollout_buffer_size wherever it is used
    advantage_normalization=True,
    advantage_mode="mean",
    eval_interval=16,
    eval_num_samples=4,
    eval_batch_size=1,
    external_prompt_passthrough=False,
    parallel_training="none",
    agent_devices=None,
    reference_kl_enabled=False,
    reference_kl_coef=0.1,
    reference_devices=None,
)


@pytest.mark.parametrize(
    "config_class, mode", [(MAGRPOConfig, "mean"), (MAREINFORCEConfig, "raw"), (MARLOOConfig, "rloo"), (MAReMaxConfig, "max")]
)
def test_config_defaults(config_class, mode):
    config = config_class()
    for name, value in SPEC_DEFAULTS.items():
        expected = mode if name == "advantage_mode" else value
        assert getattr(config, name) == expected, name
    assert config_class().resolved_train_batch_size == 2
    assert config_class(rollout_buffer_size=6).resolved_train_batch_size == 6
    assert config_class(joint_mode="crossed").joint_mode == "cross"


@pytest.mark.parametrize(
    "trainer_class, config_class",
    [(MAGRPOTrainer, MAGRPOConfig), (MAREINFORCETrainer, MAREINFORCEConfig), (MARLOOTrainer, MARLOOConfig), (MAReMaxTrainer, MAReMaxConfig)],
)
def test_trainer_default_config_class(trainer_class, config_class):
    policies = [TabularPolicy(["alpha", "beta", "gamma"]) for _ in range(2)]
    trainer = trainer_class(env=make("ClimbingGame-v0"), policies=policies, args=None)
    assert type(trainer.args) is config_class


INVALID = [
    (dict(num_generations=1), "num_generations"),
    (dict(num_generations=0), "num_generations"),
    (dict(num_generations=2.5), "num_generations"),
    (dict(joint_mode="diagonal"), "joint_mode"),
    (dict(joint_mode="Cross"), "joint_mode"),
    (dict(advantage_mode="median"), "advantage_mode"),
    (dict(advantage_mode=None), "advantage_mode"),
    (dict(cross_aggregation="min"), "cross_aggregation"),
    (dict(num_turns=0), "num_turns"),
    (dict(num_turns=-2), "num_turns"),
    (dict(train_batch_size=0), "train_batch_size"),
    (dict(rollout_buffer_size=0), "rollout_buffer_size"),
    (dict(parallel_training="mp"), "agent_devices"),
    (dict(parallel_training="threads"), "parallel_training"),
    (dict(agent_devices=["cpu", "cpu", "cpu"]), "agent_devices"),  # three devices for two agents (one entry is for all)
    (dict(reference_kl_coef=-0.1), "reference_kl_coef"),
    (dict(agent_learning_rate=0.0), "agent_learning_rate"),
    (dict(agent_learning_rate=-1e-5), "agent_learning_rate"),
    (dict(temperature=0.0), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-1), "top_k"),
    (dict(discount=-0.1), "discount"),
    (dict(num_agents=0), "num_agents"),
    (dict(num_train_epochs=-1), "num_train_epochs"),
    (dict(logging_steps=0), "logging_steps"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(eval_interval=-1), "eval_interval"),
    (dict(eval_num_samples=-1), "eval_num_samples"),
    (dict(eval_batch_size=0), "eval_batch_size"),
    (dict(generation_batch_size=0), "generation_batch_size"),
]


@pytest.mark.parametrize("config_class", [MAGRPOConfig, MAReMaxConfig])
@pytest.mark.parametrize("kwargs, field_name", INVALID, ids=[f"{k}" for k, _ in INVALID])
def test_invalid_config_raises_naming_the_field(config_class, kwargs, field_name):
    with pytest.raises(ValueError, match=field_name):
        config_class(**kwargs)


@pytest.mark.parametrize(
    "kwargs, allowed",
    [
        (dict(joint_mode="diagonal"), ["aligned", "cross"]),
        (dict(advantage_mode="median"), ["mean", "max", "rloo", "raw", "best"]),
        (dict(cross_aggregation="min"), ["sum", "mean", "max"]),
        (dict(num_generations=1), ["2"]),
    ],
)
def test_invalid_config_message_lists_allowed_values(kwargs, allowed):
    with pytest.raises(ValueError) as info:
        MAGRPOConfig(**kwargs)
    for value in allowed:
        assert value in str(info.value)


def test_valid_edge_values_are_accepted():
    edge = dict(
        num_generations=2, num_turns=1, train_batch_size=1, rollout_buffer_size=2, reference_kl_coef=0.0,
        eval_interval=0, advantage_mode="raw", early_termination_threshold=None, top_k=None, discount=0.0,
    )
    args = MAGRPOConfig(**edge, num_train_epochs=1, progress_bar=False)
    assert {name: getattr(args, name) for name in edge} == edge  # kept as given: nothing clamped or replaced
    placed = MAGRPOConfig(parallel_training="mp", agent_devices=["cpu", "cpu"])
    assert (placed.parallel_training, placed.agent_devices) == ("mp", ["cpu", "cpu"])
    # and the trainer runs on them: K = 2 answers per node, one sample per optimizer step
    policies = [RecordingTabular(["x", "y"]), RecordingTabular(["x", "y"])]
    trainer = MAGRPOTrainer(env=DialogueEnv(Ledger(items=2, num_turns=1)), policies=policies, args=args)
    trainer.train()
    assert trainer.state.global_step == 2
    for agent, policy in zip("ab", policies):
        assert policy.scored == [[f"{agent} n=0 t=0"] * 2, [f"{agent} n=1 t=0"] * 2]


def test_num_agents_must_match_the_env():
    policies = [TabularPolicy(["alpha"]) for _ in range(2)]
    with pytest.raises(ValueError, match="num_agents"):
        MAGRPOTrainer(env=make("ClimbingGame-v0"), policies=policies, args=MAGRPOConfig(num_agents=3, num_turns=1))


# --- evaluation (docs/algorithms.md §5) ------------------------------------------------------------------------


def scripted_ledger_trainer(**kwargs):
    hooks = {k: kwargs.pop(k) for k in ("eval_logger", "eval_aggregator") if k in kwargs}
    args = MAGRPOConfig(num_turns=2, **{**FAST, **kwargs})
    policies = {"a": ScriptedPolicy(always("x")), "b": ScriptedPolicy(always("x"))}
    return MAGRPOTrainer(env=DialogueEnv(Ledger(3)), policies=policies, args=args, **hooks)


# eval items n = 100, 101, 102 (eval_num_samples=3); both agents say "x" (they agree):
#   turn 1 rewards n + 0 + 1 = 101, 102, 103 -> mean 102
#   turn 2 rewards n + 10 + 1 = 111, 112, 113 -> mean 112
#   expected_return: turn 1: 102 + 112 = 214; turn 2: 112
EVAL_EXPECTED = {
    "eval/turn_1/reward_mean": 102.0,
    "eval/turn_1/expected_return": 214.0,
    "eval/turn_2/reward_mean": 112.0,
    "eval/turn_2/expected_return": 112.0,
}


@pytest.mark.parametrize("eval_batch_size", [1, 2, 3])
def test_evaluate_returns_predictable_metrics(eval_batch_size):
    trainer = scripted_ledger_trainer(eval_num_samples=3, eval_batch_size=eval_batch_size)
    metrics = trainer.evaluate()
    assert metrics == pytest.approx(EVAL_EXPECTED)
    assert set(metrics) == set(EVAL_EXPECTED)


def test_evaluate_ignores_early_termination_and_discount():
    trainer = scripted_ledger_trainer(
        eval_num_samples=3, early_termination_threshold=-100.0, discount=0.5, num_generations=3
    )
    assert trainer.evaluate() == pytest.approx(EVAL_EXPECTED)


def test_evaluate_plays_at_most_the_eval_dataset():
    metrics = scripted_ledger_trainer(eval_num_samples=50).evaluate()  # 5 eval items: n = 100..104
    assert metrics["eval/turn_1/reward_mean"] == pytest.approx(103.0)
    assert metrics["eval/turn_2/expected_return"] == pytest.approx(113.0)


@pytest.mark.parametrize(
    "interval, expected",
    [
        (2, [0, 2, 4, 0, 2, 4]),
        (1, [0, 1, 2, 3, 4] * 2),
        (5, [0, 0]),
        (7, [0, 0]),
        (3, [0, 3, 0, 3]),
        (0, []),
    ],
)
def test_eval_interval_schedule(interval, expected):
    # 5 train items, one item per batch -> batches 0..4 in each of 2 epochs
    args = MAGRPOConfig(
        num_turns=1, num_generations=2, num_train_epochs=2, progress_bar=False, eval_interval=interval, eval_num_samples=1
    )
    policies = {"a": TabularPolicy(["x", "y"]), "b": TabularPolicy(["x", "y"])}
    trainer = MAGRPOTrainer(env=DialogueEnv(Ledger(5, num_turns=1)), policies=policies, args=args)
    seen = []
    evaluate = trainer.evaluate

    def counting_evaluate():
        seen.append((trainer.state.epoch, trainer.state.batch_in_epoch))
        return evaluate()

    trainer.evaluate = counting_evaluate
    trainer.train()
    assert [b for _, b in seen] == expected
    assert [e for e, _ in seen] == sorted(e for e, _ in seen)
    if expected:
        assert {e for e, _ in seen} == {0, 1}


class HookRecorder:
    def __init__(self):
        self.logger_calls = 0
        self.aggregator_calls = 0
        self.items: list[int] = []

    def eval_logger(self, agent_completions_turns=None, batch_items=None, prompts=None, **kwargs):
        self.logger_calls += 1
        assert len(agent_completions_turns) == 2  # one entry per agent
        self.items += [int(item["n"]) for item in batch_items]
        return [{"n": float(item["n"])} for item in batch_items]

    def eval_aggregator(self, metrics, num_turns=None, **kwargs):
        self.aggregator_calls += 1
        assert num_turns == 2
        return {"turn_1/n_mean": float(np.mean([m["n"] for m in metrics])), "turn_2/items": float(len(metrics))}


def test_eval_hooks_used_when_both_are_given():
    hooks = HookRecorder()
    trainer = scripted_ledger_trainer(
        eval_num_samples=3, eval_logger=hooks.eval_logger, eval_aggregator=hooks.eval_aggregator
    )
    metrics = trainer.evaluate()
    assert hooks.logger_calls >= 1 and hooks.aggregator_calls == 1
    assert sorted(hooks.items) == [100, 101, 102]
    assert metrics["eval/turn_1/n_mean"] == pytest.approx(101.0)
    assert metrics["eval/turn_2/items"] == 3.0
    for name, value in EVAL_EXPECTED.items():  # the built-in metrics stay
        assert metrics[name] == pytest.approx(value)


@pytest.mark.parametrize("given", ["eval_logger", "eval_aggregator"])
def test_eval_hooks_unused_when_only_one_is_given(given):
    hooks = HookRecorder()
    trainer = scripted_ledger_trainer(eval_num_samples=3, **{given: getattr(hooks, given)})
    metrics = trainer.evaluate()
    assert hooks.logger_calls == 0 and hooks.aggregator_calls == 0
    assert set(metrics) == set(EVAL_EXPECTED)


# --- a plain PettingZoo env ---------------------------------------------------------------------


class TinyCoop(ParallelEnv):
    """Two agents pick 0, 1 or 2 (as text) once; shared payoff PAYOFF[left][right]; the optimum is
    (2, 2). Observations are numpy arrays. No llm_marl base class, no fork(), no data."""

    metadata = {"name": "tiny_coop_v0"}
    PAYOFF = ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 3.0))

    def __init__(self, nan_reward=False):
        self.possible_agents = ["left", "right"]
        self.agents = []
        self.nan_reward = nan_reward

    def observation_space(self, agent):
        return Box(0.0, 1.0, shape=(2,), dtype=np.float32)

    def action_space(self, agent):
        return Discrete(3)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        return {a: np.array([1.0, 0.0], dtype=np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        value = float("nan") if self.nan_reward else self.PAYOFF[int(actions["left"])][int(actions["right"])]
        agents, self.agents = self.agents, []
        return (
            {a: np.array([0.0, 1.0], dtype=np.float32) for a in agents},
            {a: value for a in agents},
            {a: True for a in agents},
            {a: False for a in agents},
            {a: {} for a in agents},
        )


def test_plain_parallel_env_is_trained_to_its_optimum():
    env = TinyCoop()
    assert not hasattr(env, "fork") and not hasattr(env, "step_branches")  # forked by deepcopy
    policies = [TabularPolicy([0, 1, 2]), TabularPolicy([0, 1, 2])]
    args = MAGRPOConfig(
        num_turns=1, num_train_epochs=50, agent_learning_rate=0.3, joint_mode="cross", seed=3, **FAST
    )
    trainer = MAGRPOTrainer(env=env, policies=policies, args=args)
    trainer.train()
    observation = np.array([1.0, 0.0], dtype=np.float32)
    probabilities = [p.probabilities(observation) for p in policies]
    print("TinyCoop final probabilities:", [pr.numpy().round(3).tolist() for pr in probabilities])
    assert all(int(pr.argmax()) == 2 and pr[2] > 0.9 for pr in probabilities)
    assert env.agents == []  # the env passed in was never reset or stepped by the trainer

    # Control: the same seed with reward-blind advantages (tests/controls.py) also collapses, but
    # elsewhere. Measured E[reward]: real 3.0; shuffled 0.07 (onto (0, 1)); constant 0.03 (onto (1, 0)).
    def expected(pair):
        return sum(pair[0][i] * pair[1][j] * TinyCoop.PAYOFF[i][j] for i in range(3) for j in range(3)).item()

    for blind in ("shuffle", "constant"):
        control = [TabularPolicy([0, 1, 2]), TabularPolicy([0, 1, 2])]
        with reward_blind(blind, seed=3):
            MAGRPOTrainer(env=TinyCoop(), policies=control, args=args).train()
        control_probabilities = [p.probabilities(observation) for p in control]
        assert expected(probabilities) > expected(control_probabilities) + 1.0, blind


def test_nan_reward_from_a_plain_env_raises_naming_the_item():
    args = MAGRPOConfig(num_turns=1, num_train_epochs=1, **FAST)
    trainer = MAGRPOTrainer(env=TinyCoop(nan_reward=True), policies=[TabularPolicy([0, 1, 2]) for _ in range(2)], args=args)
    with pytest.raises(ValueError, match=r"item 0.*not a finite number") as info:
        trainer.train()
    assert "different rewards" not in str(info.value)  # NaN != NaN must not be reported as a mismatch
    assert trainer.state.global_step == 0


# --- run logs --------------------------------------------------------------------------------------


def documented_metric_names(agents, num_turns):
    """Metric names from the table in learners/logging.py, instantiated for these agents/turns
    (kl_mean needs the reference KL, eval/<custom> the eval hooks, eval/skipped_items
    reward_error_policy="skip": all left out)."""
    names = re.findall(r"^``([^`]+)``", run_logging.__doc__, flags=re.M)
    assert names, "the metric table of learners/logging.py was not found"
    out = set()
    for name in names:
        if "kl_mean" in name or "<custom>" in name or name == "eval/skipped_items":
            continue
        for k in range(1, num_turns + 1):
            for agent in agents:
                out.add(name.replace("turn_k", f"turn_{k}").replace("/A/", f"/{agent}/"))
    return out


def test_tensorboard_and_jsonl_logs(tmp_path):
    args = MAGRPOConfig(
        num_turns=1,
        num_train_epochs=3,
        agent_learning_rate=0.1,
        eval_interval=1,
        eval_num_samples=1,
        logging_steps=1,
        progress_bar=False,
        output_dir=str(tmp_path),
    )
    policies = [TabularPolicy(["alpha", "beta", "gamma"]) for _ in range(2)]
    trainer = MAGRPOTrainer(env=make("ClimbingGame-v0"), policies=policies, args=args)
    trainer.train()

    expected = documented_metric_names(["row", "column"], 1)
    assert "train/row/loss" in expected and "eval/turn_1/expected_return" in expected

    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert lines and all(isinstance(line["step"], int) for line in lines)
    logged = {name for line in lines for name in line if name != "step"}
    assert expected <= logged, sorted(expected - logged)
    assert all(math.isfinite(v) for line in lines for k, v in line.items() if k != "step")
    eval_steps = [line["step"] for line in lines if "eval/turn_1/reward_mean" in line]
    assert len(eval_steps) == 3  # one evaluation before each of the 3 batches

    events = glob.glob(os.path.join(str(tmp_path), "logs", "**", "events.out.tfevents.*"), recursive=True)
    assert events
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = set()
    for path in events:
        accumulator = EventAccumulator(path)
        accumulator.Reload()
        tags |= set(accumulator.Tags()["scalars"])
    assert expected <= tags, sorted(expected - tags)


def test_no_files_without_output_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = MAGRPOConfig(num_turns=1, num_train_epochs=1, **FAST)
    trainer = MAGRPOTrainer(env=make("ClimbingGame-v0"), policies=[TabularPolicy(["alpha"]) for _ in range(2)], args=args)
    trainer.train()
    assert os.listdir(tmp_path) == []
    assert any("train/turn_1/reward_mean" in metrics for _, metrics in trainer.logger.history)


def test_config_round_trips_through_to_dict():
    config = MAReMaxConfig(num_turns=3, joint_mode="crossed", cross_aggregation="max")
    again = MAReMaxConfig(**config.to_dict())
    assert dataclasses.asdict(again) == dataclasses.asdict(config)


@pytest.mark.parametrize("max_grad_norm", [None, 1e-3])
def test_grad_norm_is_logged_before_clipping_and_clipping_applies(max_grad_norm):
    policies = [TabularPolicy(["alpha", "beta", "gamma"]) for _ in range(2)]
    args = MAGRPOConfig(num_turns=1, num_train_epochs=1, max_grad_norm=max_grad_norm, logging_steps=1, **FAST)
    trainer = MAGRPOTrainer(env=make("ClimbingGame-v0"), policies=policies, args=args)
    seen, logged = [], []
    optimizer = trainer.optimizers["row"]
    original_step = optimizer.step

    def recording_step(*a, **kw):
        seen.append(torch.linalg.vector_norm(policies[0].logits.grad).item())
        return original_step(*a, **kw)

    optimizer.step = recording_step
    note = trainer._note
    trainer._note = lambda name, value: (logged.append(value) if name == "train/row/grad_norm" else None, note(name, value))
    trainer.train()
    assert seen and len(seen) == len(logged)
    assert any(v > 1e-2 for v in logged)  # the climbing game's gradients are far larger than 1e-3
    for before, at_step in zip(logged, seen):
        if max_grad_norm is None:
            assert at_step == pytest.approx(before, rel=1e-6)
        else:
            assert at_step == pytest.approx(min(before, 1e-3), rel=1e-3)

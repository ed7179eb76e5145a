"""An update is all-or-nothing across agents (issue 13, items 5 and 6; docs/algorithms.md §4).

Two tabular agents on a one-turn task; agent b's policy can be "poisoned" so that its scoring
returns NaN (a numerically broken model). When b's loss is NaN, agent a must not have stepped:
every weight, every optimizer state, the buffered samples and ``global_step`` are as before the
failing update, and once the poison is gone training continues from there.
"""

from __future__ import annotations

import copy

import datasets
import pytest
import torch

torch.set_num_threads(1)

from llm_marl.envs import DialogueEnv  # noqa: E402
from llm_marl.learners.config import MAGRPOConfig  # noqa: E402
from llm_marl.learners.reinforce.trainer import MAGRPOTrainer  # noqa: E402
from llm_marl.policies.tabular import TabularPolicy  # noqa: E402
from llm_marl.tasks import CooperativeTask  # noqa: E402
from llm_marl.tasks.base import TaskError  # noqa: E402


class Agree(CooperativeTask):
    """Reward 1 when a and b give the same answer, else 0; ``reward_value`` overrides it."""

    agents = ("a", "b")
    num_turns = 1

    def __init__(self, items=4):
        self.items = items
        self.reward_value = None

    def dataset(self, split):
        return datasets.Dataset.from_list([{"n": n} for n in range(self.items)])

    def initial_observations(self, item):
        return {agent: f"{agent} {item['n']}" for agent in self.agents}

    def reward(self, item, actions, history):
        if self.reward_value is not None:
            return self.reward_value
        return float(actions["a"] == actions["b"])


class Poisonable(TabularPolicy):
    def __init__(self, actions):
        super().__init__(actions)
        self.poisoned = False

    def log_probs(self, observations, completions, reduction="sum"):
        values = super().log_probs(observations, completions, reduction)
        return values * float("nan") if self.poisoned else values


def make_trainer(parallel="none", **overrides):
    settings = dict(
        num_turns=1, num_generations=4, num_train_epochs=1, rollout_buffer_size=2, agent_learning_rate=0.5,
        early_termination_threshold=None, eval_interval=0, progress_bar=False, seed=1,
    )
    if parallel == "mp":
        settings.update(parallel_training="mp", agent_devices=["cpu", "cpu"])
    settings.update(overrides)
    policies = {"a": TabularPolicy(["x", "y"]), "b": Poisonable(["x", "y"])}
    return MAGRPOTrainer(env=DialogueEnv(Agree()), policies=policies, args=MAGRPOConfig(**settings))


def snapshot(trainer):
    return {
        "weights": {a: {n: p.detach().clone() for n, p in trainer.policies[a].named_parameters()} for a in trainer.agents},
        "optimizers": {a: copy.deepcopy(o.state_dict()) for a, o in trainer.optimizers.items()},
        "buffers": {a: [(s.index, s.observation, s.advantages) for s in b.samples] for a, b in trainer.buffers.items()},
        "global_step": trainer.state.global_step,
    }


def same(x, y):
    if isinstance(x, torch.Tensor):
        return torch.equal(x, y)
    if isinstance(x, dict):
        return x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return len(x) == len(y) and all(same(a, b) for a, b in zip(x, y))
    return x == y


@pytest.mark.parametrize("parallel", ["none", "mp"])
def test_a_nan_loss_of_agent_b_leaves_every_agent_as_before_and_training_resumes(parallel):
    trainer = make_trainer(parallel)
    # batch 0 (item 0) fills both buffers with 1 sample each; the update comes with item 1
    trainer._train_batch([0])
    assert [len(b) for b in trainer.buffers.values()] == [1, 1]
    before = snapshot(trainer)
    trainer.policies["b"].poisoned = True
    with pytest.raises(FloatingPointError) as info:
        trainer._train_batch([1])
    message = str(info.value)
    assert "agent 'b', optimizer step 1, items [0, 1]: loss is nan" in message
    assert "no agent was updated" in message
    after = snapshot(trainer)
    assert same(after["weights"], before["weights"])  # today: agent a already stepped
    assert same(after["optimizers"], before["optimizers"])
    assert after["global_step"] == 0
    # the buffers kept batch 0's sample and hold batch 1's too: nothing was drained
    assert [[index for index, *_ in after["buffers"][a]] for a in ("a", "b")] == [[0, 1], [0, 1]]
    assert all(p.grad is None for a in trainer.agents for p in trainer.policies[a].parameters())

    trainer.policies["b"].poisoned = False
    trainer._update()  # the very samples that failed are trained on now
    assert trainer.state.global_step == 1 and [len(b) for b in trainer.buffers.values()] == [0, 0]
    trained = snapshot(trainer)
    assert not same(trained["weights"]["a"], before["weights"]["a"])
    assert not same(trained["weights"]["b"], before["weights"]["b"])


def test_an_undisturbed_run_and_a_run_with_a_failed_update_end_with_the_same_weights():
    # the failed update costs nothing: retrying it gives exactly the run that never failed
    clean = make_trainer()
    for index in range(4):
        clean._train_batch([index])
    failing = make_trainer()
    failing._train_batch([0])
    failing.policies["b"].poisoned = True
    with pytest.raises(FloatingPointError):
        failing._train_batch([1])
    failing.policies["b"].poisoned = False
    failing._train_batch([1])  # the batch is finished, not collected again: its update is retried
    for index in (2, 3):
        failing._train_batch([index])
    assert clean.state.global_step == failing.state.global_step == 2
    for agent in ("a", "b"):
        assert torch.equal(clean.policies[agent].logits, failing.policies[agent].logits)


def test_steps_before_the_failing_one_stand():
    # buffer 4, mini-batches of 2: the update takes two steps; b's second mini-batch fails
    trainer = make_trainer(rollout_buffer_size=4, train_batch_size=2)
    calls = {"n": 0}
    score = trainer.policies["b"].log_probs

    def second_call_nan(observations, completions, reduction="sum"):
        calls["n"] += 1
        values = score(observations, completions, reduction)
        return values * float("nan") if calls["n"] == 2 else values

    trainer.policies["b"].log_probs = second_call_nan
    for index in range(3):
        trainer._train_batch([index])
    with pytest.raises(FloatingPointError, match=r"agent 'b', optimizer step 2, items \[2, 3\]: loss is nan"):
        trainer._train_batch([3])
    assert trainer.state.global_step == 1
    assert [[s.index for s in trainer.buffers[a].samples] for a in ("a", "b")] == [[2, 3], [2, 3]]


def fail_once_at(trainer, call):
    """Agent b's scoring returns NaN on its ``call``-th use only (a transient fault, then fixed)."""
    calls = {"n": 0}
    score = trainer.policies["b"].log_probs

    def flaky(observations, completions, reduction="sum"):
        calls["n"] += 1
        values = score(observations, completions, reduction)
        return values * float("nan") if calls["n"] == call else values

    trainer.policies["b"].log_probs = flaky


def count_rollouts(trainer):
    """Counts the task's reward calls: each (item, joint answer) rolled out once is one call."""
    counted = {"n": 0}
    task = trainer.env.task
    reward = task.reward

    def counting(item, actions, history):
        counted["n"] += 1
        return reward(item, actions, history)

    task.reward = counting
    return counted


@pytest.mark.parametrize(
    "items, overrides, failing_call",
    [
        (4, {}, 2),  # the update after batch 3 (buffers of 2)
        (3, {}, 2),  # the epoch's closing update (batch 2 leaves one sample per agent)
        (4, {"rollout_buffer_size": 4, "train_batch_size": 2}, 2),  # the 2nd mini-batch: step 1 stands
    ],
    ids=["mid-epoch", "epoch-end", "second-mini-batch"],
)
def test_calling_train_again_after_a_failed_update_gives_the_run_that_never_failed(items, overrides, failing_call):
    settings = dict(num_train_epochs=2, **overrides)

    def build():
        trainer = make_trainer(**settings)
        trainer.env.task.items = items
        return trainer, count_rollouts(trainer)

    clean, clean_rollouts = build()
    clean.train()
    failing, failing_rollouts = build()
    fail_once_at(failing, failing_call)
    with pytest.raises(FloatingPointError, match="loss is nan"):
        failing.train()
    failing.train()  # the same trainer, the cause gone: nothing is collected or trained twice
    assert failing.state == clean.state
    assert failing_rollouts["n"] == clean_rollouts["n"]
    for agent in ("a", "b"):
        assert torch.equal(clean.policies[agent].logits, failing.policies[agent].logits), agent


# --- item 6: non-finite rewards and returns name agents and the optimizer step ----------------------


def test_a_nan_reward_names_item_turn_agents_and_optimizer_step():
    trainer = make_trainer()
    trainer._train_batch([0])
    trainer._train_batch([1])  # one optimizer step
    trainer.env.task.reward_value = float("nan")
    with pytest.raises(TaskError) as info:
        trainer._train_batch([2])
    message = str(info.value)
    assert "task Agree, item 2, turn 0" in message and "reward is nan" in message
    assert "a reward shared by agents ['a', 'b'], collected for optimizer step 2 (dataset batch 0)" in message


def test_a_non_finite_return_names_agent_item_turn_and_optimizer_step():
    # two finite rewards whose discounted sum overflows: 1e308 + 1e308 = inf
    class Huge(Agree):
        num_turns = 2

        def reward(self, item, actions, history):
            return 1e308

        def transition(self, item, actions, history):
            return {agent: f"{agent} again" for agent in self.agents}

    args = MAGRPOConfig(
        num_turns=2, num_generations=2, num_train_epochs=1, early_termination_threshold=None, eval_interval=0,
        progress_bar=False,
    )
    trainer = MAGRPOTrainer(env=DialogueEnv(Huge()), policies=[TabularPolicy(["x"]), TabularPolicy(["x"])], args=args)
    with pytest.raises(FloatingPointError) as info:
        trainer.train()
    message = str(info.value)
    assert "agent 'a', item 0, turn 0: return of answer 0 is inf" in message
    assert "collected for optimizer step 1 (dataset batch 0)" in message

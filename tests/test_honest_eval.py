"""Evaluation never plays training items by accident (issue 13, item 3; docs/algorithms.md §5).

The task ("Marked") has train items n = 0, 1 and, unless told otherwise, eval items n = 100..102;
the reward is the item's n, so a metric tells which items were played: a mean reward below 100
means training items were evaluated.
"""

from __future__ import annotations

import re
import warnings

import datasets
import pytest
import torch

torch.set_num_threads(1)

from gymnasium.spaces import Discrete  # noqa: E402
from pettingzoo import ParallelEnv  # noqa: E402

from llm_marl.envs import DialogueEnv  # noqa: E402
from llm_marl.learners.config import MAGRPOConfig  # noqa: E402
from llm_marl.learners.reinforce.trainer import MAGRPOTrainer  # noqa: E402
from llm_marl.policies.scripted import ScriptedPolicy  # noqa: E402
from llm_marl.policies.tabular import TabularPolicy  # noqa: E402
from llm_marl.tasks import CooperativeTask  # noqa: E402
from llm_marl.tasks.base import TaskError  # noqa: E402


class Marked(CooperativeTask):
    agents = ("a", "b")
    num_turns = 1

    def __init__(self, eval_rows="default", fail_on=None):
        self.eval_rows = eval_rows
        self.fail_on = fail_on

    def dataset(self, split):
        if split == "train":
            return datasets.Dataset.from_list([{"n": 0}, {"n": 1}])
        if self.eval_rows == "raises":
            raise KeyError("no eval split in this corpus")
        rows = [100, 101, 102] if self.eval_rows == "default" else self.eval_rows
        return datasets.Dataset.from_list([{"n": n} for n in rows])

    def initial_observations(self, item):
        return {agent: f"{agent} {item['n']}" for agent in self.agents}

    def reward(self, item, actions, history):
        if item["n"] == self.fail_on:
            raise RuntimeError("judge unavailable")
        return float(item["n"])

    def transition(self, item, actions, history):
        raise AssertionError("one turn: never called")


def policies():
    say = lambda observation, n: ["x"] * n  # noqa: E731
    return {"a": ScriptedPolicy(say), "b": ScriptedPolicy(say)}


def trainer_for(env, **kwargs):
    eval_env = kwargs.pop("eval_env", None)
    args = MAGRPOConfig(num_turns=1, num_generations=2, num_train_epochs=2, progress_bar=False, **kwargs)
    return MAGRPOTrainer(env=env, policies=policies(), args=args, eval_env=eval_env)


def messages(records, text):
    return [str(r.message) for r in records if text in str(r.message)]


@pytest.mark.parametrize(
    "eval_rows, why",
    [("raises", r"dataset\('eval'\) raised KeyError: 'no eval split in this corpus'"), ([], "the eval split is empty")],
)
def test_without_eval_data_periodic_evaluation_is_skipped_with_one_warning(eval_rows, why, tmp_path):
    trainer = trainer_for(DialogueEnv(Marked(eval_rows)), eval_interval=1, output_dir=str(tmp_path))
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        trainer.train()  # 2 epochs x 2 batches: 4 scheduled evaluations
        assert trainer.evaluate() == {}  # explicit: the same skip
    skipped = messages(records, "evaluation skipped")
    assert len(skipped) == 1, skipped
    assert "task Marked" in skipped[0] and "eval_env=" in skipped[0]
    assert re.search(why, skipped[0])
    logged = (tmp_path / "metrics.jsonl").read_text()
    assert "eval/" not in logged  # today: eval/turn_1/reward_mean 0.5, the training items


def test_a_foreign_env_is_evaluated_only_when_passed_as_eval_env():
    class Plain(ParallelEnv):
        metadata = {"name": "plain_v0"}

        def __init__(self):
            self.possible_agents, self.agents = ["a", "b"], []

        def action_space(self, agent):
            return Discrete(1)

        def reset(self, seed=None, options=None):
            self.agents = ["a", "b"]
            return {a: "go" for a in self.agents}, {a: {} for a in self.agents}

        def step(self, actions):
            agents, self.agents = self.agents, []
            return ({a: "" for a in agents}, {a: 7.0 for a in agents}, {a: True for a in agents},
                    {a: False for a in agents}, {a: {} for a in agents})

    env = Plain()
    tabular = {"a": TabularPolicy(["x"]), "b": TabularPolicy(["x"])}
    args = MAGRPOConfig(num_turns=1, eval_interval=0, eval_num_samples=1, progress_bar=False)
    with pytest.warns(UserWarning, match=r"evaluation skipped: the env is a Plain, not a DialogueEnv"):
        assert MAGRPOTrainer(env=env, policies=tabular, args=args).evaluate() == {}
    explicit = MAGRPOTrainer(env=env, policies=tabular, args=args, eval_env=env)
    assert explicit.evaluate()["eval/turn_1/reward_mean"] == 7.0


def test_the_training_env_passed_as_eval_env_is_evaluated_on_purpose():
    env = DialogueEnv(Marked("raises"))
    metrics = trainer_for(env, eval_env=env, eval_num_samples=2).evaluate()
    assert metrics["eval/turn_1/reward_mean"] == 0.5  # items n = 0, 1


def test_eval_num_samples_over_the_split_warns_once_naming_both_numbers():
    trainer = trainer_for(DialogueEnv(Marked()), eval_num_samples=50)
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        first, second = trainer.evaluate(), trainer.evaluate()
    assert first == second and first["eval/turn_1/reward_mean"] == 101.0  # all 3 eval items
    capped = messages(records, "eval_num_samples")
    assert capped == ["eval_num_samples is 50 but the eval data has 3 items; evaluating on all 3"]


def test_reward_error_policy_skip_covers_evaluation(capsys):
    task = Marked(fail_on=101)
    with pytest.raises(TaskError, match=r"item 1, turn 0: reward raised RuntimeError: judge unavailable"):
        trainer_for(DialogueEnv(task), eval_num_samples=3).evaluate()
    metrics = trainer_for(DialogueEnv(task), eval_num_samples=3, reward_error_policy="skip").evaluate()
    assert metrics["eval/turn_1/reward_mean"] == 101.0  # items 100 and 102; 101 dropped
    assert metrics["eval/skipped_items"] == 1.0
    assert "skipped eval item 1" in capsys.readouterr().out


def test_drop_in_constructor_without_eval_dataset_does_not_evaluate_training_items():
    from llm_marl.policies.tiny import load_tiny

    model, tokenizer = load_tiny()
    trainer = MAGRPOTrainer(
        agent_model=model,
        tokenizer=tokenizer,
        reward_func=lambda a, b: [1.0],
        train_dataset=[{"prompt": "hi"}],
        args=MAGRPOConfig(num_turns=1, max_new_tokens=2, eval_interval=0, progress_bar=False),
    )
    with pytest.warns(UserWarning, match=r"evaluation skipped: .*FunctionTask has no 'eval' dataset.*eval_dataset="):
        assert trainer.evaluate() == {}

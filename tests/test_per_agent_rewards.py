"""Per-agent rewards (issue 22.3): a task's reward (a dict agent -> float) or a CoMLRL reward_func
(a list of N floats) gives each agent its own reward; IAC and MAAC train each critic output on its
own agent's reward; the MAGRPO family, which needs one shared reward, refuses them by name.

On the previous main a list of N values gave every agent element [0] (so critic b learned a's
reward), and a dict reward raised "reward must be a real number".
"""

from __future__ import annotations

import datasets
import pytest
import torch

torch.set_num_threads(1)

from llm_marl.envs.dialogue import DialogueEnv  # noqa: E402
from llm_marl.learners import IACConfig, IACTrainer, MAACConfig, MAACTrainer, MAGRPOConfig, MAGRPOTrainer  # noqa: E402
from llm_marl.policies.critic import joint_observation  # noqa: E402
from llm_marl.policies.tabular import TabularPolicy  # noqa: E402
from llm_marl.tasks.base import CooperativeTask, TaskError  # noqa: E402
from llm_marl.tasks.function_task import FunctionTask  # noqa: E402

MENU = ("red", "green", "blue")
ROWS = [{"prompt": "name a colour"}]


class Split(CooperativeTask):
    """Two agents; whatever they say, a earns ``rewards["a"]`` and b ``rewards["b"]``."""

    agents = ("a", "b")
    num_turns = 1

    def __init__(self, rewards):
        self.given = rewards

    def dataset(self, split):
        return datasets.Dataset.from_list([{"id": 0}])

    def initial_observations(self, item):
        return {agent: "go" for agent in self.agents}

    def reward(self, item, actions, history):
        return self.given


def settings(**overrides):
    base = dict(num_turns=1, num_generations=2, num_train_epochs=1, agent_learning_rate=0.1, critic_learning_rate=0.1,
                rollout_buffer_size=1, eval_interval=0, logging_steps=1, progress_bar=False, seed=3, value_clip_range=None)
    base.update(overrides)
    return base


def per_agent_list(first, second):
    """CoMLRL's per-agent form: one reward per agent, in agent order."""
    return [1.0, -0.5]


# --- where the values come from ----------------------------------------------------------------


def test_a_task_dict_reward_reaches_each_agent_and_the_history():
    env = DialogueEnv(Split({"a": 1.0, "b": -0.5}))
    env.reset(options={"index": 0})
    _, rewards, _, _, _ = env.step({"a": "x", "b": "y"})
    assert rewards == {"a": 1.0, "b": -0.5}
    [turn] = env.history
    assert dict(turn.rewards) == {"a": 1.0, "b": -0.5} and turn.reward == pytest.approx(0.25)  # the mean


def test_a_dict_reward_may_come_with_details():
    env = DialogueEnv(Split(({"a": 1.0, "b": 0.0}, {"why": "a named the colour"})))
    env.reset(options={"index": 0})
    _, rewards, _, _, infos = env.step({"a": "x", "b": "y"})
    assert rewards == {"a": 1.0, "b": 0.0} and infos["b"]["reward_details"] == {"why": "a named the colour"}


def test_equal_per_agent_values_are_one_shared_reward():
    env = DialogueEnv(Split({"a": 2.0, "b": 2.0}))
    env.reset(options={"index": 0})
    _, rewards, _, _, _ = env.step({"a": "x", "b": "y"})
    assert rewards == {"a": 2.0, "b": 2.0}
    assert dict(env.history[0].rewards) == {} and env.history[0].reward == 2.0


@pytest.mark.parametrize("bad, message", [({"a": 1.0}, "every agent"), ({"a": 1.0, "b": 2.0, "c": 0.0}, "every agent"),
                                          ({"a": 1.0, "b": float("nan")}, "agent 'b'")])
def test_a_bad_per_agent_reward_names_the_problem(bad, message):
    env = DialogueEnv(Split(bad))
    env.reset(options={"index": 0})
    with pytest.raises(TaskError, match=message):
        env.step({"a": "x", "b": "y"})


def test_function_task_reads_a_list_of_n_values_per_agent_and_processes_each():
    task = FunctionTask(per_agent_list, lambda item: item["prompt"], dataset=ROWS, reward_processor=lambda r: 2 * r)
    assert task.reward(ROWS[0], {"agent_0": "x", "agent_1": "y"}, ()) == {"agent_0": 2.0, "agent_1": -1.0}
    by_index = FunctionTask(lambda a, b: {1: 3.0, 0: 4.0}, lambda item: item["prompt"], dataset=ROWS)
    assert by_index.reward(ROWS[0], {"agent_0": "x", "agent_1": "y"}, ()) == {"agent_0": 4.0, "agent_1": 3.0}
    shared = FunctionTask(lambda a, b: [0.5, 0.5], lambda item: item["prompt"], dataset=ROWS)
    assert shared.reward(ROWS[0], {"agent_0": "x", "agent_1": "y"}, ()) == 0.5  # equal values: one shared reward


def test_function_task_refuses_a_list_that_is_neither_shared_nor_per_agent():
    task = FunctionTask(lambda a, b: [1.0, 2.0, 3.0], lambda item: item["prompt"], dataset=ROWS)
    with pytest.raises(TypeError, match=r"3 values for one joint answer of 2 agents: expected 1 \(shared\) or 2"):
        task.reward(ROWS[0], {"agent_0": "x", "agent_1": "y"}, ())
    keyed = FunctionTask(lambda a, b: {0: 1.0, 5: 2.0}, lambda item: item["prompt"], dataset=ROWS)
    with pytest.raises(TypeError, match="one per agent"):
        keyed.reward(ROWS[0], {"agent_0": "x", "agent_1": "y"}, ())


# --- learners that can use them -----------------------------------------------------------------


def test_iac_samples_carry_each_agents_own_reward():
    env = DialogueEnv(FunctionTask(per_agent_list, lambda item: item["prompt"], dataset=ROWS))
    trainer = IACTrainer(env=env, policies=[TabularPolicy(MENU), TabularPolicy(MENU)], args=IACConfig(**settings()))
    roots = trainer._collect([0])[0]
    assert roots[0].agent_rewards == {"agent_0": [1.0, 1.0], "agent_1": [-0.5, -0.5]}
    assert roots[0].rewards == [0.25, 0.25]  # the agents' mean
    samples = trainer._samples(roots)
    assert {s.agent: s.targets for s in samples} == {"agent_0": [1.0, 1.0], "agent_1": [-0.5, -0.5]}


def test_iac_trains_each_critic_on_its_own_agents_reward():
    env = DialogueEnv(FunctionTask(per_agent_list, lambda item: item["prompt"], dataset=ROWS))
    trainer = IACTrainer(env=env, policies=[TabularPolicy(MENU), TabularPolicy(MENU)], args=IACConfig(**settings(num_train_epochs=60)))
    trainer.train()
    values = {agent: float(trainer.critics[agent].values(["name a colour"]).detach()[0, 0]) for agent in trainer.agents}
    assert values["agent_0"] == pytest.approx(1.0, abs=0.05)
    assert values["agent_1"] == pytest.approx(-0.5, abs=0.05)


def test_maac_trains_each_output_of_the_central_critic_on_its_agents_reward():
    env = DialogueEnv(Split({"a": 1.0, "b": -0.5}))
    trainer = MAACTrainer(env=env, policies=[TabularPolicy(MENU), TabularPolicy(MENU)], args=MAACConfig(**settings(num_train_epochs=60)))
    trainer.train()
    values = trainer.critics["critic"].values([joint_observation({"a": "go", "b": "go"}, ["a", "b"])]).detach()[0]
    assert values.tolist() == pytest.approx([1.0, -0.5], abs=0.05)


def test_iac_evaluates_with_per_agent_rewards():
    env = DialogueEnv(Split({"a": 1.0, "b": -0.5}))
    trainer = IACTrainer(env=env, policies=[TabularPolicy(MENU), TabularPolicy(MENU)], eval_env=env, args=IACConfig(**settings(eval_num_samples=1)))
    assert trainer.evaluate()["eval/turn_1/reward_mean"] == pytest.approx(0.25)


# --- learners that need one shared reward --------------------------------------------------------


def test_the_magrpo_family_refuses_per_agent_rewards_naming_learner_item_and_agents():
    env = DialogueEnv(FunctionTask(per_agent_list, lambda item: item["prompt"], dataset=ROWS))
    args = MAGRPOConfig(num_turns=1, num_generations=2, num_train_epochs=1, eval_interval=0, progress_bar=False, seed=3)
    trainer = MAGRPOTrainer(env=env, policies=[TabularPolicy(MENU), TabularPolicy(MENU)], args=args)
    with pytest.raises(ValueError) as info:
        trainer.train()
    text = str(info.value)
    assert "item 0, turn 0" in text and "'agent_0': 1.0" in text and "'agent_1': -0.5" in text
    assert "MAGRPOTrainer uses one shared reward per joint action" in text and "IAC or MAAC" in text

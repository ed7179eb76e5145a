"""Transitions run only for branches that get a child (docs/algorithms.md §3.5; issue 13, item 1).

The task ("Tally") counts every call of its external transition. Two agents answer from the
menu "0"/"1"/"2"; the reward is the sum of the two answers (as numbers) plus ``bias``, so the
mean immediate reward of a node — and with it early termination — is set by ``bias``.
Scripted policies answer "0", "1", "2" for K = 3, so a node has 3 aligned or 9 cross joint
actions.
"""

from __future__ import annotations

import datasets
import pytest
import torch

torch.set_num_threads(1)

from llm_marl.envs import Branch, DialogueEnv, DiscreteMenuWrapper  # noqa: E402
from llm_marl.learners.config import MAGRPOConfig  # noqa: E402
from llm_marl.learners.reinforce.trainer import MAGRPOTrainer  # noqa: E402
from llm_marl.learners.tree import grow_trees, iter_nodes  # noqa: E402
from llm_marl.policies.scripted import ScriptedPolicy  # noqa: E402
from llm_marl.tasks import CooperativeTask  # noqa: E402
from llm_marl.tasks.base import TaskError  # noqa: E402


class Tally(CooperativeTask):
    agents = ("a", "b")

    def __init__(self, num_turns=2, bias=0.0, transition_raises=False, done_after_zero=False):
        self.num_turns = num_turns
        self.bias = bias
        self.transition_raises = transition_raises
        self.done_after_zero = done_after_zero
        self.transitions = 0

    def dataset(self, split):
        return datasets.Dataset.from_list([{"n": n} for n in range(2)])

    def initial_observations(self, item):
        return {agent: f"{agent} start" for agent in self.agents}

    def reward(self, item, actions, history):
        return float(int(actions["a"]) + int(actions["b"])) + self.bias

    def transition(self, item, actions, history):
        self.transitions += 1
        if self.transition_raises:
            raise RuntimeError("test runner crashed")
        return {agent: f"{agent} t={len(history)} prev={actions['a']}{actions['b']}" for agent in self.agents}

    def is_done(self, item, history):
        return self.done_after_zero and history[-1].actions["a"] == "0"


def menu_policies():
    answers = lambda observation, n: ["0", "1", "2"][:n]  # noqa: E731
    return {"a": ScriptedPolicy(answers), "b": ScriptedPolicy(answers)}


def grow(task, **kwargs):
    settings = dict(num_samples=3, num_turns=task.num_turns, joint_mode="aligned")
    settings.update(kwargs)
    return grow_trees(DialogueEnv(task), menu_policies(), [0], **settings)


# Aligned joint actions (0,0), (1,1), (2,2): rewards 0, 2, 4 (+ bias), mean 2 + bias.
# Cross: the 9 pairs, rewards 0..4, mean 2 + bias.


@pytest.mark.parametrize("joint_mode, branches", [("aligned", 3), ("cross", 9)])
def test_an_early_terminated_root_runs_no_transition(joint_mode, branches):
    task = Tally(num_turns=2)
    [root] = grow(task, joint_mode=joint_mode, early_termination_threshold=1.5)  # mean 2 > 1.5
    assert len(root.rewards) == branches and root.children == [None] * branches
    assert task.transitions == 0  # eager stepping ran one per joint action: 3 (aligned), 9 (cross)


@pytest.mark.parametrize("joint_mode, branches", [("aligned", 3), ("cross", 9)])
def test_only_expanded_branches_run_the_transition(joint_mode, branches):
    # 3 turns, nothing cut: the root's and every turn-1 node's branches are expanded; the last
    # turn (turn 2) ends every branch, so its nodes' branches get no transition.
    task = Tally(num_turns=3)
    [root] = grow(task, joint_mode=joint_mode, early_termination_threshold=None)
    nodes = list(root.nodes())
    assert [n.turn for n in nodes].count(2) == branches * branches
    assert task.transitions == branches + branches * branches  # children at turns 1 and 2


@pytest.mark.parametrize("joint_mode, branches", [("aligned", 3), ("cross", 9)])
def test_the_trees_last_turn_runs_no_transition_even_before_the_envs_horizon(joint_mode, branches):
    # a 3-turn task grown for 2 turns: the env would continue after turn 1, the tree does not
    task = Tally(num_turns=3)
    [root] = grow(task, joint_mode=joint_mode, num_turns=2, early_termination_threshold=None)
    assert len(list(root.nodes())) == 1 + branches
    assert task.transitions == branches  # eager stepping: branches + branches**2


def test_branches_ended_by_the_task_run_no_transition():
    # done_after_zero ends every branch whose agent a said "0" (joint action 0 of each node)
    task = Tally(num_turns=3, done_after_zero=True)
    [root] = grow(task, joint_mode="aligned", early_termination_threshold=None)
    assert [child is None for child in root.children] == [True, False, False]
    # root: 2 expanded branches; each turn-1 node: 2 expanded branches; turn 2 is the last
    assert task.transitions == 2 + 2 * 2


def test_a_raising_transition_on_a_branch_that_is_not_expanded_does_not_abort_training():
    task = Tally(num_turns=2, transition_raises=True)
    args = MAGRPOConfig(
        num_turns=2, num_generations=3, num_train_epochs=1, early_termination_threshold=1.5,
        eval_interval=0, progress_bar=False,
    )
    trainer = MAGRPOTrainer(env=DialogueEnv(task), policies=menu_policies(), args=args)
    trainer.train()
    assert task.transitions == 0 and trainer.state.batch_step == 2
    # ...while one that is expanded still raises, naming the item and turn
    task.bias = -10.0  # mean -8: not cut
    with pytest.raises(TaskError, match=r"item 0, turn 0: transition raised RuntimeError: test runner crashed"):
        grow(task, early_termination_threshold=1.5)


def test_trainer_counts_match_the_expanded_branches():
    task = Tally(num_turns=2)
    args = MAGRPOConfig(
        num_turns=2, num_generations=3, num_train_epochs=1, early_termination_threshold=None,
        eval_interval=0, progress_bar=False,
    )
    MAGRPOTrainer(env=DialogueEnv(task), policies=menu_policies(), args=args).train()
    assert task.transitions == 2 * 3  # 2 items, 3 expanded root branches each, none at turn 1


# --- the env API stays honest for outside users --------------------------------------------------


def test_step_alone_still_returns_the_next_observations():
    task = Tally(num_turns=2)
    env = DialogueEnv(task)
    env.reset(options={"index": 0})
    observations, rewards, terminations, *_ = env.step({"a": "1", "b": "2"})
    assert observations == {"a": "a t=1 prev=12", "b": "b t=1 prev=12"}
    assert rewards == {"a": 3.0, "b": 3.0} and terminations == {"a": False, "b": False}
    assert task.transitions == 1


def test_step_rewards_scores_without_playing_and_advance_plays_one_branch():
    from llm_marl.envs import ScoredStep

    task = Tally(num_turns=2)
    env = DialogueEnv(task)
    env.reset(options={"index": 1})
    scored = env.step_rewards([{"a": "0", "b": "1"}, {"a": "2", "b": "2"}])
    assert all(isinstance(s, ScoredStep) for s in scored)
    assert [s.rewards for s in scored] == [{"a": 1.0, "b": 1.0}, {"a": 4.0, "b": 4.0}]
    assert [s.infos["a"]["turn"] for s in scored] == [0, 0]
    assert task.transitions == 0 and env.turn == 0 and env.agents == ["a", "b"]
    branch = env.advance(scored[1])
    assert isinstance(branch, Branch) and task.transitions == 1
    assert branch.observations == {"a": "a t=1 prev=22", "b": "b t=1 prev=22"}
    assert branch.env.turn == 1 and env.turn == 0  # the fork moved, this env did not
    # the same as step() on a fork
    twin = env.fork()
    assert twin.step({"a": "2", "b": "2"})[0] == branch.observations
    # a ScoredStep belongs to the state it was scored from
    with pytest.raises(ValueError, match="step_rewards"):
        branch.env.advance(scored[0])


def test_advance_after_the_last_turn_runs_no_transition():
    task = Tally(num_turns=1)
    env = DialogueEnv(task)
    env.reset(options={"index": 0})
    [scored] = env.step_rewards([{"a": "1", "b": "1"}])
    branch = env.advance(scored)
    assert branch.terminations == {"a": True, "b": True} and branch.observations == {"a": "", "b": ""}
    assert branch.env.agents == [] and task.transitions == 0


def test_adapters_do_not_forward_the_two_halves():
    # the wrapped env's step_rewards would get undecoded actions and return unwrapped branches;
    # an adapter is branched eagerly through its own step_branches
    wrapper = DiscreteMenuWrapper(DialogueEnv(Tally(num_turns=2)), menus={"a": ("0", "1"), "b": ("0", "1")})
    assert not hasattr(wrapper, "step_rewards") and not hasattr(wrapper, "advance")

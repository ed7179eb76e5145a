"""K-branch rollout trees against a scenario computed by hand (docs/algorithms.md §3, DESIGN.md RolloutNode).

The scenario ("Arith"): agents a and b, answers are integers written as text.

    prompts     turn 0:  "<agent>|<item>|start"
                later:   "<agent>|<item>|prev=p,q"   (p, q: what a and b said last turn)
    policy a    start -> ["1", "2"];   prev=p,q -> [q, p+q]
    policy b    start -> ["3", "4"];   prev=p,q -> [p, 0]
    reward      turn 0: p*q - 10;   turn 1: p - q;   turn 2: 2p - q;   plus the item's offset
                (item x: 0, item y: -100, item z: -1000), where p, q are this turn's answers.

K = 2 (the scripted answers), N = 2. Joint actions are listed in agent order (a, b).

Aligned, 2 turns, item x
    root: (1,3) -> -7, (2,4) -> -2
    child of (1,3), prev=1,3: a [3,4], b [1,0]: (3,1) -> 2, (4,0) -> 4    mean 3
    child of (2,4), prev=2,4: a [4,6], b [2,0]: (4,2) -> 2, (6,0) -> 6    mean 4
    returns gamma=1:   root [-7+3, -2+4] = [-4, 2]
            gamma=0.5: root [-7+1.5, -2+2] = [-5.5, 0]

Cross, 2 turns, item x
    root joint (0,0),(0,1),(1,0),(1,1) = (1,3),(1,4),(2,3),(2,4) -> -7, -6, -4, -2
    child (1,3): a [3,4] b [1,0] -> (3,1) 2, (3,0) 3, (4,1) 3, (4,0) 4   mean 3
    child (1,4): a [4,5] b [1,0] -> 3, 4, 4, 5                           mean 4
    child (2,3): a [3,5] b [2,0] -> 1, 3, 3, 5                           mean 3
    child (2,4): a [4,6] b [2,0] -> 2, 4, 4, 6                           mean 4
    root returns gamma=1:   [-4, -2, -1, 2];    gamma=0.5: [-5.5, -4, -2.5, 0]
    agent a (answer "1" in joints 0,1; "2" in joints 2,3), gamma=1:
        sum [-6, 1]   mean [-3, 0.5]   max [-2, 2]
    agent b (answer "3" in joints 0,2; "4" in joints 1,3), gamma=1:
        sum [-5, 0]   mean [-2.5, 0]   max [-1, 2]
    gamma=0.5, sum: a [-9.5, -2.5], b [-8, -4]

Aligned, 3 turns, item x
    root (1,3) -7 -> C1, (2,4) -2 -> C2                                  mean -4.5
    C1 prev=1,3: (3,1) 2 -> G1, (4,0) 4 -> G2                            mean 3
       G1 prev=3,1: a [1,4] b [3,0]: (1,3) 2-3 = -1, (4,0) 8             mean 3.5
       G2 prev=4,0: a [0,4] b [4,0]: (0,4) -4, (4,0) 8                   mean 2
    C2 prev=2,4: (4,2) 2 -> G3, (6,0) 6 -> G4                            mean 4
       G3 prev=4,2: a [2,6] b [4,0]: (2,4) 0, (6,0) 12                   mean 6
       G4 prev=6,0: a [0,6] b [6,0]: (0,6) -6, (6,0) 12                  mean 3
    gamma=1:   C1 [2+3.5, 4+2] = [5.5, 6] (mean 5.75); C2 [2+6, 6+3] = [8, 9] (mean 8.5)
               root [-7+5.75, -2+8.5] = [-1.25, 6.5]
    gamma=0.5: C1 [2+1.75, 4+1] = [3.75, 5] (mean 4.375); C2 [2+3, 6+1.5] = [5, 7.5] (mean 6.25)
               root [-7+2.1875, -2+3.125] = [-4.8125, 1.125]
    early termination (node cut when its MEAN immediate reward is strictly > threshold):
        threshold 4.0: nothing cut (C2's mean 4 is not > 4): as without termination
        threshold 3.5 or 3.0: C2 (mean 4) cut, C1 (mean 3; max 4, min 2) kept:
               C2 returns = its rewards [2, 6] (mean 4); root [-1.25, -2+4] = [-1.25, 2]
        threshold -5: the root (mean -4.5) is cut: returns [-7, -2], one node
"""

from __future__ import annotations

import itertools

import datasets
import pytest
import torch

torch.set_num_threads(1)

from gymnasium.spaces import Text  # noqa: E402
from pettingzoo import ParallelEnv  # noqa: E402

from llm_marl.envs import DialogueEnv  # noqa: E402
from llm_marl.learners.config import MAGRPOConfig  # noqa: E402
from llm_marl.learners.tree import RolloutNode, collect_trees, grow_trees, iter_nodes  # noqa: E402
from llm_marl.policies.base import Completion  # noqa: E402
from llm_marl.policies.scripted import ScriptedPolicy  # noqa: E402
from llm_marl.tasks import CooperativeTask  # noqa: E402

OFFSETS = {"x": 0.0, "y": -100.0, "z": -1000.0}


class Arith(CooperativeTask):
    agents = ("a", "b")

    def __init__(self, num_turns: int = 2, done_when_a_says: str | None = None):
        self.num_turns = num_turns
        self.done_when_a_says = done_when_a_says

    def dataset(self, split):
        return datasets.Dataset.from_list([{"name": name} for name in OFFSETS])

    def initial_observations(self, item):
        return {agent: f"{agent}|{item['name']}|start" for agent in self.agents}

    def reward(self, item, actions, history):
        p, q = int(actions["a"]), int(actions["b"])
        t = len(history)
        value = (p * q - 10, p - q, 2 * p - q)[t]
        return float(value) + OFFSETS[item["name"]]

    def transition(self, item, actions, history):
        p, q = actions["a"], actions["b"]
        return {agent: f"{agent}|{item['name']}|prev={p},{q}" for agent in self.agents}

    def is_done(self, item, history):
        return self.done_when_a_says is not None and history[-1].actions["a"] == self.done_when_a_says


def _prev(observation):
    p, q = observation.split("|")[2][len("prev=") :].split(",")
    return int(p), int(q)


def answers_a(observation, n):
    assert n == 2
    if observation.endswith("|start"):
        return ["1", "2"]
    p, q = _prev(observation)
    return [str(q), str(p + q)]


def answers_b(observation, n):
    assert n == 2
    if observation.endswith("|start"):
        return ["3", "4"]
    p, _ = _prev(observation)
    return [str(p), "0"]


class CountingPolicy:
    """Wraps a policy; records the number of observations of every ``sample`` call."""

    def __init__(self, inner):
        self.inner = inner
        self.calls: list[int] = []

    def sample(self, observations, num_samples):
        self.calls.append(len(observations))
        return self.inner.sample(observations, num_samples)

    def log_probs(self, observations, completions, reduction="sum"):
        return self.inner.log_probs(observations, completions, reduction)

    def parameters(self):
        return self.inner.parameters()


def policies():
    return {"a": CountingPolicy(ScriptedPolicy(answers_a)), "b": CountingPolicy(ScriptedPolicy(answers_b))}


def grow(num_turns=2, indices=(0,), task=None, **kwargs):
    env = DialogueEnv(task or Arith(num_turns))
    kwargs.setdefault("num_samples", 2)
    return grow_trees(env, policies(), list(indices), num_turns=num_turns, **kwargs)


def texts(node, agent):
    return [c.text for c in node.completions[agent]]


# --- returns against the hand computation -------------------------------------------------------


@pytest.mark.parametrize("discount, expected", [(1.0, [-4.0, 2.0]), (0.5, [-5.5, 0.0])])
def test_aligned_two_turns(discount, expected):
    [root] = grow(2, joint_mode="aligned", discount=discount)
    assert root.joint == [(0, 0), (1, 1)]
    assert root.rewards == [-7.0, -2.0]
    assert root.returns == pytest.approx(expected)
    c1, c2 = root.children
    assert texts(c1, "a") == ["3", "4"] and texts(c1, "b") == ["1", "0"]
    assert texts(c2, "a") == ["4", "6"] and texts(c2, "b") == ["2", "0"]
    assert c1.rewards == [2.0, 4.0] and c2.rewards == [2.0, 6.0]
    assert c1.returns == [2.0, 4.0] and c2.returns == [2.0, 6.0]  # leaves: G = r
    # aligned: each agent's answer k gets G_k
    assert root.agent_returns("a") == pytest.approx(expected)
    assert root.agent_returns("b") == pytest.approx(expected)


CROSS_RETURNS = {1.0: [-4.0, -2.0, -1.0, 2.0], 0.5: [-5.5, -4.0, -2.5, 0.0]}
CROSS_AGENT_RETURNS = {  # gamma = 1
    "sum": {"a": [-6.0, 1.0], "b": [-5.0, 0.0]},
    "mean": {"a": [-3.0, 0.5], "b": [-2.5, 0.0]},
    "max": {"a": [-2.0, 2.0], "b": [-1.0, 2.0]},
}


@pytest.mark.parametrize("joint_mode", ["cross", "crossed"])
@pytest.mark.parametrize("discount", [1.0, 0.5])
def test_cross_two_turns(joint_mode, discount):
    [root] = grow(2, joint_mode=joint_mode, discount=discount)
    assert root.joint == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert root.rewards == [-7.0, -6.0, -4.0, -2.0]
    assert root.returns == pytest.approx(CROSS_RETURNS[discount])
    children = root.children
    assert [texts(c, "a") for c in children] == [["3", "4"], ["4", "5"], ["3", "5"], ["4", "6"]]
    assert [texts(c, "b") for c in children] == [["1", "0"], ["1", "0"], ["2", "0"], ["2", "0"]]
    assert [c.rewards for c in children] == [[2, 3, 3, 4], [3, 4, 4, 5], [1, 3, 3, 5], [2, 4, 4, 6]]
    if discount == 0.5:
        assert root.agent_returns("a") == pytest.approx([-9.5, -2.5])
        assert root.agent_returns("b") == pytest.approx([-8.0, -4.0])
    else:
        assert root.agent_returns("a") == pytest.approx(CROSS_AGENT_RETURNS["sum"]["a"])
        assert root.agent_returns("b") == pytest.approx(CROSS_AGENT_RETURNS["sum"]["b"])
        # a leaf in cross mode: child (1,3) has rewards (3,1) 2, (3,0) 3, (4,1) 3, (4,0) 4
        assert children[0].agent_returns("a") == [5.0, 7.0]
        assert children[0].agent_returns("b") == [5.0, 7.0]


@pytest.mark.parametrize("how", ["sum", "mean", "max"])
def test_cross_aggregation_through_the_config(how):
    args = MAGRPOConfig(
        num_turns=2, num_generations=2, joint_mode="cross", cross_aggregation=how, early_termination_threshold=None
    )
    [root] = collect_trees(DialogueEnv(Arith(2)), policies(), [0], args)
    assert root.returns == pytest.approx(CROSS_RETURNS[1.0])
    assert root.agent_returns("a") == pytest.approx(CROSS_AGENT_RETURNS[how]["a"])
    assert root.agent_returns("b") == pytest.approx(CROSS_AGENT_RETURNS[how]["b"])


# Below the root (leaves, rewards [w, x, y, z] for joints (0,0), (0,1), (1,0), (1,1)):
# agent a's answers aggregate [w, x] and [y, z], agent b's [w, y] and [x, z].
CHILD_AGENT_RETURNS = {
    "sum": [[5, 7], [7, 9], [4, 8], [6, 10]],
    "mean": [[2.5, 3.5], [3.5, 4.5], [2.0, 4.0], [3.0, 5.0]],
    "max": [[3, 4], [4, 5], [3, 5], [4, 6]],
}


@pytest.mark.parametrize("how", ["sum", "mean", "max"])
def test_cross_aggregation_applies_below_the_root(how):
    args = MAGRPOConfig(
        num_turns=2, num_generations=2, joint_mode="cross", cross_aggregation=how, early_termination_threshold=None
    )
    [root] = collect_trees(DialogueEnv(Arith(2)), policies(), [0], args)
    children = root.children
    assert [c.rewards for c in children] == [[2, 3, 3, 4], [3, 4, 4, 5], [1, 3, 3, 5], [2, 4, 4, 6]]
    for child, expected in zip(children, CHILD_AGENT_RETURNS[how]):
        assert child.agent_returns("a") == pytest.approx(expected)
        assert child.agent_returns("b") == pytest.approx(expected)  # this scenario is symmetric below the root


def _shape(node):
    """Everything a tree holds, as plain data (for comparing two trees)."""
    return (
        node.turn,
        node.index,
        dict(node.observations),
        {a: [c.text for c in cs] for a, cs in node.completions.items()},
        list(node.joint),
        list(node.rewards),
        list(node.returns),
        [None if c is None else _shape(c) for c in node.children],
        {a: node.agent_returns(a) for a in node.completions},
    )


@pytest.mark.parametrize("how", ["sum", "mean", "max"])
def test_crossed_is_exactly_cross(how):
    def tree(mode, via_config):
        if via_config:
            args = MAGRPOConfig(
                num_turns=3, num_generations=2, joint_mode=mode, cross_aggregation=how, early_termination_threshold=3.5
            )
            assert args.joint_mode == "cross"
            return collect_trees(DialogueEnv(Arith(3)), policies(), [0, 1], args)
        return grow(3, indices=(0, 1), joint_mode=mode, cross_aggregation=how, early_termination_threshold=3.5)

    for via_config in (False, True):
        assert [_shape(r) for r in tree("crossed", via_config)] == [_shape(r) for r in tree("cross", via_config)]


@pytest.mark.parametrize(
    "discount, threshold, expected_root, c2_expanded",
    [
        (1.0, None, [-1.25, 6.5], True),
        (0.5, None, [-4.8125, 1.125], True),
        (1.0, 4.0, [-1.25, 6.5], True),  # mean 4 is not strictly greater than 4
        (1.0, 3.5, [-1.25, 2.0], False),  # C1: mean 3 kept although its max 4 > 3.5
        (1.0, 3.0, [-1.25, 2.0], False),  # C1: mean 3 not > 3
        (0.5, 3.5, [-7 + 0.5 * 4.375, -2 + 0.5 * 4.0], False),
    ],
)
def test_aligned_three_turns_with_early_termination(discount, threshold, expected_root, c2_expanded):
    [root] = grow(3, joint_mode="aligned", discount=discount, early_termination_threshold=threshold)
    assert root.returns == pytest.approx(expected_root)
    c1, c2 = root.children
    assert [texts(g, "a") for g in c1.children] == [["1", "4"], ["0", "4"]]
    assert [g.rewards for g in c1.children] == [[-1.0, 8.0], [-4.0, 8.0]]
    assert c1.returns == pytest.approx([5.5, 6.0] if discount == 1.0 else [3.75, 5.0])
    assert c2.rewards == [2.0, 6.0]
    if c2_expanded:
        assert [g.rewards for g in c2.children] == [[0.0, 12.0], [-6.0, 12.0]]
        assert c2.returns == pytest.approx([8.0, 9.0] if discount == 1.0 else [5.0, 7.5])
        assert len(list(root.nodes())) == 7
    else:
        assert c2.children == [None, None]
        assert c2.returns == [2.0, 6.0]
        assert len(list(root.nodes())) == 5


def test_early_termination_of_the_root():
    [root] = grow(3, early_termination_threshold=-5.0)  # root mean -4.5 > -5
    assert root.rewards == [-7.0, -2.0]
    assert root.returns == [-7.0, -2.0]
    assert root.children == [None, None]
    assert len(list(root.nodes())) == 1


def test_env_termination_cuts_the_branch():
    # the episode ends after any turn where a says "2": only the root's joint action (2,4)
    [root] = grow(3, task=Arith(3, done_when_a_says="2"))
    c1, c2 = root.children
    assert c2 is None
    assert c1 is not None and c1.returns == pytest.approx([5.5, 6.0])
    assert root.returns == pytest.approx([-7 + 5.75, -2.0])


# --- RolloutNode -------------------------------------------------------------------------------


def test_rollout_node_fields():
    [root] = grow(2, indices=(1,))  # item y
    assert isinstance(root, RolloutNode)
    assert root.turn == 0 and root.index == 1
    assert root.observations == {"a": "a|y|start", "b": "b|y|start"}
    assert set(root.completions) == {"a", "b"}
    assert all(isinstance(c, Completion) for cs in root.completions.values() for c in cs)
    assert texts(root, "a") == ["1", "2"] and texts(root, "b") == ["3", "4"]
    assert root.joint == [(0, 0), (1, 1)]
    assert root.rewards == [-107.0, -102.0]
    # the offset -100 applies at every turn: children mean -100+3 and -100+4
    assert root.returns == pytest.approx([-107.0 - 97.0, -102.0 - 96.0])
    assert len(root.children) == len(root.joint) == len(root.rewards) == len(root.returns)
    child = root.children[1]
    assert child.turn == 1 and child.index == 1
    assert child.observations == {"a": "a|y|prev=2,4", "b": "b|y|prev=2,4"}
    assert child.children == [None, None]  # last turn: not expanded
    assert child.returns == child.rewards == [-98.0, -94.0]


# --- tree sizes, batching, the env passed in ----------------------------------------------------


class Menu(CooperativeTask):
    """Answers from a fixed menu, reward 0; the prompt records the previous joint answer."""

    def __init__(self, agents, num_turns):
        self.agents = tuple(agents)
        self.num_turns = num_turns

    def dataset(self, split):
        return datasets.Dataset.from_list([{"i": i} for i in range(2)])

    def initial_observations(self, item):
        return {a: f"{a}:{item['i']}:" for a in self.agents}

    def reward(self, item, actions, history):
        return 0.0

    def transition(self, item, actions, history):
        joint = ",".join(actions[a] for a in self.agents)
        return {a: f"{a}:{item['i']}:{len(history)}:{joint}" for a in self.agents}


def menu_policy(observation, n):
    return [str(k) for k in range(n)]


SIZE_CASES = [
    (n, mode, k, turns)
    for n in (1, 2, 3)
    for mode in ("aligned", "cross")
    for k, turns in ((2, 3), (3, 3), (3, 1))
    if not (n == 3 and mode == "cross" and k == 3 and turns == 3)  # 757 nodes: too slow for its value
]


@pytest.mark.parametrize("num_agents, joint_mode, k, turns", SIZE_CASES)
def test_tree_size_is_sum_of_branching_powers(num_agents, joint_mode, k, turns):
    agents = [f"g{i}" for i in range(num_agents)]
    env = DialogueEnv(Menu(agents, turns))
    pols = {a: CountingPolicy(ScriptedPolicy(menu_policy)) for a in agents}
    roots = grow_trees(env, pols, [0, 1], num_samples=k, num_turns=turns, joint_mode=joint_mode)
    branching = k if (joint_mode == "aligned" or num_agents == 1) else k**num_agents
    expected = sum(branching**t for t in range(turns))
    for root in roots:
        nodes = list(root.nodes())
        assert len(nodes) == expected
        assert all(len(n.joint) == branching for n in nodes)
        assert all(len(n.completions[a]) == k for n in nodes for a in agents)
    assert len(list(iter_nodes(roots))) == 2 * expected
    # one call per agent per depth, over both trees' open nodes
    for policy in pols.values():
        assert policy.calls == [2 * branching**t for t in range(turns)]


def test_iter_nodes_creation_order():
    roots = grow(2, indices=(0, 2), joint_mode="aligned")
    order = [(n.index, n.turn, n.observations["a"]) for n in iter_nodes(roots)]
    assert order == [
        (0, 0, "a|x|start"),
        (2, 0, "a|z|start"),
        (0, 1, "a|x|prev=1,3"),
        (0, 1, "a|x|prev=2,4"),
        (2, 1, "a|z|prev=1,3"),
        (2, 1, "a|z|prev=2,4"),
    ]


@pytest.mark.parametrize(
    "joint_mode, threshold, calls",
    [
        ("aligned", None, [3, 6, 12]),
        # item x: C2 (mean 4) cut; items y, z: every mean is far below 3.5
        ("aligned", 3.5, [3, 6, 2 + 4 + 4]),
        ("cross", None, [3, 12, 48]),
    ],
)
def test_one_policy_call_per_agent_per_depth(joint_mode, threshold, calls):
    pols = policies()
    roots = grow_trees(
        DialogueEnv(Arith(3)),
        pols,
        [0, 1, 2],
        num_samples=2,
        num_turns=3,
        joint_mode=joint_mode,
        early_termination_threshold=threshold,
    )
    assert pols["a"].calls == calls and pols["b"].calls == calls
    assert len(list(iter_nodes(roots))) == sum(calls)
    # batching does not change the trees: each item grown alone gives the same tree
    for i, root in enumerate(roots):
        [alone] = grow(3, indices=(i,), joint_mode=joint_mode, early_termination_threshold=threshold)
        assert _shape(alone) == _shape(root)


class _StepRecorder:
    stepped: list[int] = []


class RecordingDialogueEnv(DialogueEnv):
    """Records the id of every env object that steps (forks are new objects)."""

    def step(self, actions):
        _StepRecorder.stepped.append(id(self))
        return super().step(actions)

    def step_branches(self, joint_actions):
        _StepRecorder.stepped.append(id(self))
        return super().step_branches(joint_actions)

    def step_rewards(self, joint_actions):
        _StepRecorder.stepped.append(id(self))
        return super().step_rewards(joint_actions)

    def advance(self, scored):
        _StepRecorder.stepped.append(id(self))
        return super().advance(scored)


def test_the_env_passed_in_is_not_stepped():
    _StepRecorder.stepped = []
    env = RecordingDialogueEnv(Arith(3))
    observations, _ = env.reset(options={"index": 2})
    roots = grow_trees(env, policies(), [0, 1], num_samples=2, num_turns=3, joint_mode="cross")
    assert len(list(iter_nodes(roots))) == 2 * 21
    assert _StepRecorder.stepped and id(env) not in _StepRecorder.stepped
    assert env.item_index == 2 and env.history == () and env.turn == 0
    assert env.agents == ["a", "b"]
    # the env can still be played from where it was
    obs, rewards, *_ = env.step({"a": "2", "b": "5"})
    assert rewards == {"a": -1000.0, "b": -1000.0}
    assert observations == {"a": "a|z|start", "b": "b|z|start"}


class CountingGame(ParallelEnv):
    """A plain ParallelEnv (no fork, no step_branches): reward = number of agents saying "1"."""

    metadata = {"name": "counting_game_v0"}

    def __init__(self):
        self.possible_agents = ["p", "q"]
        self.agents = []
        self.steps = 0
        self.resets = 0

    def observation_space(self, agent):
        return Text(16)

    def action_space(self, agent):
        return Text(4)

    def reset(self, seed=None, options=None):
        self.resets += 1
        self.agents = list(self.possible_agents)
        self.t = 0
        return {a: f"{a}@0" for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.steps += 1
        self.t += 1
        value = float(sum(actions[a] == "1" for a in self.agents))
        done = self.t >= 2
        obs = {a: f"{a}@{self.t}:{actions['p']}{actions['q']}" for a in self.agents}
        out = (obs, {a: value for a in self.agents}, {a: done for a in self.agents}, {a: False for a in self.agents})
        infos = {a: {} for a in self.agents}
        if done:
            self.agents = []
        return (*out, infos)


def test_plain_parallel_env_is_forked_by_deepcopy_and_not_stepped():
    env = CountingGame()
    pols = {a: ScriptedPolicy(lambda o, n: ["0", "1"]) for a in env.possible_agents}
    [root] = grow_trees(env, pols, [0], num_samples=2, num_turns=2, joint_mode="cross")
    assert env.steps == 0 and env.resets == 0 and env.agents == []
    # rewards: joint (0,0) 0, (0,1) 1, (1,0) 1, (1,1) 2; every child has the same rewards (mean 1)
    assert root.rewards == [0.0, 1.0, 1.0, 2.0]
    assert root.returns == [1.0, 2.0, 2.0, 3.0]
    assert [c.observations["p"] for c in root.children] == ["p@1:00", "p@1:01", "p@1:10", "p@1:11"]
    assert len(list(root.nodes())) == 5


def test_cross_product_order_is_agent_order():
    env = DialogueEnv(Menu(["u", "v", "w"], 1))
    pols = {a: ScriptedPolicy(menu_policy) for a in ("u", "v", "w")}
    [root] = grow_trees(env, pols, [0], num_samples=2, num_turns=1, joint_mode="cross")
    assert root.joint == list(itertools.product(range(2), repeat=3))

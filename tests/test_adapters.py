"""Numeric adapters (llm_marl/envs/adapters.py) with the real array tooling.

SuperSuit's ``pettingzoo_env_to_vec_env_v1`` / ``concat_vec_envs_v1`` and TorchRL's
``PettingZooWrapper`` cannot step our text spaces (see ANCHORS.md); wrapped, they reset and step
the matrix games with arrays, and every reward is checked against the payoff matrix for the
actions that were actually taken.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
from gymnasium import spaces
from pettingzoo.test import parallel_api_test, parallel_seed_test

from llm_marl.envs import DialogueEnv, make
from llm_marl.envs.adapters import DiscreteMenuWrapper, TokenIdsWrapper, text_id
from llm_marl.learners.tree import grow_trees
from llm_marl.policies.tabular import TabularPolicy
from llm_marl.tasks.matrix import CLIMBING
from toy_tasks import MENU as COLOURS, ColourMatch

torch.set_num_threads(1)

MENU = ("alpha", "beta", "gamma")
WRAPPERS = {
    "menu-ids": lambda env: DiscreteMenuWrapper(env),
    "menu-mask": lambda env: DiscreteMenuWrapper(env, observation="mask"),
    "tokens-text": lambda env: TokenIdsWrapper(env),
    "tokens-menu": lambda env: TokenIdsWrapper(env, menus="task"),
}


def climbing(repeated: bool = False, **kwargs):
    return make("RepeatedClimbingGame-v0" if repeated else "ClimbingGame-v0", **kwargs)


# --- PettingZoo API ---------------------------------------------------------------------------


@pytest.mark.parametrize("repeated", [False, True], ids=["one-shot", "repeated"])
@pytest.mark.parametrize("kind", list(WRAPPERS))
def test_parallel_api(kind, repeated):
    env = WRAPPERS[kind](climbing(repeated))
    parallel_api_test(env, num_cycles=10)
    parallel_seed_test(lambda: WRAPPERS[kind](climbing(repeated)))
    for agent in env.possible_agents:
        assert env.observation_space(agent) is env.observation_space(agent)
        assert env.action_space(agent) is env.action_space(agent)
    observations, _ = env.reset(seed=3)
    for agent, obs in observations.items():
        assert env.observation_space(agent).contains(obs)


def test_menu_wrapper_spaces_and_episode():
    env = DiscreteMenuWrapper(climbing(repeated=True), observation="mask")
    assert env.possible_agents == ["row", "column"]
    assert env.action_space("row") == spaces.Discrete(3)
    assert env.menus == {"row": MENU, "column": MENU}  # the task's menu by default
    obs_space = env.observation_space("row")
    assert obs_space["observation"] == spaces.Box(0, 2**31 - 1, (1,), np.int64)
    assert obs_space["action_mask"] == spaces.Box(0, 1, (3,), np.int8)

    observations, infos = env.reset(options={"index": 0})
    prompts = {a: env.unwrapped._observations[a] for a in env.agents}
    for agent in env.agents:
        assert observations[agent]["observation"].tolist() == [text_id(prompts[agent])]
        assert observations[agent]["action_mask"].tolist() == [1, 1, 1]
    assert infos == {a: {"turn": 0, "index": 0} for a in env.agents}

    for turn, (i, j) in enumerate([(0, 0), (1, 2), (2, 1)]):
        observations, rewards, terms, truncs, infos = env.step({"row": i, "column": np.int64(j)})
        assert rewards == {"row": CLIMBING[i][j], "column": CLIMBING[i][j]}
        assert infos["row"] == {"turn": turn, "index": 0}  # numeric entries only: no text details
        assert env.unwrapped.history[-1].details["joint"] == (MENU[i], MENU[j])
        last = turn == 2
        assert terms == {"row": last, "column": last} and truncs == {"row": False, "column": False}
        mask = [0, 0, 0] if last else [1, 1, 1]
        assert all(observations[a]["action_mask"].tolist() == mask for a in ("row", "column"))
    assert env.agents == []


def test_ids_are_stable_and_stateless():
    a, b = DiscreteMenuWrapper(climbing(True)), DiscreteMenuWrapper(climbing(True))
    obs_a, _ = a.reset(options={"index": 0})
    obs_b, _ = copy.deepcopy(b).reset(options={"index": 0})
    assert {k: v.tolist() for k, v in obs_a.items()} == {k: v.tolist() for k, v in obs_b.items()}
    assert obs_a["row"].tolist() != obs_a["column"].tolist()  # different prompts, different ids
    assert text_id("hello") == text_id("hello") != text_id("hello!")
    small = DiscreteMenuWrapper(climbing(), num_ids=5)
    obs, _ = small.reset()
    assert all(0 <= v[0] < 5 for v in obs.values())
    assert small.observation_space("row").high.tolist() == [4]


def test_custom_menus_and_errors():
    env = DiscreteMenuWrapper(climbing(), menus={"row": ["Gamma", "alpha"], "column": ["beta"]})
    assert env.action_space("row") == spaces.Discrete(2) and env.action_space("column") == spaces.Discrete(1)
    env.reset()
    _, rewards, *_ = env.step({"row": 0, "column": np.array([0])})  # "Gamma" is read as gamma
    assert rewards["row"] == CLIMBING[2][1]
    shared = DiscreteMenuWrapper(climbing(), menus=["beta", "gamma"])
    assert shared.menus == {"row": ("beta", "gamma"), "column": ("beta", "gamma")}

    env = DiscreteMenuWrapper(climbing())
    env.reset()
    for bad in ("alpha", 3, -1, True, 1.0, np.array([0, 1])):
        with pytest.raises(ValueError, match="action of agent 'row'"):
            env.step({"row": bad, "column": 0})
    with pytest.raises(ValueError, match="unknown agent"):
        env.step({"row": 0, "column": 0, "referee": 0})
    with pytest.raises(ValueError, match="observation must be one of"):
        DiscreteMenuWrapper(climbing(), observation="text")
    with pytest.raises(ValueError, match="menus are for agents"):
        DiscreteMenuWrapper(climbing(), menus={"row": MENU})
    with pytest.raises(ValueError, match="repeated answers"):
        DiscreteMenuWrapper(climbing(), menus=["alpha", "alpha"])
    with pytest.raises(ValueError, match="menus must be a dict"):
        DiscreteMenuWrapper(climbing(), menus="alpha")
    with pytest.raises(ValueError, match="non-empty sequence of strings"):
        DiscreteMenuWrapper(climbing(), menus={"row": MENU, "column": []})
    with pytest.raises(ValueError, match="rejects"):
        DiscreteMenuWrapper(climbing(), menus=["alpha", "x" * 2_000_000])
    with pytest.raises(ValueError, match="has no `menu`"):
        DiscreteMenuWrapper(DialogueEnv(ColourMatch()))
    colours = DiscreteMenuWrapper(DialogueEnv(ColourMatch()), menus=COLOURS)
    assert colours.action_space("left") == spaces.Discrete(3) and len(colours.data) == 4


def test_task_is_not_forwarded_but_data_is():
    env = DiscreteMenuWrapper(climbing())
    with pytest.raises(AttributeError, match="unwrapped.task"):
        env.task  # noqa: B018 - a trainer rebuilding an env from .task would lose the wrapper
    assert env.unwrapped.task.menu == MENU
    assert len(env.data) == 1 and env.render_mode is None
    assert env.metadata["name"] == "ClimbingGame_v0_menu"


def test_fork_and_step_branches():
    env = DiscreteMenuWrapper(climbing(repeated=True))
    start, _ = env.reset(options={"index": 0})
    joint = [{"row": i, "column": j} for i in range(3) for j in range(3)]
    branches = env.step_branches(joint)
    assert [b.rewards["row"] for b in branches] == [CLIMBING[i][j] for i in range(3) for j in range(3)]
    for b, actions in zip(branches, joint):
        assert type(b.env) is DiscreteMenuWrapper and b.env.unwrapped is not env.unwrapped
        assert b.env.unwrapped.history[-1].actions == {a: MENU[actions[a]] for a in actions}
        assert b.env.observation_space("row").contains(b.observations["row"])
    assert env.unwrapped.turn == 0  # the parent is untouched
    twin = env.fork()
    twin.step({"row": 1, "column": 1})
    assert twin.unwrapped.turn == 1 and env.unwrapped.turn == 0
    again, *_ = env.step({"row": 1, "column": 1})
    assert {a: v.tolist() for a, v in again.items()} == {a: v.tolist() for a, v in branches[4].observations.items()}
    assert all(again[a].tolist() != start[a].tolist() for a in again)


def test_learner_tree_on_wrappers():
    """The rollout tree forks and branches the wrappers: ints for Discrete menus, text otherwise."""
    for env, actions in (
        (DiscreteMenuWrapper(climbing(repeated=True)), list(range(3))),
        (TokenIdsWrapper(climbing(repeated=True)), list(MENU)),
    ):
        policies = {a: TabularPolicy(actions) for a in env.possible_agents}
        [root] = grow_trees(env, policies, [0], num_samples=2, num_turns=2, joint_mode="cross", seed=1)
        for node in root.nodes():
            for j, combo in enumerate(node.joint):
                i_row = policies["row"].action_of(node.completions["row"][combo[0]])
                i_col = policies["column"].action_of(node.completions["column"][combo[1]])
                assert node.rewards[j] == CLIMBING[i_row][i_col]
        assert len(list(root.nodes())) == 1 + 4
        assert env.unwrapped.turn == 0 and env.unwrapped.agents == []  # never stepped itself


# --- token ids ---------------------------------------------------------------------------------


def test_token_ids_round_trip_bytes():
    env = TokenIdsWrapper(climbing(), max_length=8)
    assert env.observation_space("row") == spaces.Box(0, 255, (8,), np.int64)
    assert env.encode("hi").tolist() == [104, 105, 0, 0, 0, 0, 0, 0]
    assert env.decode(env.encode("hi")) == "hi"
    assert env.encode("é!").tolist()[:3] == [0xC3, 0xA9, 33]
    assert env.decode(env.encode("é!")) == "é!"
    assert env.encode("0123456789").tolist() == list(b"23456789")  # keeps the newest text
    right = TokenIdsWrapper(climbing(), max_length=8, truncation_side="right")
    assert right.encode("0123456789").tolist() == list(b"01234567")
    assert env.action_space("row") is env.unwrapped.action_space("row")  # text actions pass through
    env.reset()
    _, rewards, *_ = env.step({"row": "beta", "column": "beta"})
    assert rewards["row"] == CLIMBING[1][1]
    with pytest.raises(ValueError, match="max_length"):
        TokenIdsWrapper(climbing(), max_length=0)


def test_token_ids_with_a_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1, "hello": 2, "world": 3, ".": 4}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", unk_token="<unk>")
    env = TokenIdsWrapper(climbing(), tokenizer=tokenizer, max_length=4)
    assert env.observation_space("row") == spaces.Box(0, 4, (4,), np.int64)
    assert env.encode("hello world.").tolist() == [2, 3, 4, 0]
    assert env.encode("world hello hello world .").tolist() == [2, 2, 3, 4]
    assert env.decode([2, 3, 0, 0]) == "hello world"


# --- SuperSuit ---------------------------------------------------------------------------------


def test_supersuit_vector_env_one_shot():
    import supersuit as ss

    vec = ss.pettingzoo_env_to_vec_env_v1(DiscreteMenuWrapper(climbing()))
    assert vec.num_envs == 2  # one vector slot per agent: row, column
    obs, infos = vec.reset(seed=0)
    assert obs.shape == (2, 1) and obs.dtype == np.int64 and infos[0] == {"turn": 0, "index": 0}
    for i in range(3):
        for j in range(3):
            obs2, rewards, terms, truncs, infos = vec.step(np.array([i, j]))
            assert rewards.tolist() == [CLIMBING[i][j]] * 2
            assert terms.tolist() == [1, 1] and truncs.tolist() == [0, 0]
            assert obs2.tolist() == obs.tolist()  # finished, so auto-reset to the first prompts
            assert "terminal_observation" in infos[0]


def test_supersuit_vector_env_repeated_with_masks():
    import supersuit as ss

    env = DiscreteMenuWrapper(climbing(repeated=True), observation="mask")
    vec = ss.pettingzoo_env_to_vec_env_v1(env)
    obs, _ = vec.reset(seed=0)
    assert obs["observation"].shape == (2, 1) and obs["action_mask"].tolist() == [[1, 1, 1]] * 2
    plays = [(0, 0), (1, 1), (2, 0), (0, 1)]  # the 4th step is the first of a new episode
    for turn, (i, j) in enumerate(plays):
        obs, rewards, terms, _, _ = vec.step(np.array([i, j]))
        assert rewards.tolist() == [CLIMBING[i][j]] * 2
        assert terms.tolist() == [int(turn == 2)] * 2
    assert env.unwrapped.turn == 1 and env.unwrapped.history[0].actions == {"row": "alpha", "column": "beta"}


def test_supersuit_concat_vec_envs():
    import supersuit as ss

    vec = ss.pettingzoo_env_to_vec_env_v1(DiscreteMenuWrapper(climbing(repeated=True)))
    vecs = ss.concat_vec_envs_v1(vec, 2, num_cpus=0, base_class="gymnasium")  # 2 pickled copies
    obs, _ = vecs.reset(seed=0)
    assert obs.shape == (4, 1)
    actions = np.array([0, 0, 1, 2])  # copy 0: (alpha, alpha); copy 1: (beta, gamma)
    _, rewards, terms, _, _ = vecs.step(actions)
    assert rewards.tolist() == [CLIMBING[0][0]] * 2 + [CLIMBING[1][2]] * 2
    assert terms.tolist() == [False] * 4


# --- TorchRL -----------------------------------------------------------------------------------


def torchrl_env(env):
    from torchrl.envs import PettingZooWrapper

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="PettingZoo in TorchRL is tested")
        # Parallel or AEC is read from the env's type; `parallel=` is a PettingZooEnv argument.
        return PettingZooWrapper(env)


def check_rewards(td):
    """Each step's reward is the payoff of the actions taken at that step, for both agents."""
    rows, cols = td["row", "action"].reshape(-1).tolist(), td["column", "action"].reshape(-1).tolist()
    for agent in ("row", "column"):
        rewards = td["next", agent, "reward"].reshape(-1).tolist()
        assert rewards == [CLIMBING[i][j] for i, j in zip(rows, cols)]
    return rows, cols


@pytest.mark.parametrize("observation", ["ids", "mask"])
def test_torchrl_rollout_repeated(observation):
    torch.manual_seed(0)
    env = torchrl_env(DiscreteMenuWrapper(climbing(repeated=True), observation=observation))
    assert env.parallel and set(env.group_map) == {"row", "column"}
    td = env.rollout(7, break_when_any_done=False)  # 3-turn episodes, auto-reset between them
    assert td.batch_size == torch.Size([7])
    rows, cols = check_rewards(td)
    assert td["next", "done"].reshape(-1).tolist() == [False, False, True, False, False, True, False]
    history = [turn.actions for turn in env._env.unwrapped.history]  # the episode in progress
    assert history == [{"row": MENU[rows[6]], "column": MENU[cols[6]]}]
    if observation == "mask":
        assert td["row", "action_mask"].all()


def test_torchrl_rollout_one_shot_stops_when_done():
    torch.manual_seed(1)
    env = torchrl_env(DiscreteMenuWrapper(climbing()))
    td = env.rollout(5)
    assert td.batch_size == torch.Size([1]) and td["next", "done"].all()
    check_rewards(td)


def test_torchrl_token_ids():
    torch.manual_seed(2)
    wrapped = TokenIdsWrapper(climbing(repeated=True), max_length=128, menus="task")
    env = torchrl_env(wrapped)
    td = env.rollout(3)
    rows, cols = check_rewards(td)
    obs = td["next", "row", "observation"]
    assert obs.shape == (3, 1, 128) and obs.dtype == torch.int64
    assert f"Your partner said: {MENU[cols[0]]}." in wrapped.decode(obs[0, 0].numpy())

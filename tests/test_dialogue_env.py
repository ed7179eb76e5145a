"""DialogueEnv, the matrix games and FunctionTask: behaviour, branching and error handling."""

from __future__ import annotations

import math
import re

import datasets
import pytest

from llm_marl.envs import Branch, DialogueEnv, make
from llm_marl.tasks import CooperativeTask, FunctionTask, TaskError, Turn
from llm_marl.tasks.matrix import MatrixGame, penalty_matrix

# --- helpers --------------------------------------------------------------------------------------


class Relay(CooperativeTask):
    """Three turns over a 6-row dataset; counts its calls; ends early when the solver says "stop"."""

    agents = ("asker", "solver")
    num_turns = 3

    def __init__(self):
        self.calls = {"reward": 0, "rewards": 0, "transition": 0}

    def dataset(self, split):
        return datasets.Dataset.from_list([{"topic": f"topic {i}", "n": i} for i in range(6)])

    def initial_observations(self, item):
        return {"asker": f"Ask about {item['topic']}", "solver": f"Answer about {item['topic']}"}

    def reward(self, item, actions, history):
        self.calls["reward"] += 1
        value = len(actions["asker"]) + 10 * len(actions["solver"]) + 100 * len(history) + 1000 * item["n"]
        return float(value), {"turn_seen": len(history), "solver": actions["solver"]}

    def rewards(self, item, joint_actions, history):
        self.calls["rewards"] += 1
        return super().rewards(item, joint_actions, history)

    def transition(self, item, actions, history):
        self.calls["transition"] += 1
        return {
            "asker": f"[{len(history)}] solver said {actions['solver']}",
            "solver": f"[{len(history)}] asker said {actions['asker']}",
        }

    def is_done(self, item, history):
        return history[-1].actions["solver"] == "stop"


def relay_env(**kwargs):
    return DialogueEnv(Relay(), render_mode="ansi", **kwargs)


def state(env):
    """Everything observable about an env's state (render shows the prompts to play)."""
    return (list(env.agents), env.history, env.turn, env.item_index, env.render())


def joint(asker, solver):
    return {"asker": asker, "solver": solver}


# --- a custom task written in under 30 lines runs through the env ---------------------------------


class Guess(CooperativeTask):  # the whole task: 16 lines
    agents = ("hinter", "guesser")
    num_turns = 2

    def dataset(self, split):
        return datasets.Dataset.from_list([{"word": "apple", "hint": "red fruit"}])

    def initial_observations(self, item):
        return {"hinter": f"Give a hint for {item['word']}", "guesser": "Wait for the hint."}

    def reward(self, item, actions, history):
        return float(actions["guesser"] == item["word"]), {"guess": actions["guesser"]}

    def transition(self, item, actions, history):
        return {"hinter": f"They guessed {actions['guesser']}", "guesser": f"Hint: {actions['hinter']}"}


def test_custom_task_runs_through_the_env():
    env = DialogueEnv(Guess(), render_mode="ansi")
    obs, infos = env.reset(seed=0)
    assert obs == {"hinter": "Give a hint for apple", "guesser": "Wait for the hint."}
    assert infos == {"hinter": {"turn": 0, "index": 0, "acting_agents": ["hinter", "guesser"]}, "guesser": {"turn": 0, "index": 0, "acting_agents": ["hinter", "guesser"]}}
    obs, rew, term, trunc, infos = env.step({"hinter": "red fruit", "guesser": "pear"})
    assert obs == {"hinter": "They guessed pear", "guesser": "Hint: red fruit"}
    assert rew == {"hinter": 0.0, "guesser": 0.0} and not any(term.values())
    obs, rew, term, trunc, infos = env.step({"hinter": "still red", "guesser": "apple"})
    assert rew == {"hinter": 1.0, "guesser": 1.0} and all(term.values()) and not any(trunc.values())
    assert env.agents == [] and obs == {"hinter": "", "guesser": ""}
    assert infos["guesser"] == {"turn": 1, "index": 0, "reward_details": {"guess": "apple"}, "acting_agents": []}


# --- forks ----------------------------------------------------------------------------------------


def test_forks_are_independent_of_parent_and_siblings():
    env = relay_env()
    env.reset(options={"index": 2})
    env.step(joint("q0", "a0"))
    before = state(env)
    left, right = env.fork(), env.fork()
    assert state(left) == before == state(right)
    assert left.history is env.history  # cheap: the immutable history is shared, not copied

    obs_left = left.step(joint("left q", "left a"))[0]
    assert state(env) == before and state(right) == before
    obs_right = right.step(joint("right q", "stop"))[0]
    assert state(env) == before
    assert obs_left["asker"] == "[2] solver said left a" and obs_right == {"asker": "", "solver": ""}
    assert right.agents == [] and left.agents == ["asker", "solver"] and env.agents == ["asker", "solver"]
    assert left.history[-1].actions == {"asker": "left q", "solver": "left a"}
    assert right.history[-1].actions == {"asker": "right q", "solver": "stop"}
    assert env.history[-1].actions == {"asker": "q0", "solver": "a0"} and len(env.history) == 1

    # stepping the parent leaves the forks alone; a fork of a fork is independent too
    left_state = state(left)
    grandchild = left.fork()
    env.step(joint("parent q", "parent a"))
    grandchild.step(joint("g", "stop"))
    assert state(left) == left_state
    assert env.history[-1].actions["solver"] == "parent a"

    # a fork can be reset without touching the parent
    left.reset(options={"index": 5})
    assert env.item_index == 2 and left.item_index == 5


def test_forked_rng_is_a_copy():
    env = relay_env()
    env.reset(seed=11)
    fork = env.fork()
    drawn_by_fork = [fork.reset()[1]["asker"]["index"] for _ in range(12)]
    drawn_by_parent = [env.reset()[1]["asker"]["index"] for _ in range(12)]
    assert drawn_by_fork == drawn_by_parent  # same state at fork time, advanced separately
    assert len(set(drawn_by_parent)) > 1


def test_returned_dicts_are_copies():
    env = relay_env()
    obs, infos = env.reset(options={"index": 0})
    obs["asker"] = "tampered"
    infos["asker"]["turn"] = 99
    assert "tampered" not in env.render()
    out = env.step(joint("q", "a"))
    out[0]["asker"] = "tampered"
    out[4]["asker"]["reward_details"]["solver"] = "tampered"
    assert "tampered" not in env.render() and env.history[-1].details["solver"] == "a"
    with pytest.raises(TypeError):
        env.history[-1].details["solver"] = "x"  # turns are read-only


# --- step_branches --------------------------------------------------------------------------------


def test_step_branches_equals_forks_stepped_one_by_one():
    env = relay_env()
    env.reset(options={"index": 3})
    env.step(joint("first", "answer"))
    before = state(env)
    joints = [joint("a", "b"), joint("longer question", "stop"), joint("", "日本語")]

    env.task.calls.update(reward=0, rewards=0, transition=0)
    branches = env.step_branches(joints)
    assert env.task.calls["rewards"] == 1  # scored together, through the batched rewards
    assert env.task.calls["reward"] == 3  # the default rewards loops over reward
    assert state(env) == before

    assert len(branches) == 3 and all(isinstance(b, Branch) for b in branches)
    for actions, branch in zip(joints, branches):
        fork = env.fork()
        expected = fork.step(actions)
        assert (branch.observations, branch.rewards, branch.terminations, branch.truncations, branch.infos) == expected
        assert state(branch.env) == state(fork)
        assert branch.env is not env
    assert branches[1].env.agents == [] and branches[0].env.agents == ["asker", "solver"]
    assert state(env) == before
    assert len({id(b.env) for b in branches}) == 3


def test_step_branches_validates_every_joint_answer_before_scoring():
    env = relay_env()
    env.reset(options={"index": 0})
    env.task.calls.update(rewards=0)
    with pytest.raises(ValueError, match="solver"):
        env.step_branches([joint("a", "b"), {"asker": "a"}])
    assert env.task.calls["rewards"] == 0
    assert env.step_branches([]) == []
    assert env.task.calls["rewards"] == 0


def test_step_branches_after_the_end_raises():
    env = relay_env()
    with pytest.raises(ValueError, match="reset"):
        env.step_branches([])
    env.reset(options={"index": 0})
    env.step(joint("q", "stop"))
    with pytest.raises(ValueError, match="ended"):
        env.step_branches([joint("a", "b")])


def test_batched_rewards_override_is_used_and_checked():
    class Batched(Relay):
        def rewards(self, item, joint_actions, history):
            self.calls["rewards"] += 1
            return [float(i) for i, _ in enumerate(joint_actions)]

    env = DialogueEnv(Batched())
    env.reset(options={"index": 0})
    branches = env.step_branches([joint("a", "b"), joint("c", "d")])
    assert [b.rewards["asker"] for b in branches] == [0.0, 1.0]
    assert env.step(joint("x", "y"))[1] == {"asker": 0.0, "solver": 0.0}  # step goes through rewards too
    assert env.task.calls == {"reward": 0, "rewards": 2, "transition": 3}

    class Short(Relay):
        def rewards(self, item, joint_actions, history):
            return [1.0]

    env = DialogueEnv(Short())
    env.reset(options={"index": 4})
    with pytest.raises(TaskError, match=r"Short, item 4, turn 0.*one value per joint answer"):
        env.step_branches([joint("a", "b"), joint("c", "d")])
    assert env.turn == 0 and env.agents == ["asker", "solver"]


# --- matrix games ---------------------------------------------------------------------------------

WORDS = ("alpha", "beta", "gamma")
PUBLISHED = {  # Claus & Boutilier (1998); rows = row agent's word, columns = column agent's word
    "ClimbingGame-v0": [[11, -30, 0], [-30, 7, 6], [0, 0, 5]],
    "PenaltyGame-v0": [[10, 0, -10], [0, 2, 0], [-10, 0, 10]],
    "CoordinationGame-v0": [[1.0, 0, 0], [0, 0.6, 0], [0, 0, 0.3]],
}
CELLS = [(i, j) for i in range(3) for j in range(3)]


def payoff(env, i, j, row_word=None, column_word=None):
    env.reset(options={"index": 0})
    _, rewards, terminations, _, infos = env.step(
        {"row": WORDS[i] if row_word is None else row_word, "column": WORDS[j] if column_word is None else column_word}
    )
    assert rewards["row"] == rewards["column"]
    assert all(terminations.values()) and env.agents == []
    return rewards["row"], infos["row"]["reward_details"]


@pytest.mark.parametrize("env_id", sorted(PUBLISHED))
def test_matrix_payoffs_are_the_published_matrices(env_id):
    env = make(env_id)
    assert env.possible_agents == ["row", "column"] and env.task.num_turns == 1
    for i, j in CELLS:
        value, details = payoff(env, i, j)
        assert value == PUBLISHED[env_id][i][j], (env_id, WORDS[i], WORDS[j])
        assert details == {"joint": (WORDS[i], WORDS[j]), "valid": True}


@pytest.mark.parametrize("k", [-10, -50, 0])
def test_penalty_k_is_configurable(k):
    env = make("PenaltyGame-v0", k=k)
    expected = [[10, 0, k], [0, 2, 0], [k, 0, 10]]
    assert [[payoff(env, i, j)[0] for j in range(3)] for i in range(3)] == expected
    assert penalty_matrix(k) == tuple(tuple(float(v) for v in row) for row in expected)


def test_penalty_k_must_not_be_positive():
    with pytest.raises(ValueError, match="k"):
        penalty_matrix(5)
    with pytest.raises(ValueError):
        make("PenaltyGame-v0", k=1)


def test_answers_ignore_case_and_surrounding_whitespace():
    env = make("ClimbingGame-v0")
    assert payoff(env, 0, 0, "  ALPHA\n", "Alpha") == (11.0, {"joint": ("alpha", "alpha"), "valid": True})


@pytest.mark.parametrize(
    "env_id, minimum", [("ClimbingGame-v0", -30.0), ("PenaltyGame-v0", -10.0), ("CoordinationGame-v0", 0.0)]
)
@pytest.mark.parametrize("row, column", [("delta", "alpha"), ("alpha", "alpha beta"), ("", ""), ("alpha.", "beta")])
def test_invalid_answers_get_the_invalid_reward(env_id, minimum, row, column):
    value, details = payoff(make(env_id), 0, 0, row, column)
    assert value == minimum  # default invalid_reward: the matrix minimum
    assert details["valid"] is False
    value, _ = payoff(make(env_id, invalid_reward=-100.0), 0, 0, row, column)
    assert value == -100.0


def test_penalty_invalid_reward_follows_k():
    assert payoff(make("PenaltyGame-v0", k=-50), 0, 0, "nope", "alpha")[0] == -50.0


def test_custom_menu_and_payoff_validation():
    game = MatrixGame([[1, 0], [0, 2]], menu=("Left", "Right"), name="Tiny")
    env = DialogueEnv(game)
    obs, _ = env.reset()
    assert "left, right" in obs["row"]
    assert env.step({"row": "right", "column": "RIGHT"})[1]["row"] == 2.0
    with pytest.raises(ValueError):
        MatrixGame([[1, 0], [0, 2]])  # 2x2 payoff for a 3-word menu
    with pytest.raises(ValueError):
        MatrixGame([[1]], menu=("a",), num_turns=0)


def test_repeated_game_shows_the_partners_previous_answer():
    env = make("RepeatedClimbingGame-v0", render_mode="ansi")
    assert env.task.num_turns == 3
    obs, _ = env.reset(seed=0)
    assert "Round 1 of 3" in obs["row"]
    obs, rewards, terms, _, infos = env.step({"row": "alpha", "column": " Beta "})
    assert rewards == {"row": -30.0, "column": -30.0} and not any(terms.values())
    assert "Round 2 of 3" in obs["row"]
    assert "Your partner said: beta." in obs["row"] and "Your partner said: alpha." in obs["column"]
    obs, rewards, terms, _, _ = env.step({"row": "gamma", "column": ""})
    assert rewards["row"] == -30.0  # invalid (empty) answer
    assert "Your partner said: (nothing)." in obs["row"] and "Your partner said: gamma." in obs["column"]
    assert "Round 3 of 3" in obs["column"]
    obs, rewards, terms, _, infos = env.step({"row": "alpha", "column": "alpha"})
    assert rewards["column"] == 11.0 and all(terms.values()) and env.agents == []
    assert infos["row"]["turn"] == 2
    assert [turn.reward for turn in env.history] == [-30.0, -30.0, 11.0]


@pytest.mark.parametrize("name", ["Climbing", "Penalty", "Coordination"])
def test_repeated_ids_play_three_turns_and_num_turns_is_configurable(name):
    assert make(f"Repeated{name}Game-v0").task.num_turns == 3
    assert make(f"Repeated{name}Game-v0", num_turns=5).task.num_turns == 5
    assert make(f"{name}Game-v0").task.num_turns == 1


# --- episode flow, infos and rendering ------------------------------------------------------------


def test_terminates_after_num_turns_and_removes_agents_in_the_same_step():
    env = relay_env()
    obs, infos = env.reset(options={"index": 1})
    both = ["asker", "solver"]
    assert infos == {"asker": {"turn": 0, "index": 1, "acting_agents": both}, "solver": {"turn": 0, "index": 1, "acting_agents": both}}
    for t in range(3):
        assert env.turn == t and env.agents == ["asker", "solver"]
        obs, rewards, terms, truncs, infos = env.step(joint(f"q{t}", f"a{t}"))
        done = t == 2
        assert set(obs) == set(rewards) == set(terms) == set(truncs) == set(infos) == {"asker", "solver"}
        assert all(v is done for v in terms.values()) and not any(truncs.values())
        assert env.agents == ([] if done else ["asker", "solver"])
        expected_reward = 2 + 10 * 2 + 100 * t + 1000
        assert rewards == {"asker": expected_reward, "solver": expected_reward}
        for agent in env.possible_agents:
            details = {"turn_seen": t, "solver": f"a{t}"}
            assert infos[agent] == {"turn": t, "index": 1, "reward_details": details, "acting_agents": [] if done else both}
    assert obs == {"asker": "", "solver": ""}
    assert env.task.calls["transition"] == 2  # never called after the final turn
    assert [turn.actions["asker"] for turn in env.history] == ["q0", "q1", "q2"]
    assert all(isinstance(turn, Turn) for turn in env.history)


def test_is_done_ends_the_episode_early():
    env = relay_env()
    env.reset(options={"index": 0})
    env.step(joint("q", "a"))
    obs, rewards, terms, truncs, infos = env.step(joint("q", "stop"))
    assert all(terms.values()) and env.agents == [] and obs == {"asker": "", "solver": ""}
    assert env.turn == 2 and infos["asker"]["turn"] == 1
    assert env.task.calls["transition"] == 1


def test_transition_sees_the_history_including_the_turn_just_played():
    seen = []

    class Spy(Relay):
        def transition(self, item, actions, history):
            seen.append((len(history), history[-1].actions["asker"], history[-1].reward))
            return super().transition(item, actions, history)

    env = DialogueEnv(Spy())
    env.reset(options={"index": 0})
    env.step(joint("hi", "x"))
    assert seen == [(1, "hi", 2 + 10)]
    assert env.history[0].observations == {"asker": "Ask about topic 0", "solver": "Answer about topic 0"}


def test_render_ansi_shows_the_dialogue():
    env = relay_env()
    env.reset(options={"index": 2})
    env.step(joint("What is it?", "It is a thing"))
    text = env.render()
    for piece in ["Relay", "item 2", "Ask about topic 2", "What is it?", "It is a thing", "reward: 2141",
                  "[1] asker said What is it?"]:
        assert piece in text, piece
    env.step(joint("q", "stop"))
    final = env.render()
    assert "stop" in final and "(to play)" not in final
    assert DialogueEnv(Relay()).render() is None  # render_mode=None
    with pytest.raises(ValueError, match="render_mode"):
        DialogueEnv(Relay(), render_mode="human")


# --- bad input from the caller: ValueError --------------------------------------------------------


def test_step_before_reset_raises():
    env = relay_env()
    with pytest.raises(ValueError, match=r"reset\(\)"):
        env.step(joint("a", "b"))


def test_step_after_the_end_raises_and_reset_recovers():
    env = relay_env()
    env.reset(options={"index": 0})
    env.step(joint("a", "stop"))
    with pytest.raises(ValueError, match="ended"):
        env.step(joint("a", "b"))
    with pytest.raises(ValueError, match="ended"):
        env.step({})
    env.reset(options={"index": 0})
    assert env.step(joint("a", "b"))[1]["asker"] == 11.0


@pytest.mark.parametrize(
    "actions, pattern",
    [
        ({"asker": "a", "solver": "b", "mallory": "c"}, "mallory"),
        ({"asker": "a", "solver": "b", 7: "c"}, "7"),
        ({"asker": "a"}, "solver"),
        ({}, "asker"),
        ({"asker": "a", "solver": 3}, "solver.*int"),
        ({"asker": None, "solver": "b"}, "asker.*NoneType"),
        ({"asker": b"bytes", "solver": "b"}, "asker.*bytes"),
        ({"asker": ["a"], "solver": "b"}, "asker.*list"),
        (["a", "b"], "dict"),
        ("ab", "dict"),
    ],
)
def test_bad_actions_raise_value_error_naming_the_problem(actions, pattern):
    env = relay_env()
    env.reset(options={"index": 1})
    env.step(joint("q", "a"))
    before = state(env)
    with pytest.raises(ValueError, match=pattern):
        env.step(actions)
    assert state(env) == before
    env.step(joint("q", "a"))  # still usable
    assert env.turn == 2


def test_too_long_actions_are_rejected():
    class Short(Relay):
        max_action_length = 5

    env = DialogueEnv(Short())
    env.reset(options={"index": 0})
    with pytest.raises(ValueError, match="solver.*over the limit of 5"):
        env.step(joint("12345", "123456"))
    env.step(joint("12345", ""))


@pytest.mark.parametrize("index", [-1, 6, 100, True, "1", 1.0, 2.5])
def test_options_index_out_of_range_raises_and_leaves_the_env_unchanged(index):
    env = relay_env()
    env.reset(options={"index": 3})
    env.step(joint("q", "a"))
    before = state(env)
    with pytest.raises(ValueError, match=r"options\['index'\].*\[0, 6\)"):
        env.reset(seed=1, options={"index": index})
    assert state(env) == before


def test_bad_tasks_are_rejected_at_construction():
    class Empty(Relay):
        def dataset(self, split):
            return datasets.Dataset.from_list([])

    with pytest.raises(ValueError, match="Empty.*no rows"):
        DialogueEnv(Empty())

    class NoAgents(Relay):
        agents = ()

    class Twins(Relay):
        agents = ("a", "a")

    class ZeroTurns(Relay):
        num_turns = 0

    for task, pattern in ((NoAgents(), "agents"), (Twins(), "distinct"), (ZeroTurns(), "num_turns")):
        with pytest.raises(ValueError, match=pattern):
            DialogueEnv(task)


# --- a faulty task: TaskError naming task, item and turn; env unchanged ---------------------------


class Faulty(Relay):
    """Misbehaves in one way (``fault``) at turn ``at`` until ``fault`` is cleared."""

    name = "FaultyTask"

    def __init__(self, fault, at=1):
        super().__init__()
        self.fault, self.at = fault, at

    def initial_observations(self, item):
        if self.fault == "init raises":
            raise RuntimeError("no prompt today")
        if self.fault == "init wrong agents":
            return {"asker": "x"}
        return super().initial_observations(item)

    def reward(self, item, actions, history):
        value = super().reward(item, actions, history)
        if len(history) != self.at:
            return value
        return {
            "reward raises": lambda: 1 / 0,
            "nan": lambda: math.nan,
            "inf": lambda: -math.inf,
            "nan in tuple": lambda: (math.nan, {}),
            "string": lambda: "1.0",
            "bool": lambda: True,
            "none": lambda: None,
            "bad details": lambda: (1.0, ["not", "a", "dict"]),
            "triple": lambda: (1.0, {}, {}),
        }.get(self.fault, lambda: value)()

    def transition(self, item, actions, history):
        prompts = super().transition(item, actions, history)
        if len(history) - 1 != self.at:  # history includes the turn just played
            return prompts
        return {
            "transition raises": lambda: {}["missing"],
            "missing agent": lambda: {"asker": "x"},
            "extra agent": lambda: {**prompts, "eve": "x"},
            "non-string": lambda: {"asker": "x", "solver": 42},
            "not a dict": lambda: ["x", "y"],
        }.get(self.fault, lambda: prompts)()

    def is_done(self, item, history):
        if self.fault == "is_done raises" and len(history) - 1 == self.at:
            raise KeyError("done?")
        return super().is_done(item, history)


STEP_FAULTS = {
    "reward raises": "ZeroDivisionError",
    "nan": "nan",
    "inf": "-inf",
    "nan in tuple": "nan",
    "string": "str",
    "bool": "bool",
    "none": "NoneType",
    "bad details": "number, dict",
    "triple": "number, dict",
    "transition raises": "transition raised KeyError",
    "missing agent": r"transition must return one prompt per agent.*\['asker'\]",
    "extra agent": "transition must return one prompt per agent.*eve",
    "non-string": "transition gave agent 'solver' a int",
    "not a dict": "transition must return one prompt per agent.*list",
    "is_done raises": "is_done raised KeyError",
}


@pytest.mark.parametrize("fault", sorted(STEP_FAULTS))
def test_task_faults_raise_task_error_and_leave_the_env_unchanged(fault):
    env = DialogueEnv(Faulty(fault), render_mode="ansi")
    env.reset(options={"index": 4})
    env.step(joint("q0", "a0"))  # turn 0 is fine
    before = state(env)
    with pytest.raises(TaskError) as caught:
        env.step(joint("q1", "a1"))
    message = str(caught.value)
    assert "task FaultyTask, item 4, turn 1" in message
    assert re.search(STEP_FAULTS[fault], message), message
    assert state(env) == before

    # the same fault through step_branches leaves the parent unchanged too
    with pytest.raises(TaskError, match="FaultyTask, item 4, turn 1"):
        env.step_branches([joint("b", "c"), joint("d", "e")])
    assert state(env) == before

    # the env is still usable: fix the task and continue from the same state, or reset
    env.task.fault = None
    env.step(joint("q1", "a1"))
    assert env.turn == 2 and env.history[1].actions["asker"] == "q1"
    env.task.fault = fault
    env.reset(options={"index": 0})
    assert env.turn == 0


def test_exceptions_from_the_task_are_chained():
    env = DialogueEnv(Faulty("reward raises", at=0))
    env.reset(options={"index": 0})
    with pytest.raises(TaskError) as caught:
        env.step(joint("a", "b"))
    assert isinstance(caught.value.__cause__, ZeroDivisionError)
    assert isinstance(caught.value, RuntimeError)  # TaskError is not a ValueError: not the caller's fault
    assert not isinstance(caught.value, ValueError)


@pytest.mark.parametrize("fault, pattern", [("init raises", "initial_observations raised RuntimeError"),
                                            ("init wrong agents", "initial_observations must return one prompt per agent")])
def test_faulty_reset_raises_task_error_and_leaves_the_env_unchanged(fault, pattern):
    env = DialogueEnv(Faulty(None), render_mode="ansi")
    env.reset(options={"index": 1})
    env.step(joint("q", "a"))
    before = state(env)
    env.task.fault = fault
    with pytest.raises(TaskError, match=f"task FaultyTask, item 3, turn 0: {pattern}"):
        env.reset(options={"index": 3})
    assert state(env) == before
    with pytest.raises(TaskError):
        env.reset(seed=5)
    assert state(env) == before
    env.task.fault = None
    env.step(joint("q", "a"))  # continues the old episode
    assert env.turn == 2
    env.reset(options={"index": 3})
    assert env.item_index == 3


def test_failed_unseeded_reset_does_not_advance_the_rng():
    env, twin = DialogueEnv(Faulty(None)), DialogueEnv(Faulty(None))
    env.reset(seed=9)
    twin.reset(seed=9)
    env.task.fault = "init raises"
    with pytest.raises(TaskError):
        env.reset()
    env.task.fault = None
    assert [env.reset()[1]["asker"]["index"] for _ in range(8)] == [twin.reset()[1]["asker"]["index"] for _ in range(8)]


def test_observations_over_the_space_limit_are_task_errors():
    class Verbose(Relay):
        max_observation_length = 10

    with pytest.raises(TaskError, match="over the observation limit of 10"):
        DialogueEnv(Verbose()).reset(options={"index": 0})


# --- FunctionTask: CoMLRL's call conventions ------------------------------------------------------

ROWS = [{"prompt": "Write a haiku", "topic": "sea"}, {"prompt": "Write a limerick", "topic": "cat"}]


def test_function_task_reward_conventions():
    calls = []

    def reward_func(first, second):  # no batch_items parameter: it must not be passed
        calls.append((first, second))
        return [len(first[0]) + 2 * len(second[0])]

    task = FunctionTask(reward_func, lambda item: item["prompt"], dataset=ROWS, reward_processor=lambda r: r / 2)
    env = DialogueEnv(task)
    assert env.possible_agents == ["agent_0", "agent_1"] and task.num_turns == 1
    obs, _ = env.reset(options={"index": 1})
    assert obs == {"agent_0": "Write a limerick", "agent_1": "Write a limerick"}
    _, rewards, terms, _, _ = env.step({"agent_0": "abc", "agent_1": "de"})
    assert calls == [(["abc"], ["de"])]  # positionally, one single-element list per agent
    assert rewards == {"agent_0": 3.5, "agent_1": 3.5}  # the one shared value, then reward_processor
    assert all(terms.values())


@pytest.mark.parametrize("style", ["named", "kwargs"])
def test_function_task_passes_batch_items_when_accepted(style):
    seen = []
    if style == "named":
        def reward_func(a, b, c, batch_items=None):
            seen.append((a, b, c, batch_items))
            return [1.0]
    else:
        def reward_func(*answers, **kwargs):
            seen.append((*answers, kwargs["batch_items"]))
            return [1.0]

    def transition(**kwargs):
        return [f"next {i}" for i in range(3)]

    task = FunctionTask(reward_func, [lambda item: "p0", lambda item: "p1", lambda item: "p2"],
                        transition, ROWS, num_agents=3, num_turns=2)
    env = DialogueEnv(task)
    env.reset(options={"index": 0})
    env.step({"agent_0": "x", "agent_1": "y", "agent_2": "z"})
    env.step({"agent_0": "u", "agent_1": "v", "agent_2": "w"})
    assert seen[0] == (["x"], ["y"], ["z"], [ROWS[0]])
    assert seen[1][3] == [ROWS[0]]  # the reward always sees the original item


def test_function_task_transition_and_formatter_conventions():
    transition_calls, formatter_calls = [], []

    def transition(prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent):
        transition_calls.append(dict(prompt=prompt, agent_completions=agent_completions, num_agents=num_agents,
                                     prompts=prompt_history_per_agent, responses=response_history_per_agent))
        t = len(transition_calls)
        return [f"feedback {t} for A", f"feedback {t} for B"]

    def with_keyword(item, external_prompts=None):
        formatter_calls.append(("A", item["prompt"], external_prompts))
        return f"A<{item['topic']}>: {external_prompts or item['prompt']}"

    def without_keyword(item):
        formatter_calls.append(("B", item["prompt"]))
        return f"B<{item['topic']}>: {item['prompt']}"

    task = FunctionTask(lambda a, b: [0.0], [with_keyword, without_keyword], transition, ROWS, num_turns=3)
    env = DialogueEnv(task)
    obs, _ = env.reset(options={"index": 0})
    assert obs == {"agent_0": "A<sea>: Write a haiku", "agent_1": "B<sea>: Write a haiku"}
    assert formatter_calls == [("A", "Write a haiku", None), ("B", "Write a haiku")]

    obs = env.step({"agent_0": "a1", "agent_1": "b1"})[0]
    assert transition_calls[0] == dict(prompt="Write a haiku", agent_completions=["a1", "b1"], num_agents=2,
                                       prompts=[["A<sea>: Write a haiku"], ["B<sea>: Write a haiku"]],
                                       responses=[["a1"], ["b1"]])
    # at later turns the item's prompt is the transition's text; keyword passed where accepted
    assert formatter_calls[2:] == [("A", "feedback 1 for A", "feedback 1 for A"), ("B", "feedback 1 for B")]
    assert obs == {"agent_0": "A<sea>: feedback 1 for A", "agent_1": "B<sea>: feedback 1 for B"}

    env.step({"agent_0": "a2", "agent_1": "b2"})
    second = transition_calls[1]
    assert second["prompt"] == "Write a haiku"  # the original prompt, not the revised one
    assert second["prompts"] == [["A<sea>: Write a haiku", "A<sea>: feedback 1 for A"],
                                 ["B<sea>: Write a haiku", "B<sea>: feedback 1 for B"]]
    assert second["responses"] == [["a1", "a2"], ["b1", "b2"]]
    *_, terms, _, _ = env.step({"agent_0": "a3", "agent_1": "b3"})
    assert all(terms.values()) and len(transition_calls) == 2


def test_function_task_passthrough_uses_the_transition_text_verbatim():
    formatted = []

    def formatter(item, external_prompts=None):
        formatted.append(external_prompts)
        return "formatted " + item["prompt"]

    task = FunctionTask(lambda a, b: [1.0], formatter, lambda **kw: ["raw A", "raw B"], ROWS,
                        num_turns=2, external_prompt_passthrough=True)
    env = DialogueEnv(task)
    env.reset(options={"index": 1})
    obs = env.step({"agent_0": "x", "agent_1": "y"})[0]
    assert obs == {"agent_0": "raw A", "agent_1": "raw B"}
    assert formatted == [None, None]  # only the initial prompts were formatted


@pytest.mark.parametrize(
    "result, pattern",
    [("0.5", "non-empty list"), ([], "non-empty list"), (None, "non-empty list"), (["x"], "str"),
     ([math.nan], "nan"), ({"r": 1.0}, "non-empty list")],
)
def test_function_task_bad_reward_returns_are_task_errors(result, pattern):
    task = FunctionTask(lambda a, b: result, lambda item: item["prompt"], dataset=ROWS, name="Scripted")
    env = DialogueEnv(task)
    env.reset(options={"index": 1})
    with pytest.raises(TaskError, match=f"task Scripted, item 1, turn 0.*{pattern}"):
        env.step({"agent_0": "x", "agent_1": "y"})
    assert env.agents == ["agent_0", "agent_1"]


def test_function_task_scalar_reward_is_accepted():
    task = FunctionTask(lambda a, b: 0.25, lambda item: "p", dataset=ROWS)
    env = DialogueEnv(task)
    env.reset(options={"index": 0})
    assert env.step({"agent_0": "x", "agent_1": "y"})[1]["agent_0"] == 0.25


@pytest.mark.parametrize(
    "texts, pattern",
    [("one string", "list of 2 strings"), (["only one"], "list of 2 strings"), (["a", "b", "c"], "list of 2 strings"),
     (["a", 7], "int for agent 1"), (None, "list of 2 strings")],
)
def test_function_task_bad_transition_returns_are_task_errors(texts, pattern):
    task = FunctionTask(lambda a, b: [1.0], lambda item: "p", lambda **kw: texts, ROWS, num_turns=2, name="T")
    env = DialogueEnv(task)
    env.reset(options={"index": 0})
    with pytest.raises(TaskError, match=f"task T, item 0, turn 0.*{pattern}"):
        env.step({"agent_0": "x", "agent_1": "y"})
    assert env.turn == 0


def test_function_task_bad_formatter_output_is_a_task_error():
    task = FunctionTask(lambda a, b: [1.0], lambda item, external_prompts=None: 5 if external_prompts else "p",
                        lambda **kw: ["a", "b"], ROWS, num_turns=2, name="F")
    env = DialogueEnv(task)
    env.reset(options={"index": 0})
    with pytest.raises(TaskError, match="task F, item 0, turn 0.*int"):
        env.step({"agent_0": "x", "agent_1": "y"})
    bad_first = FunctionTask(lambda a, b: [1.0], lambda item: None, dataset=ROWS, name="G")
    with pytest.raises(TaskError, match=r"task G, item 1, turn 0.*formatters\[0\] returned NoneType"):
        DialogueEnv(bad_first).reset(options={"index": 1})


def test_function_task_construction_errors():
    fmt = lambda item: "p"  # noqa: E731
    with pytest.raises(ValueError, match="external_transition"):
        FunctionTask(lambda a, b: [1.0], fmt, None, ROWS, num_turns=2)
    with pytest.raises(ValueError, match="formatters"):
        FunctionTask(lambda a, b: [1.0], [fmt, fmt, fmt], dataset=ROWS)
    with pytest.raises(TypeError, match="reward_func"):
        FunctionTask("not callable", fmt, dataset=ROWS)
    with pytest.raises(TypeError, match=r"formatters\[1\]"):
        FunctionTask(lambda a, b: [1.0], [fmt, "nope"], dataset=ROWS)
    with pytest.raises(ValueError, match="num_agents"):
        FunctionTask(lambda: [1.0], fmt, dataset=ROWS, num_agents=0)
    task = FunctionTask(lambda a, b: [1.0], fmt, dataset=ROWS)
    with pytest.raises(ValueError, match="eval"):
        DialogueEnv(task, split="eval")
    with pytest.raises(ValueError, match="split"):
        task.dataset("test")
    with_eval = FunctionTask(lambda a, b: [1.0], fmt, dataset=ROWS, eval_dataset=ROWS[:1])
    assert len(DialogueEnv(with_eval, split="eval").data) == 1
    with pytest.raises(ValueError, match="no rows"):
        DialogueEnv(FunctionTask(lambda a, b: [1.0], fmt, dataset=datasets.Dataset.from_list([])))


# --- the documented example runs ------------------------------------------------------------------


def test_custom_task_example_runs(monkeypatch, capsys):
    import importlib.util
    from pathlib import Path

    from llm_marl.envs import registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # keep its id out of other tests
    path = Path(__file__).resolve().parents[1] / "examples" / "custom_task.py"
    spec = importlib.util.spec_from_file_location("custom_task_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main()
    out = capsys.readouterr().out
    assert "turn 1: reward 1.5" in out and "episode over after 2 of 3 turns" in out
    assert "[editor] says: Fast, quiet, steel" in out and "never played" not in out

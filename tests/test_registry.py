"""The registry: every id that ``llm-marl list`` prints makes and plays a turn; the shipped ids are
entry-point strings imported at make time; users register a task class, a factory or a string in
one call; wrong entry points fail naming the id."""

from __future__ import annotations

import sys
import textwrap

import pettingzoo
import pytest

from llm_marl.cli import main as cli_main
from llm_marl.envs import DialogueEnv, registry
from llm_marl.tasks.code import MAX_SCORE

# The joint answer "alpha" for every agent, and its reward by hand: the matrix games pay
# payoff[alpha][alpha] (the docstring tables); "alpha" is no code, so CoopCode scores 0 and
# pays 0 + reward_shift = -MAX_SCORE; "alpha"/"alpha" fails the writing task's length gate
# (3 words at least), and the gate multiplies the whole reward: 0.
ALPHA_REWARD = {
    "ClimbingGame-v0": 11.0,
    "RepeatedClimbingGame-v0": 11.0,
    "PenaltyGame-v0": 10.0,
    "RepeatedPenaltyGame-v0": 10.0,
    "CoordinationGame-v0": 1.0,
    "RepeatedCoordinationGame-v0": 1.0,
    "CoopCode-v0": -MAX_SCORE,
    "CoopCodeMultiTurn-v0": -MAX_SCORE,
    "WritingCollab-v0": 0.0,
    "WritingCollabMultiTurn-v0": 0.0,
    "NameMatch-v0": 0.0,  # "alpha" names no member of the category
}


def listed_ids(capsys) -> list[str]:
    assert cli_main(["list"]) == 0
    out = capsys.readouterr().out
    block = out.split("environments:\n", 1)[1].split("learners:", 1)[0]
    return [line.strip() for line in block.splitlines() if line.strip()]


@pytest.fixture
def scratch_registry(monkeypatch):
    """Ids registered in a test vanish afterwards, from ours and from PettingZoo's registry."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    before = set(pettingzoo.parallel_registry)
    yield registry
    for env_id in set(pettingzoo.parallel_registry) - before:
        del pettingzoo.parallel_registry[env_id]


def test_every_listed_id_makes_and_plays_one_turn(capsys):
    listed = listed_ids(capsys)
    assert listed == registry.registered_ids() and set(registry.GAMES) <= set(listed)
    ids = [env_id for env_id in listed if env_id not in registry.GAMES and env_id not in registry.PROGRAMS]  # OpenSpiel games: tests/test_openspiel.py; Program-v0: tests/test_programs.py
    assert set(ids) == set(ALPHA_REWARD)
    for env_id in ids:
        env = registry.make(env_id)
        assert isinstance(env, DialogueEnv), env_id
        observations, _ = env.reset(seed=0)
        assert set(observations) == set(env.possible_agents) and all(observations.values()), env_id
        _, rewards, terminations, _, infos = env.step({agent: "alpha" for agent in env.agents})
        assert rewards == {agent: pytest.approx(ALPHA_REWARD[env_id]) for agent in env.possible_agents}, env_id
        assert all(terminations.values()) == (env.task.num_turns == 1), env_id
        assert all(info["turn"] == 0 for info in infos.values()), env_id  # 0-based


def test_shipped_ids_are_the_table_of_entry_point_strings():
    for env_id, (entry_point, defaults) in registry.SHIPPED.items():
        shipped = registry.spec(env_id)
        assert shipped.entry_point == entry_point and entry_point.startswith("llm_marl.tasks.")
        assert shipped.task is True and dict(shipped.kwargs) == defaults


def test_defaults_none_and_max_cycles():
    assert registry.make("RepeatedPenaltyGame-v0").task.num_turns == 3
    assert registry.make("RepeatedPenaltyGame-v0", num_turns=None).task.num_turns == 3
    assert registry.make("RepeatedPenaltyGame-v0", num_turns=2).task.num_turns == 2
    assert registry.make("PenaltyGame-v0", k=-50.0).task.payoff[0][2] == -50.0
    assert registry.make("ClimbingGame-v0", max_cycles=4).task.num_turns == 4
    env = pettingzoo.make("parallel", "RepeatedClimbingGame-v0", render_mode="ansi", split="eval")
    assert env.task.num_turns == 3 and env.render_mode == "ansi" and env.split == "eval"


def test_user_registers_a_task_class_a_factory_or_a_string(scratch_registry, tmp_path, monkeypatch):
    (tmp_path / "user_tasks_for_registry_test.py").write_text(textwrap.dedent("""
        import datasets
        from llm_marl.tasks import CooperativeTask
        from llm_marl.envs import DialogueEnv

        class Echo(CooperativeTask):
            agents = ("a", "b")
            num_turns = 1
            def __init__(self, word="hi"):
                self.word = word
            def dataset(self, split):
                return datasets.Dataset.from_list([{"split": split}])
            def initial_observations(self, item):
                return {agent: f"say {self.word}" for agent in self.agents}
            def reward(self, item, actions, history):
                return float(sum(a == self.word for a in actions.values()))
            def transition(self, item, actions, history):
                return {agent: "" for agent in self.agents}

        def echo_env(**kwargs):
            return DialogueEnv(Echo(), **kwargs)

        def echo_task(word="hi"):
            return Echo(word)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "user_tasks_for_registry_test", raising=False)

    registry.register("EchoByString-v0", "user_tasks_for_registry_test:Echo", kwargs={"word": "yo"})
    assert "user_tasks_for_registry_test" not in sys.modules  # imported at make time, not before
    env = registry.make("EchoByString-v0", split="eval", render_mode="ansi")
    assert env.split == "eval" and env.render_mode == "ansi" and env.task.word == "yo"
    env.reset(seed=0)
    assert env.step({"a": "yo", "b": "no"})[1] == {"a": 1.0, "b": 1.0}

    module = sys.modules["user_tasks_for_registry_test"]
    registry.register("EchoClass-v0", module.Echo)
    assert registry.make("EchoClass-v0", word="x").task.word == "x"
    registry.register("EchoFactory-v0", "user_tasks_for_registry_test:echo_env")
    assert registry.make("EchoFactory-v0", render_mode="ansi").render_mode == "ansi"
    registry.register("EchoTaskFunction-v0", module.echo_task, task=True)
    assert registry.make("EchoTaskFunction-v0", word="z", split="eval").task.word == "z"
    assert pettingzoo.make("parallel", "EchoByString-v0").task.word == "yo"

    # a function that builds a task but was not said to: named, with the fix
    registry.register("EchoUnsaid-v0", module.echo_task)
    with pytest.raises(TypeError, match=r"'EchoUnsaid-v0' returned a task \(Echo\).*task=True"):
        registry.make("EchoUnsaid-v0")


def test_bad_entry_points_fail_naming_the_id(scratch_registry):
    with pytest.raises(ValueError, match=r"'Bad-v0' must look like 'package.module:attribute', got 'no_colon'"):
        registry.register("Bad-v0", "no_colon")
    with pytest.raises(TypeError, match=r"entry point of 'Bad-v0' must be a callable"):
        registry.register("Bad-v0", 42)
    registry.register("Missing-v0", "llm_marl.tasks.matrix:no_such_game")
    with pytest.raises(AttributeError, match=r"'Missing-v0'.*has no attribute 'no_such_game'"):
        registry.make("Missing-v0")
    registry.register("NoModule-v0", "llm_marl.no_such_module:Task")
    with pytest.raises(ImportError, match=r"'NoModule-v0' \(entry point 'llm_marl.no_such_module:Task'\): no module named 'llm_marl.no_such_module' in the current folder"):
        registry.make("NoModule-v0")
    registry.register("NotATask-v0", "llm_marl.tasks.matrix:penalty_matrix", task=True)
    with pytest.raises(TypeError, match=r"'NotATask-v0' was registered as a task but returned tuple"):
        registry.make("NotATask-v0")
    with pytest.raises(ValueError, match="already registered"):
        registry.register("CoopCode-v0", "llm_marl.tasks.code:CoopCodeTask")

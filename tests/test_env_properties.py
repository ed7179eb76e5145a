"""Property-based tests: whatever a caller throws at DialogueEnv, only documented errors come out.

Arbitrary sequences of reset / step / step_branches / fork calls, with arbitrary Unicode answers
(empty included), arbitrary agent sets (subsets and supersets of the real agents, random names)
and arbitrary non-string values, are played against a repeated matrix game and a 3-turn custom
task. A simple model predicts, for every env in the pool (forks included), whether the episode is
live and at which turn; the env must agree with it after every call, raise ValueError exactly
when the call is bad input, and never raise anything else.
"""

from __future__ import annotations

import datasets
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from llm_marl.envs import DialogueEnv, make
from llm_marl.tasks import CooperativeTask


class Chatter(CooperativeTask):
    """Three turns, three agents, two rows; ends early when every agent says the same thing."""

    agents = ("ann", "bob", "cy")
    num_turns = 3

    def dataset(self, split):
        return datasets.Dataset.from_list([{"seed": "tea"}, {"seed": "коты 🐈"}])

    def initial_observations(self, item):
        return {a: f"{a}, talk about {item['seed']}" for a in self.agents}

    def reward(self, item, actions, history):
        lengths = [len(actions[a]) for a in self.agents]
        return sum(lengths) / (1 + len(history)), {"lengths": lengths}

    def transition(self, item, actions, history):
        return {a: " | ".join(f"{b}: {actions[b]}" for b in self.agents if b != a) for a in self.agents}

    def is_done(self, item, history):
        return len(set(history[-1].actions.values())) == 1


def ends_early(kind, actions):
    return kind == "chatter" and len(set(actions.values())) == 1


def build(kind):
    return make("RepeatedClimbingGame-v0", render_mode="ansi") if kind == "matrix" else DialogueEnv(Chatter(), render_mode="ansi")


AGENTS = {"matrix": ("row", "column"), "chatter": ("ann", "bob", "cy")}
ROWS = {"matrix": 1, "chatter": 2}

names = st.one_of(st.sampled_from(["row", "column", "ann", "bob", "cy"]), st.text(max_size=6))
odd_values = st.one_of(
    st.none(), st.integers(), st.floats(), st.binary(max_size=4), st.lists(st.text(max_size=2), max_size=2)
)


@st.composite
def joint_actions(draw, agents):
    """Mostly a valid joint answer; else agents dropped, extra (random) names added, odd values."""
    text = st.one_of(st.text(max_size=40), st.sampled_from(["alpha", "beta", " GAMMA\n", "", "same"]))
    actions = {a: draw(text) for a in agents}
    mode = draw(st.sampled_from(["valid", "valid", "valid", "valid", "same", "drop", "extra", "odd"]))
    if mode == "same":  # every agent says the same thing: the custom task ends early
        actions = {a: "same" for a in agents}
    elif mode == "drop":
        actions = {a: v for a, v in actions.items() if draw(st.booleans())}
    elif mode == "extra":
        for name in draw(st.lists(names, min_size=1, max_size=2)):
            actions[name] = draw(text)
    elif mode == "odd":
        actions[draw(st.sampled_from(agents))] = draw(odd_values)
    return actions


@st.composite
def programs(draw, kind):
    agents = AGENTS[kind]
    ops = [("reset", 0, None, None)] if draw(st.sampled_from([True, True, True, False])) else []
    for _ in range(draw(st.integers(1, 14))):
        op = draw(st.sampled_from(["step", "reset", "step", "step", "step", "fork", "branches", "step"]))
        env_pick = draw(st.integers(0, 100))
        if op == "reset":
            index = draw(st.sampled_from([None, None, 0, 1, "bad"]))
            if index == "bad":
                index = draw(st.one_of(st.integers(-3, 3), st.sampled_from([True, False, "0", 0.0, 1.5])))
            seed = draw(st.one_of(st.none(), st.integers(0, 2**32 - 1)))
            ops.append((op, env_pick, seed, index))
        elif op == "step":
            ops.append((op, env_pick, draw(joint_actions(agents))))
        elif op == "branches":
            ops.append((op, env_pick, draw(st.lists(joint_actions(agents), max_size=3))))
        else:
            ops.append((op, env_pick))
    return ops


class Model:
    """What an env's state should be: live or not, and how many turns were played."""

    def __init__(self, live=False, turn=0, reset=False):
        self.live, self.turn, self.reset = live, turn, reset

    def copy(self):
        return Model(self.live, self.turn, self.reset)


def is_valid(actions, agents):
    return set(actions) == set(agents) and all(isinstance(v, str) for v in actions.values())


def check_step_result(kind, model, result, actions, num_turns, possible):
    obs, rewards, terms, truncs, infos = result
    assert set(obs) == set(rewards) == set(terms) == set(truncs) == set(infos) == set(possible)
    assert len(set(rewards.values())) == 1, "rewards differ across agents"
    assert all(isinstance(r, float) for r in rewards.values())
    assert not any(truncs.values())
    done = model.turn + 1 >= num_turns or ends_early(kind, actions)
    assert all(t is done for t in terms.values())
    assert all(info["turn"] == model.turn and "reward_details" in info for info in infos.values())
    assert all(isinstance(o, str) for o in obs.values()) and (not done or set(obs.values()) == {""})
    model.turn += 1
    model.live = not done


def check_invariants(env, model, possible):
    assert env.turn == model.turn == len(env.history)
    assert (env.agents == list(possible)) == model.live
    assert (env.agents == []) == (not model.live)
    for turn in env.history:
        assert set(turn.actions) == set(possible)
    text = env.render()
    assert isinstance(text, str) and (("(to play)" in text) == model.live)


@pytest.mark.parametrize("kind", ["matrix", "chatter"])
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_only_documented_errors_and_invariants_hold(kind, data):
    ops = data.draw(programs(kind))
    envs, models = [build(kind)], [Model()]
    possible = AGENTS[kind]
    num_turns = envs[0].task.num_turns
    for op, pick, *args in ops:
        i = pick % len(envs)
        env, model = envs[i], models[i]
        others = [(e, m.copy(), e.render()) for j, (e, m) in enumerate(zip(envs, models)) if j != i]
        if op == "reset":
            seed, index = args
            good = index is None or (type(index) is int and 0 <= index < ROWS[kind])
            try:
                obs, infos = env.reset(seed=seed, options=None if index is None else {"index": index})
            except ValueError as exc:
                assert not good, f"valid reset raised {exc!r}"
                assert "index" in str(exc)
            else:
                assert good, f"reset accepted index {index!r}"
                assert set(obs) == set(infos) == set(possible)
                assert all(info == {"turn": 0, "index": env.item_index, "acting_agents": list(possible)} for info in infos.values())
                if index is not None:
                    assert env.item_index == index
                model.live, model.turn, model.reset = True, 0, True
        elif op == "step":
            (actions,) = args
            good = model.live and is_valid(actions, possible)
            try:
                result = env.step(actions)
            except ValueError as exc:
                assert not good, f"valid step raised {exc!r}"
                assert str(exc)
            else:
                assert good, f"step accepted {actions!r} (live={model.live})"
                check_step_result(kind, model, result, actions, num_turns, possible)
        elif op == "branches":
            (joints,) = args
            good = model.live and all(is_valid(a, possible) for a in joints)
            before = env.render()
            try:
                branches = env.step_branches(joints)
            except ValueError:
                assert not good
            else:
                assert good
                assert len(branches) == len(joints)
                for actions, branch in zip(joints, branches):
                    check_step_result(kind, model.copy(), tuple(branch[1:]), actions, num_turns, possible)
                    assert branch.env is not env
            assert env.render() == before  # the parent never moves
        else:  # fork
            good = True
            envs.append(env.fork())
            models.append(model.copy())
        if op != "fork":
            event(f"{kind} {op}: {'accepted' if good else 'ValueError'}")
        check_invariants(env, model, possible)
        # no other env (parent, sibling, fork) was touched by this call
        for other, other_model, rendered in others:
            check_invariants(other, other_model, possible)
            assert other.render() == rendered

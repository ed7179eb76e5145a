"""A fork of an env draws its items from its own generator, a copy of the original's state
(issue 43.4): resetting the fork without an index neither moves the original's next item nor
depends on what the original draws later."""

from __future__ import annotations

import pytest

from llm_marl.envs import make
from llm_marl.envs.dialogue import DialogueEnv
from toy_tasks import ColourMatch


def dialogue():
    return DialogueEnv(ColourMatch(num_items=50, num_turns=1))


def tiny_hanabi():
    pytest.importorskip("pyspiel")
    return make("TinyHanabi-A-v0")


@pytest.mark.parametrize("make_env", [dialogue, tiny_hanabi], ids=["DialogueEnv", "OpenSpielEnv"])
def test_a_forks_resets_leave_the_originals_next_item(make_env):
    plain, forked = make_env(), make_env()
    plain.reset(seed=3)
    forked.reset(seed=3)
    twin = forked.fork()
    twin.reset()
    drawn = [twin.item_index]
    twin.reset()
    drawn.append(twin.item_index)
    plain.reset()
    forked.reset()
    assert forked.item_index == plain.item_index  # the fork's draws did not move the original's generator
    assert drawn[0] == plain.item_index  # the fork drew from a copy of the original's state
    plain.reset()
    assert drawn[1] == plain.item_index

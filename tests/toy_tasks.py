"""Small tasks shared by the trainer tests (imported by test modules, not collected)."""

from __future__ import annotations

import random
from contextlib import contextmanager
from typing import Any, Iterator

import datasets

from llm_marl.tasks.base import CooperativeTask

MENU = ("red", "green", "blue")


class ColourMatch(CooperativeTask):
    """Two agents name a colour; each item has its own target colour and the pair earns one
    point per agent that names it, plus one if they agree. Turn t>0 prompts repeat the partner's
    last word. ``num_items`` items; deterministic."""

    agents = ("left", "right")

    def __init__(self, num_items: int = 4, num_turns: int = 2, fail_on: int | None = None):
        self.num_items = num_items
        self.num_turns = num_turns
        self.fail_on = fail_on

    def dataset(self, split):
        return datasets.Dataset.from_list([{"target": MENU[i % 3], "id": i} for i in range(self.num_items)])

    def initial_observations(self, item):
        return {a: f"item {item['id']}: {a}, name a colour" for a in self.agents}

    def reward(self, item, actions, history):
        if self.fail_on is not None and item["id"] == self.fail_on:
            raise RuntimeError("reward backend unavailable")
        hits = sum(actions[a] == item["target"] for a in self.agents)
        return float(hits + (actions["left"] == actions["right"]))

    def transition(self, item, actions, history):
        partner = {"left": "right", "right": "left"}
        return {a: f"item {item['id']}: partner said {actions[partner[a]]}" for a in self.agents}


class Scheduled(CooperativeTask):
    """Rewards fixed by the turn, whatever is said: ``schedule[t]``; observations "turn t"."""

    agents = ("a", "b")

    def __init__(self, schedule):
        self.schedule = list(schedule)
        self.num_turns = len(self.schedule)

    def dataset(self, split):
        return datasets.Dataset.from_list([{"id": 0}])

    def initial_observations(self, item):
        return {agent: "turn 0" for agent in self.agents}

    def reward(self, item, actions, history):
        return self.schedule[len(history)]

    def transition(self, item, actions, history):
        return {agent: f"turn {len(history)}" for agent in self.agents}  # history holds the turn just played


@contextmanager
def reward_blind_pairs(module: Any, seed: int, blind: bool = True) -> Iterator[None]:
    """The preference learners' reward-blind control: within the block ``module.select_pairs``
    (the learner module's reference to it) sees each item's candidate rewards permuted by a
    ``seed``-ed shuffle, so the chosen pairs no longer follow the reward. ``blind`` False: as is."""
    original = module.select_pairs
    if blind:
        rng = random.Random(seed)

        def shuffled(rewards, *rest):
            permuted = list(rewards)
            rng.shuffle(permuted)
            return original(permuted, *rest)

        module.select_pairs = shuffled
    try:
        yield
    finally:
        module.select_pairs = original

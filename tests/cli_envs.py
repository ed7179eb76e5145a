"""Custom environments for the command-line tests (``tests/test_cli_runs.py``), importable as
``cli_envs`` with ``tests/`` on PYTHONPATH, the way a user's own module would be.

Importing the module registers ``SumTarget-v0`` (the ``--import cli_envs`` way).
"""

from __future__ import annotations

import os
import signal

import datasets

from llm_marl import CooperativeTask, DialogueEnv, make, register


class SumTarget(CooperativeTask):
    """Three agents each say a digit of the menu; the shared reward is 1 when the digits sum to
    the row's target, else 0. One turn; the horizon is fixed (no ``num_turns`` argument)."""

    agents = ("a", "b", "c")
    num_turns = 1
    menu = ("0", "1", "2")

    def dataset(self, split):
        return datasets.Dataset.from_list([{"target": 5}])

    def initial_observations(self, item):
        return {agent: f"Say one digit of 0, 1, 2; the three digits must sum to {item['target']}." for agent in self.agents}

    def reward(self, item, actions, history):
        digits = [actions[agent].strip() for agent in self.agents]
        if not all(d in self.menu for d in digits):
            return 0.0
        return float(sum(int(d) for d in digits) == item["target"])

    def transition(self, item, actions, history):
        return {agent: "again" for agent in self.agents}


def make_sum_target(*, split: str = "train", render_mode: str | None = None) -> DialogueEnv:
    """SumTarget as an env factory (it takes no num_turns)."""
    return DialogueEnv(SumTarget(), split=split, render_mode=render_mode)


def signalling_climb(*, split: str = "train", render_mode: str | None = None, num_turns: int | None = None) -> DialogueEnv:
    """ClimbingGame-v0 whose train env sends this process the signals named in the environment
    variable LLM_MARL_TEST_SIGNALS ("SIGINT@5": SIGINT while scoring batch 5; "SIGINT,SIGINT@5":
    two at once) — a Ctrl-C or a scheduler's SIGTERM in the middle of a batch, deterministically."""
    env = make("ClimbingGame-v0", split=split, render_mode=render_mode, num_turns=num_turns)
    plan = os.environ.get("LLM_MARL_TEST_SIGNALS")
    if plan and split == "train":
        names, _, at = plan.partition("@")
        original, calls = env.task.rewards, [0]

        def rewards(item, joint_actions, history):
            calls[0] += 1
            if calls[0] == int(at):
                for name in names.split(","):
                    os.kill(os.getpid(), getattr(signal, name))
            return original(item, joint_actions, history)

        env.task.rewards = rewards
    return env


register("SumTarget-v0", make_sum_target, override=True)

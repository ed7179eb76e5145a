"""Writing your own cooperative task, and playing one episode of it through the environment.

Two agents write a product blurb together: the "writer" drafts it, the "editor" proposes a
one-line headline. They share one reward per turn: the blurb must mention every keyword of the
product and the headline must be short. After each turn the external transition shows each agent
what the other wrote and which keywords are still missing, so the second turn can fix the first.

Run it with ``python examples/custom_task.py``; it needs no model and no download.
"""

from __future__ import annotations

import datasets

from llm_marl import CooperativeTask, DialogueEnv, make, register


class Blurb(CooperativeTask):
    agents = ("writer", "editor")  # names, in order; every agent acts at every turn
    num_turns = 3  # the horizon H (is_done below may end an episode sooner)

    def dataset(self, split):
        # One row per episode. Ship small data with the code, or build it from an installed package.
        rows = [
            {"product": "a kettle", "keywords": ["fast", "quiet", "steel"]},
            {"product": "a backpack", "keywords": ["light", "waterproof"]},
        ]
        return datasets.Dataset.from_list(rows if split == "train" else rows[:1])

    def initial_observations(self, item):
        keys = ", ".join(item["keywords"])
        return {
            "writer": f"Write a one-sentence blurb for {item['product']} that mentions: {keys}.",
            "editor": f"Write a headline of at most 5 words for {item['product']}.",
        }

    def reward(self, item, actions, history):
        blurb = actions["writer"].lower()
        missing = [k for k in item["keywords"] if k not in blurb]
        coverage = 1 - len(missing) / len(item["keywords"])
        short = len(actions["editor"].split()) <= 5
        # A number, or (number, details): the details land in the history and in the env infos.
        return coverage + (0.5 if short else 0.0), {"missing": missing, "short_headline": short}

    def transition(self, item, actions, history):
        # The external transition: the next prompts. history[-1] is the turn just played.
        missing = history[-1].details["missing"]
        todo = f"Still missing: {', '.join(missing)}." if missing else "All keywords are in."
        return {
            "writer": f"The editor's headline: {actions['editor']!r}. {todo} Rewrite your blurb.",
            "editor": f"The writer's blurb: {actions['writer']!r}. Rewrite your headline to match.",
        }

    def is_done(self, item, history):
        # Optional: stop early once the team earned the maximum.
        return history[-1].reward >= 1.5


def main() -> None:
    # Register a factory under a Gymnasium-style id, then build it by name.
    register("BlurbDemo-v0", lambda **kwargs: DialogueEnv(Blurb(), **kwargs))
    env = make("BlurbDemo-v0", render_mode="ansi")

    observations, infos = env.reset(seed=0, options={"index": 0})  # row 0: the kettle
    answers = [  # fixed answers, one joint answer per turn
        {"writer": "A fast steel kettle.", "editor": "Boil water in a flash, every single morning"},
        {"writer": "A fast, quiet steel kettle.", "editor": "Fast, quiet, steel"},
        {"writer": "never played: is_done ended the episode", "editor": "-"},
    ]
    for actions in answers:
        if not env.agents:
            break
        observations, rewards, terminations, truncations, infos = env.step(actions)
        print(f"turn {infos['writer']['turn']}: reward {rewards['writer']}, details {infos['writer']['reward_details']}")
    print(f"episode over after {env.turn} of {env.task.num_turns} turns; agents left: {env.agents}")
    print()
    print(env.render())


if __name__ == "__main__":
    main()

"""A multi-agent program written only with the ``openai`` client, trained as it is.

A writer drafts a line about a topic; an editor is shown the draft and shortens it. The program
scores the team itself: the edited line should name the topic's words in at most eight words.
Nothing here knows about llm_marl: ``team(item, client)`` is what you would run against any
OpenAI-compatible server. llm_marl hands it a client on a local endpoint where each ``model``
is an agent it trains (docs/programs.md).

From the command (agents and items come from this module)::

    llm-marl train --program examples/program_team.py:team --policy lm --model tiny --learner magrpo \\
        --num_turns 2 --num_generations 2 --max_steps 2 --threads 1

In Python::

    python examples/program_team.py            # a few MAGRPO steps on the tiny model
"""

from __future__ import annotations

agents = ("writer", "editor")
"""The model names the program calls: one trained agent each."""
num_turns = 2
"""The most steps of calls (the writer's, then the editor's)."""
items = [{"topic": topic} for topic in ("the sea", "a small ship", "the weather today", "a story",
                                         "the old forest", "a red apple", "the night sky", "a busy city")]
"""The program's inputs, one rollout each."""
eval_items = [{"topic": topic} for topic in ("the mountain river", "a quiet library", "the winter snow", "a green garden",
                                              "the morning sun", "a lost dog", "the desert wind", "a warm kitchen",
                                              "the empty beach", "a tall tower", "the spring rain", "a new school",
                                              "the dark cave", "a happy child", "the long road", "a small village")]
"""Held-out topics: the eval split (``llm-marl train --program`` and ``program_env`` evaluate on them)."""


SIMPLE_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)
"""A chat template for a model without one (calls are lists of messages)."""


def score(topic: str, edited: str) -> float:
    """From 0 to 1: half for the share of the topic's words the edited line names, half for its
    brevity (all of it up to 8 words, none from 24 words, 1/16 less a word between)."""
    wanted = set(topic.lower().split())
    said = set(edited.lower().replace(".", " ").replace(",", " ").split())
    brevity = min(1.0, max(0.0, (24 - len(edited.split())) / 16))
    return 0.5 * len(wanted & said) / len(wanted) + 0.5 * brevity


def team(item: dict, client) -> tuple[float, dict]:
    """Writer, then editor; returns the team's score and the draft (shown in the run's trees)."""
    draft = client.chat.completions.create(
        model="writer", messages=[{"role": "user", "content": f"Write a short sentence about {item['topic']}."}]
    ).choices[0].message.content
    edited = client.chat.completions.create(
        model="editor",
        messages=[{"role": "system", "content": "You shorten sentences to at most eight words."},
                  {"role": "user", "content": f"Shorten this sentence about {item['topic']}: {draft}"}],
    ).choices[0].message.content
    return score(item["topic"], edited), {"draft": draft, "edited": edited}


def main(max_steps: int = 4) -> dict:
    """Train the team with MAGRPO on the tiny model; returns its optimizer steps and the
    evaluation before and after."""
    import copy

    from llm_marl import CausalLMPolicy, MAGRPOConfig, MAGRPOTrainer
    from llm_marl.envs import ProgramEnv
    from llm_marl.policies.tiny import load_tiny

    model, tokenizer = load_tiny()
    tokenizer.chat_template = SIMPLE_TEMPLATE  # the tiny model has none; instruct models (smollm2-135m) bring theirs
    env = ProgramEnv(team, agents, items, num_turns=num_turns, eval_items=eval_items)
    policies = [CausalLMPolicy(copy.deepcopy(model), tokenizer, max_new_tokens=12) for _ in agents]
    args = MAGRPOConfig(num_turns=num_turns, num_generations=2, max_steps=max_steps, items_per_step=1, rollout_buffer_size=1,
                        eval_interval=0, eval_num_samples=2, progress_bar=False, seed=0, early_termination_threshold=None)
    trainer = MAGRPOTrainer(env=env, policies=policies, args=args)  # evaluated on the env's eval_items
    before = trainer.evaluate()
    trainer.train()
    after = trainer.evaluate()
    env.close()
    return {"optimizer_steps": trainer.state.global_step, "before": before, "after": after}


if __name__ == "__main__":
    print(main())

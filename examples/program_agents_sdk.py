"""A two-agent program written with the OpenAI Agents SDK, trained as it is.

The same writer and editor as ``examples/program_team.py``, but each is an ``agents.Agent``
(instructions, a model) run by the SDK's ``Runner``. The SDK accepts any ``AsyncOpenAI``
client, so the program hands it the one llm_marl gives it: each agent's ``model`` name is the
llm_marl agent that answers (docs/programs.md). Needs the extra ``agents_sdk``
(``pip install llm_marl[agents_sdk]``: ``openai-agents``).

    llm-marl train --program examples/program_agents_sdk.py:team --policy lm --model smollm2-135m \\
        --learner magrpo --num_generations 2 --max_steps 2 --threads 1
    python examples/program_agents_sdk.py       # a few MAGRPO steps on the tiny model
"""

from __future__ import annotations

from program_team import SIMPLE_TEMPLATE, score

agents = ("writer", "editor")
"""The model names the program's SDK agents use: one trained agent each."""
num_turns = 2
"""The most steps of calls (the writer's, then the editor's)."""
items = [{"topic": topic} for topic in ("the sea", "a small ship", "the weather today", "a story")]
"""The program's inputs, one rollout each."""


async def team(item: dict, client) -> tuple[float, dict]:
    """The writer's SDK agent drafts, the editor's shortens the draft; the program scores the result."""
    from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled

    set_tracing_disabled(True)  # no traces sent anywhere
    writer = Agent(name="writer", instructions="Write a short sentence about the topic.",
                   model=OpenAIChatCompletionsModel(model="writer", openai_client=client))
    editor = Agent(name="editor", instructions="You shorten sentences to at most eight words.",
                   model=OpenAIChatCompletionsModel(model="editor", openai_client=client))
    draft = (await Runner.run(writer, f"Topic: {item['topic']}")).final_output
    edited = (await Runner.run(editor, f"Shorten this sentence about {item['topic']}: {draft}")).final_output
    return score(item["topic"], edited), {"draft": draft, "edited": edited}


def main(max_steps: int = 4) -> dict:
    """Train the SDK team with MAGRPO on the tiny model; returns its optimizer steps and the
    evaluation before and after."""
    import copy

    from llm_marl import CausalLMPolicy, MAGRPOConfig, MAGRPOTrainer
    from llm_marl.envs import ProgramEnv
    from llm_marl.policies.tiny import load_tiny

    model, tokenizer = load_tiny()
    tokenizer.chat_template = SIMPLE_TEMPLATE  # the tiny model has none
    env = ProgramEnv(team, agents, items, num_turns=num_turns)
    policies = [CausalLMPolicy(copy.deepcopy(model), tokenizer, max_new_tokens=12) for _ in agents]
    args = MAGRPOConfig(num_turns=num_turns, num_generations=2, max_steps=max_steps, items_per_step=1, rollout_buffer_size=1,
                        eval_interval=0, progress_bar=False, seed=0, early_termination_threshold=None)
    trainer = MAGRPOTrainer(env=env, policies=policies, args=args, eval_env=env)
    before = trainer.evaluate()
    trainer.train()
    after = trainer.evaluate()
    env.close()
    return {"optimizer_steps": trainer.state.global_step, "before": before, "after": after}


if __name__ == "__main__":
    print(main())

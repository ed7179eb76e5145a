"""A custom cooperative task, trained with two tiny language models for a few steps.

``KeywordRelay``: two agents read the same sentence of Python documentation. Three keywords are
taken from it (its content words that are most common in the documentation); the team earns the fraction of keywords that at least one of them mentions, but
only for real text (three words or more each), and loses a little for every keyword both of them
spend words on (they should split the work). After the first turn each agent is told which
keywords the team still misses and which ones its partner already covered.

It shows the whole path for a task of your own: subclass ``CooperativeTask`` (dataset, first
prompts, shared reward, external transition), play it through ``DialogueEnv`` (a PettingZoo
parallel env), wrap Hugging Face models in ``CausalLMPolicy`` and train with the env-native
constructor ``MAGRPOTrainer(env=..., policies=..., args=...)``.

    python examples/custom_task_lm.py                                  # a few minutes on a CPU
    python examples/custom_task_lm.py --items 4 --tiny-pretrain-steps 20 --max-new-tokens 8
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter

import datasets
import torch

from llm_marl import CausalLMPolicy, CooperativeTask, DialogueEnv, MAGRPOConfig, MAGRPOTrainer
from llm_marl.tasks.writing.corpus import pydoc_paragraphs
from llm_marl.tasks.writing import content_words, word_count, words


class KeywordRelay(CooperativeTask):
    agents = ("first", "second")
    num_turns = 2

    def __init__(self, num_items: int = 40):
        # Keywords: the sentence's three content words that are most common in the corpus, i.e. the
        # words a small model trained on it can actually produce (rare ones give no reward signal).
        frequency = Counter(w for paragraph in pydoc_paragraphs() for w in content_words(paragraph))
        rows = []
        for paragraph in pydoc_paragraphs():
            sentence = paragraph.split(". ")[0].rstrip(".") + "."
            keys = sorted(set(content_words(sentence)), key=lambda w: (-frequency[w], w))[:3]
            if 8 <= len(sentence.split()) <= 25 and len(keys) == 3:
                rows.append({"sentence": sentence, "keywords": keys})
        if len(rows) < num_items + 8:
            raise ValueError(f"only {len(rows)} usable sentences in this Python's documentation")
        self.rows = {"train": rows[:num_items], "eval": rows[num_items : num_items + 8]}

    def dataset(self, split):
        return datasets.Dataset.from_list(self.rows[split])

    def initial_observations(self, item):
        # Prompts in the corpus' own style: the tiny models only know documentation prose.
        return {"first": f"{item['sentence']} In other words,", "second": f"{item['sentence']} For example,"}

    def reward(self, item, actions, history):
        said = {agent: set(words(text)) for agent, text in actions.items()}
        covered = [k for k in item["keywords"] if any(k in s for s in said.values())]
        shared = [k for k in item["keywords"] if all(k in s for s in said.values())]
        real_text = all(word_count(text) >= 3 for text in actions.values())
        value = (len(covered) - 0.25 * len(shared)) / len(item["keywords"]) if real_text else 0.0
        return value, {"covered": covered, "shared": shared, "real_text": real_text}

    def transition(self, item, actions, history):
        details = history[-1].details  # the turn just played, with its reward details
        missing = [k for k in item["keywords"] if k not in details["covered"]]
        todo = f"Still missing: {', '.join(missing)}." if missing else "Every keyword is covered."
        prompts = {}
        for agent, other in (("first", "second"), ("second", "first")):
            theirs = [k for k in item["keywords"] if k in set(words(actions[other]))]
            taken = f" Your partner wrote about {', '.join(theirs)}." if theirs else ""
            lead = "In other words," if agent == "first" else "For example,"
            prompts[agent] = f"{item['sentence']} {todo}{taken} {lead}"
        return prompts


def tiny_policy(args, pretrain_steps, workdir):
    from llm_marl.policies.tiny import build_tiny_model, load_tiny

    if pretrain_steps is None:
        model, tokenizer = load_tiny()  # the default tiny GPT-2, built once and cached; loaded anew each call
        return CausalLMPolicy(model, tokenizer, max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    path = build_tiny_model(f"{workdir}/tiny", pretrain_steps=pretrain_steps, batch_size=8)  # built once
    return CausalLMPolicy.from_pretrained(path, max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=24, help="training items (a few optimizer steps each)")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--tiny-pretrain-steps", type=int, help="build a quicker tiny model with this many pre-training steps")
    parser.add_argument("--output-dir", help="run directory for logs and checkpoints (default: none)")
    cli = parser.parse_args()
    torch.set_num_threads(1)

    task = KeywordRelay(num_items=cli.items)
    env, eval_env = DialogueEnv(task, split="train"), DialogueEnv(task, split="eval", render_mode="ansi")
    args = MAGRPOConfig(
        num_agents=2,
        num_turns=2,
        num_train_epochs=1,
        num_generations=4,
        max_new_tokens=cli.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        agent_learning_rate=1e-3,
        max_grad_norm=1.0,
        items_per_step=4,
        rollout_buffer_size=8,
        early_termination_threshold=0.99,  # a node whose answers already cover everything is not expanded
        eval_interval=0,
        eval_num_samples=8,
        eval_batch_size=8,
        logging_steps=1,
        output_dir=cli.output_dir,
    )
    workdir = tempfile.mkdtemp(prefix="custom_task_lm-")
    # One model per agent, loaded separately: agents never share weights.
    policies = {agent: tiny_policy(args, cli.tiny_pretrain_steps, workdir) for agent in task.agents}
    trainer = MAGRPOTrainer(env=env, policies=policies, args=args, eval_env=eval_env)

    before = trainer.evaluate()  # seeded by args.seed alone: before and after draw the same numbers
    state = trainer.train()
    after = trainer.evaluate()
    print(f"trained {state.batch_step} batches, {state.global_step} optimizer steps")
    for name in sorted(before):
        print(f"{name:<30} before {before[name]:.3f}  after {after[name]:.3f}")

    # One eval episode with the trained agents, rendered as text.
    observations, _ = eval_env.reset(options={"index": 0})
    while eval_env.agents:
        actions = {a: trainer.policies[a].sample([observations[a]], 1)[0][0].text for a in eval_env.agents}
        observations, *_ = eval_env.step(actions)
    print()
    print(eval_env.render())


if __name__ == "__main__":
    main()

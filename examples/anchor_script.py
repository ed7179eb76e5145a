"""A training script written for CoMLRL's MAGRPOTrainer constructor, run with llm_marl.

The reward function, formatters, transition and the part of ``main()`` between the "CoMLRL
script" markers are written exactly as for CoMLRL (``agent_model=``, ``tokenizer=``,
``reward_func=``, ``reward_processor=``, ``formatters=``, ``external_transition=``,
``train_dataset=``/``eval_dataset=``, ``args=MAGRPOConfig(...)``, ``train()``, ``evaluate()``,
``save_model()``). The only change is the import line::

    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer   # CoMLRL
    from llm_marl import MAGRPOConfig, MAGRPOTrainer                    # llm_marl

(``from llm_marl.comlrl.trainers.reinforce import ...`` serves CoMLRL's own import paths too; see
docs/migrating.md. Runs log to TensorBoard and metrics.jsonl in
``output_dir``, and to W&B as well when ``wandb_config=`` is given.)

The task: two agents read a sentence of Python documentation. Agent 1 restates it briefly
("In simple terms,"), agent 2 expands it ("For example,"); the shared reward asks for varied
words and a length ratio of 2-3x. At the second turn each agent is told the lengths of the first turn.

The model: ``--model PATH`` (any causal LM saved with ``save_pretrained``, or a hub id), or by
default the local tiny GPT-2 of ``llm_marl.policies.tiny`` (built once, ~90 s on a CPU core, then
cached), saved with ``save_pretrained`` to a temporary folder first, so it is loaded by path as a
hub model would be. ``--tiny-pretrain-steps 20`` builds a smaller, quicker one instead.

    python examples/anchor_script.py                      # a few minutes on a CPU
    python examples/anchor_script.py --items 4 --max-new-tokens 8 --tiny-pretrain-steps 20  # seconds
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile

from datasets import Dataset
from transformers import AutoTokenizer

# CoMLRL: from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer -- the only change.
from llm_marl import MAGRPOConfig, MAGRPOTrainer

OPENINGS = [
    "The assert statement is a convenient way to insert debugging assertions into a program.",
    "A module can contain executable statements as well as function definitions.",
    "The import statement combines two operations: it searches for the named module and binds it.",
    "Exceptions are raised when an error is detected during execution.",
    "A class definition is an executable statement that creates a new class object.",
    "The return statement leaves the current function call with an expression list or None.",
    "The for statement is used to iterate over the elements of a sequence.",
    "A function definition defines a user-defined function object.",
    "Strings are immutable sequences of Unicode code points.",
    "The with statement wraps the execution of a block with methods defined by a context manager.",
    "A list comprehension provides a concise way to create lists.",
    "The global statement is a declaration which holds for the entire current code block.",
    "Deletion of a name removes the binding of that name from the local or global namespace.",
    "Methods may call other methods by using method attributes of the self argument.",
    "Dictionaries are indexed by keys, which can be any immutable type.",
    "The while statement is used for repeated execution as long as an expression is true.",
]


def words(text):
    return re.findall(r"[A-Za-z]+", text)


def length_ratio_reward(completions1, completions2, batch_items=None):
    """Called with one list of answers per agent (one answer each); returns a list of rewards."""
    rewards = []
    for short, long in zip(completions1, completions2):
        short_words, long_words = words(short), words(long)
        if len(short_words) < 2 or len(long_words) < 2:
            rewards.append(0.0)
            continue
        ratio = len(long) / max(len(short), 1)
        ratio_score = 1.0 if 2.0 <= ratio <= 3.0 else max(0.0, 1.0 - abs(ratio - 2.5) / 2.5)
        variety = min(len(set(long_words)) / len(long_words), len(set(short_words)) / len(short_words))
        rewards.append(ratio_score * variety)
    return rewards


def short_formatter(example, external_prompts=None):
    if external_prompts is not None:  # later turns: the transition's feedback comes first
        return f"{external_prompts} {example['passage']} In simple terms,"
    return f"{example['prompt']} In simple terms,"


def long_formatter(example, external_prompts=None):
    if external_prompts is not None:
        return f"{external_prompts} {example['passage']} For example,"
    return f"{example['prompt']} For example,"


def length_feedback(prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent):
    short, long = agent_completions
    ratio = len(long) / max(len(short), 1)
    return [
        f"The short text had {len(words(short))} words and the long one was {ratio:.1f} times as long.",
        f"The long text had {len(words(long))} words, {ratio:.1f} times the short one.",
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="model path or hub id (default: the local tiny GPT-2)")
    parser.add_argument("--tiny-pretrain-steps", type=int, help="build a quicker tiny model with this many pre-training steps")
    parser.add_argument("--items", type=int, default=8, help="training items (one batch each; two or three optimizer steps per batch)")
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--output-dir", default=None, help="run directory (default: a temporary folder)")
    cli = parser.parse_args()

    workdir = tempfile.mkdtemp(prefix="anchor_script-")
    model_name = cli.model or prepare_tiny_model(os.path.join(workdir, "tiny"), cli.tiny_pretrain_steps)
    output_dir = cli.output_dir or os.path.join(workdir, "run")

    # --- from here on: a CoMLRL script --------------------------------------------------------
    tokenizer = AutoTokenizer.from_pretrained(model_name)
    rows = [{"prompt": text, "passage": text} for text in OPENINGS]
    train_dataset = Dataset.from_list(rows[: cli.items])
    eval_dataset = Dataset.from_list(rows[-4:])

    config = MAGRPOConfig(
        output_dir=output_dir,
        num_agents=2,
        num_turns=cli.turns,
        num_train_epochs=1,
        agent_learning_rate=1e-3,
        num_generations=4,
        max_new_tokens=cli.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        rollout_buffer_size=2,
        early_termination_threshold=None,
        eval_interval=4,
        eval_num_samples=4,
        logging_steps=1,
    )
    trainer = MAGRPOTrainer(
        agent_model=model_name,
        num_agents=2,
        tokenizer=tokenizer,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        reward_func=length_ratio_reward,
        reward_processor=lambda reward: 10.0 * reward,
        formatters=[short_formatter, long_formatter],
        external_transition=length_feedback if cli.turns > 1 else None,
        args=config,
    )
    trainer.train()
    metrics = trainer.evaluate()
    trainer.save_model(os.path.join(output_dir, "final"))
    # --- end of the CoMLRL script --------------------------------------------------------------

    for name, value in sorted(metrics.items()):
        print(f"{name}\t{value:.4f}")
    print(f"models saved in {os.path.join(output_dir, 'final')} (agent_0, agent_1); logs in {output_dir}/logs")


def prepare_tiny_model(path, pretrain_steps=None):
    """The local tiny GPT-2 and its tokenizer, saved with save_pretrained to ``path``."""
    from llm_marl.policies.tiny import build_tiny_model, load_tiny

    if pretrain_steps is not None:
        return str(build_tiny_model(path, pretrain_steps=pretrain_steps, batch_size=8))
    model, tokenizer = load_tiny()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


if __name__ == "__main__":
    main()

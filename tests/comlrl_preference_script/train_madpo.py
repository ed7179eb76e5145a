"""A training script in the shape of an OpenMLRL companion repository's MADPO launcher.

Written for CoMLRL (``from comlrl... import ...``) and never edited for llm_marl: the test
(tests/test_preference_comlrl.py) copies this folder, rewrites the imports with the README's
``sed`` line, and runs it. Two agents each write a short line about an item's topic; the
joint reward likes both lines mentioning the topic and being of different lengths.
"""

import argparse
from typing import Any, Dict, List

from datasets import Dataset
from transformers import AutoTokenizer

from comlrl.runtime import configure_job_cuda_cache
from comlrl.trainers.preference import MADPOConfig, MADPOTrainer
from comlrl.utils.reward_processor import RewardProcessors

TOPICS = ["module", "import", "statement", "assert"]


def first_formatter(example: Dict[str, Any]) -> str:
    return f"Write a short line about {example['topic']}:"


def second_formatter(example: Dict[str, Any]) -> str:
    return f"Write a longer line about {example['topic']}:"


def joint_reward(first: List[str], second: List[str], batch_items=None) -> List[float]:
    rewards = []
    for a, b, item in zip(first, second, batch_items):
        score = float(item["topic"] in a) + float(item["topic"] in b)
        score += min(abs(len(b) - len(a)) / 20.0, 1.0)
        rewards.append(score)
    return rewards


def main():
    configure_job_cuda_cache()
    parser = argparse.ArgumentParser(description="Train MADPO on topic lines")
    parser.add_argument("--model", required=True)
    parser.add_argument("--save_path", required=True)
    args = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    items = [{"topic": topic, "prompt": f"About {topic}"} for topic in TOPICS]
    train_dataset = Dataset.from_list(items[:3])
    eval_dataset = Dataset.from_list(items[3:])

    madpo_args = MADPOConfig(
        num_agents=2,
        num_train_epochs=1,
        agent_learning_rate=1e-4,
        logging_steps=1,
        max_new_tokens=4,
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        num_turns=1,
        eval_interval=2,
        eval_num_samples=1,
        rollout_buffer_size=2,
        preference_num_candidates=3,
        preference_pairs_per_sample=2,
        pair_selection="reward_gap",
        dpo_beta=0.1,
        use_environment_step=True,
        environment_steps_per_pair=2,
        collaboration_mode="decentralized",
    )
    trainer = MADPOTrainer(
        agent_model=args.model,
        num_agents=2,
        tokenizer=tokenizer,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        reward_func=joint_reward,
        reward_processor=RewardProcessors.scale(factor=0.5),
        formatters=[first_formatter, second_formatter],
        args=madpo_args,
    )
    trainer.train()
    trainer.save_model(args.save_path)


if __name__ == "__main__":
    main()

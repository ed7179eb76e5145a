"""A training script in the shape of an OpenMLRL companion repository's MARLHF launcher
(the writing and BFCL repositories import the comparator adapters beside the trainer).

Written for CoMLRL and never edited for llm_marl (see train_madpo.py for how it is run).
"""

import argparse
from typing import Any, Dict, List, Sequence

from datasets import Dataset
from transformers import AutoTokenizer

from comlrl.runtime import configure_job_cuda_cache
from comlrl.trainers.preference import (
    CentralizedComparatorParseError,
    MARLHFConfig,
    MARLHFTrainer,
    TaggedCentralizedComparatorAdapter,
)
from comlrl.trainers.preference.madpo import AgentPreferenceTensors, PreferencePair

TOPICS = ["module", "import", "statement", "assert"]
ADAPTER = TaggedCentralizedComparatorAdapter()


def split_joint(text: str, item: Dict[str, Any]) -> Sequence[str]:
    """Roles of a tagged joint answer; an untagged one counts as empty roles."""
    try:
        return ADAPTER.parse_completion(text, item, 2)
    except CentralizedComparatorParseError:
        return ["", ""]


def formatter(example: Dict[str, Any]) -> str:
    return f"One line about {example['topic']}:"


def joint_reward(first: List[str], second: List[str], batch_items=None) -> List[float]:
    return [float(item["topic"] in a) + float(item["topic"] in b) + len(set((a + b).split())) / 10.0
            for a, b, item in zip(first, second, batch_items)]


def describe(pair: PreferencePair) -> str:
    return f"{pair.winner_reward:.2f} > {pair.loser_reward:.2f}"


def main():
    configure_job_cuda_cache()
    parser = argparse.ArgumentParser(description="Train MARLHF on topic lines")
    parser.add_argument("--model", required=True)
    parser.add_argument("--save_path", required=True)
    args = parser.parse_args()
    assert split_joint("<agent_0>a</agent_0><agent_1>b</agent_1>", {}) == ["a", "b"]
    assert AgentPreferenceTensors.__name__ and describe.__name__

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    items = [{"topic": topic, "prompt": f"About {topic}"} for topic in TOPICS]

    marlhf_args = MARLHFConfig(
        num_agents=2,
        num_train_epochs=1,
        agent_learning_rate=1e-4,
        logging_steps=1,
        max_new_tokens=4,
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        num_turns=1,
        eval_interval=0,
        rollout_buffer_size=2,
        preference_num_candidates=3,
        preference_pairs_per_sample=2,
        pair_selection="random",
        rl_algorithm="magrpo",
        num_generations=2,
        reward_model_name=args.model,
        reward_model_device="cpu",
        reward_learning_rate=1e-4,
        reward_num_train_epochs=1,
        reward_train_batch_size=2,
        reward_max_length=64,
        reward_freeze_backbone=False,
    )
    trainer = MARLHFTrainer(
        agent_model=args.model,
        num_agents=2,
        tokenizer=tokenizer,
        train_dataset=Dataset.from_list(items[:3]),
        eval_dataset=Dataset.from_list(items[3:]),
        reward_func=joint_reward,
        formatters=formatter,
        args=marlhf_args,
    )
    trainer.train()
    trainer.save_model(args.save_path)


if __name__ == "__main__":
    main()

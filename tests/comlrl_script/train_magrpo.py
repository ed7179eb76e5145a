"""A training script in the shape of a CoMLRL 1.4.x companion repository's ``train_magrpo.py``.

Written for CoMLRL (``from comlrl... import ...``) and never edited for llm_marl: the test
(tests/test_comlrl_script.py) copies this folder, rewrites the imports with the README's
``sed`` line, and runs it. Two agents write a helper (``aux``) and a main function for small
coding problems over two turns; between turns an external transition gives each agent
level feedback on both answers. Configuration comes from ``config.yaml`` (``--override
key=value`` as in the companion repositories).
"""

import argparse
import os
import re
from typing import Any, Dict, List

import yaml
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from comlrl.utils.reward_processor import RewardProcessors


# ----------------------------------------------------------------------------- config


def load_config(path: str, overrides: List[str]) -> Dict[str, Any]:
    with open(path) as f:
        config = yaml.safe_load(f)
    for override in overrides:
        key, value = override.split("=", 1)
        section = config
        *parents, leaf = key.split(".")
        for name in parents:
            section = section.setdefault(name, {})
        section[leaf] = yaml.safe_load(value)
    return config


# ----------------------------------------------------------------------------- formatters


def aux_function_formatter(example: Dict[str, Any]) -> str:
    """Agent 1 writes a helper function ``aux``."""
    return f"Write a helper function aux for this problem.\n{example['prompt']}\ndef aux("


def main_function_formatter(example: Dict[str, Any], external_prompts=None) -> str:
    """Agent 2 writes the entry point, which may call aux; later turns add the feedback."""
    text = f"Write {example['entry_point']} using aux.\n{example['prompt']}\ndef {example['entry_point']}("
    if external_prompts is not None:
        text = f"{external_prompts}\n{text}"
    return text


# ----------------------------------------------------------------------------- reward


def level_reward(aux_code: str, main_code: str, entry_point: str) -> float:
    """A graded reward in levels, as the companion repositories score code."""
    reward = 0.0
    if aux_code.strip():
        reward += 0.4
    if main_code.strip():
        reward += 0.6
    words_aux, words_main = re.findall(r"\w+", aux_code), re.findall(r"\w+", main_code)
    if words_aux and words_main:
        reward += min(len(set(words_main)) / max(len(set(words_aux)), 1), 2.0) / 2.0
    if "aux" in main_code:
        reward += 0.5
    if entry_point in main_code:
        reward += 0.5
    return reward


def get_reward_function(num_agents: int):
    def reward_wrapper(*agent_completions, batch_items=None, prompts=None):
        if batch_items is None:
            raise ValueError("batch_items must be provided for reward calculation")
        aux_completions, main_completions = agent_completions[0], agent_completions[-1]
        return [
            level_reward(aux, main, item["entry_point"])
            for aux, main, item in zip(aux_completions, main_completions, batch_items)
        ]

    return reward_wrapper


# ----------------------------------------------------------------------------- external transition


def level_feedback_transition(
    prompt, agent_completions, num_agents, prompt_history_per_agent=None, response_history_per_agent=None
):
    """Level feedback: each agent is told how far both answers got, and sees its last answer."""
    aux_code, main_code = agent_completions[0], agent_completions[-1]
    turn = len(response_history_per_agent[0]) if response_history_per_agent else 1
    status = (
        f"Turn {turn} feedback: aux has {len(aux_code.split())} words; "
        f"main {'calls' if 'aux' in main_code else 'does not call'} aux."
    )
    return [f"{status}\nYour previous answer:\n{agent_completions[i]}\nRevise it." for i in range(num_agents)]


# ----------------------------------------------------------------------------- eval logging (1.4.2 form)


def code_eval_logger(agent_completions_turns, test_cases, entry_points, prompts=None) -> List[Dict[str, Any]]:
    """One metrics dict per evaluated item: answer lengths per turn."""
    metrics = []
    for item_index, entry_point in enumerate(entry_points):
        aux_turns = agent_completions_turns[0][item_index]
        main_turns = agent_completions_turns[-1][item_index]
        entry = {"entry_point": entry_point, "has_tests": bool(test_cases[item_index])}
        for turn, (aux, main) in enumerate(zip(aux_turns, main_turns), start=1):
            entry[f"turn_{turn}/aux_words"] = len(aux.split())
            entry[f"turn_{turn}/main_calls_aux"] = float("aux" in main)
        metrics.append(entry)
    return metrics


def aggregate_code_metrics(metrics: List[Dict[str, Any]], num_turns: int = 1) -> Dict[str, float]:
    out: Dict[str, float] = {}
    for turn in range(1, num_turns + 1):
        for name in ("aux_words", "main_calls_aux"):
            values = [m[f"turn_{turn}/{name}"] for m in metrics if f"turn_{turn}/{name}" in m]
            if values:
                out[f"turn_{turn}/{name}_mean"] = sum(values) / len(values)
    out["items_with_tests"] = float(sum(m["has_tests"] for m in metrics))
    return out


# ----------------------------------------------------------------------------- main


def main():
    parser = argparse.ArgumentParser(description="Train MAGRPO on cooperative coding")
    parser.add_argument("--config", required=True)
    parser.add_argument("--override", nargs="*", default=[])
    args = parser.parse_args()
    config = load_config(args.config, args.override)

    model_name = config["model"]["name"]
    dataset_type = config["dataset"]["type"]
    magrpo_config = config["magrpo"]
    num_agents = magrpo_config.get("num_agents", 2)

    problems = config["dataset"]["problems"]
    train_dataset = Dataset.from_list(problems[: config["dataset"]["train_size"]])
    eval_dataset = Dataset.from_list(problems[config["dataset"]["train_size"] :])

    tokenizer = AutoTokenizer.from_pretrained(model_name)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    agents = [AutoModelForCausalLM.from_pretrained(model_name) for _ in range(num_agents)]

    magrpo_args = MAGRPOConfig(
        num_agents=num_agents,
        num_train_epochs=magrpo_config.get("num_train_epochs", 20),
        agent_learning_rate=magrpo_config.get("agent_learning_rate", 2e-5),
        logging_steps=magrpo_config.get("logging_steps", 50),
        num_generations=magrpo_config.get("num_generations", 4),
        max_new_tokens=magrpo_config.get("max_new_tokens", 256),
        temperature=magrpo_config.get("temperature", 0.6),
        top_p=magrpo_config.get("top_p", 0.6),
        num_turns=magrpo_config.get("num_turns", 2),
        discount=magrpo_config.get("discount", 0.9),
        joint_mode=magrpo_config.get("joint_mode", "aligned"),
        early_termination_threshold=magrpo_config.get("early_termination_threshold", -0.2),
        eval_interval=magrpo_config.get("eval_interval", 4),
        eval_num_samples=magrpo_config.get("eval_num_samples", 4),
        rollout_buffer_size=magrpo_config.get("rollout_buffer_size", 2),
        parallel_training=magrpo_config.get("parallel_training", "none"),
        agent_devices=magrpo_config.get("agent_devices"),
    )

    reward_processor = None
    if config.get("reward_processor", {}).get("enabled", False):
        reward_processor = RewardProcessors.scale(factor=config["reward_processor"]["scale_factor"])
    shift_value = magrpo_config.get("reward_shift")
    if shift_value is not None:
        shift_proc = RewardProcessors.shift(value=float(shift_value))
        if reward_processor is None:
            reward_processor = shift_proc
        else:
            previous = reward_processor
            reward_processor = (lambda p=previous, s=shift_proc: (lambda x: s(p(x))))()

    wandb_section = config.get("wandb", {})
    wandb_config = {
        "project": wandb_section.get("project", "comlrl"),
        "entity": wandb_section.get("entity", "OpenMLRL"),
        "name": wandb_section.get("name", f"mt_magrpo_{dataset_type}"),
        "dir": wandb_section.get("dir", "./wandb"),
        "tags": wandb_section.get("tags", ["magrpo", dataset_type]),
        "config_sections": {"dataset": {"type": dataset_type}, "trainer": magrpo_config},
    }

    trainer = MAGRPOTrainer(
        agents=agents,
        num_agents=num_agents,
        tokenizer=tokenizer,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        reward_func=get_reward_function(num_agents),
        reward_processor=reward_processor,
        formatters=[aux_function_formatter, main_function_formatter],
        external_transition=level_feedback_transition,
        wandb_config=wandb_config,
        eval_logger=code_eval_logger,
        eval_aggregator=aggregate_code_metrics,
        dataset_type=dataset_type,
        args=magrpo_args,
    )
    trainer.train()

    if config["output"].get("save_final_model", True):
        save_path = config["output"]["save_path"]
        trainer.save_model(save_path)
        print(f"Model saved to: {save_path}")


if __name__ == "__main__":
    main()

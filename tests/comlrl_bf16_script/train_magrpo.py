"""A CoMLRL 1.4.x-shaped script whose model config asks for bfloat16 weights.

As CoMLRL's code-generation companion does, ``config.yaml``'s ``model`` section sets
``torch_dtype: bfloat16`` and the script passes it to the trainer as ``model_config``. The test
(tests/test_comlrl_bf16_script.py) rewrites the imports with the README's ``sed`` line and runs it
where oneDNN's bf16 kernels do not run. It evaluates, trains, evaluates again and prints one
JSON line with both evaluations and the weights' dtype.
"""

import argparse
import json

import yaml
from datasets import Dataset

from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer


def load_config(path, overrides):
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


def helper_formatter(example):
    return f"Write a helper for this problem.\n{example['prompt']}\ndef aux("


def main_formatter(example):
    return f"Write {example['entry_point']}.\n{example['prompt']}\ndef {example['entry_point']}("


def reward(aux_completions, main_completions, batch_items=None):
    return [
        float(bool(aux.strip())) + float(item["entry_point"] in main) + min(len(main.split()), 10) / 10
        for aux, main, item in zip(aux_completions, main_completions, batch_items)
    ]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--override", nargs="*", default=[])
    args = parser.parse_args()
    config = load_config(args.config, args.override)
    model_config = {k: v for k, v in config["model"].items() if k != "name"}
    problems = config["dataset"]["problems"]
    size = config["dataset"]["train_size"]

    trainer = MAGRPOTrainer(
        agent_model=config["model"]["name"],
        model_config=model_config,
        reward_func=reward,
        formatters=[helper_formatter, main_formatter],
        train_dataset=Dataset.from_list(problems[:size]),
        eval_dataset=Dataset.from_list(problems[size:]),
        args=MAGRPOConfig(**config["magrpo"]),
    )
    before = trainer.evaluate()
    trainer.train()
    after = trainer.evaluate()
    dtypes = sorted({str(p.dtype) for policy in trainer.policies.values() for p in policy.model.parameters()})
    print(json.dumps({"before": before, "after": after, "dtypes": dtypes}))


if __name__ == "__main__":
    main()

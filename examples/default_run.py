"""The default main job as a script: what ``llm-marl train`` with no arguments does.

Two tiny local language models (``llm_marl.policies.tiny``: built and warm-started on first use,
~90 s on a CPU core, then cached under ``~/.cache/llm_marl``) learn the writing-collaboration task
(``WritingCollab-v0``: one writes a short version of a documentation passage, the other a long
one) with MAGRPO and a frozen-reference KL penalty, on the CPU. The settings are
``llm_marl.cli.DEFAULT_RUN``; the trainer is built by ``llm_marl.cli.build_trainer``, exactly as
the command builds it. The script evaluates before and after training, saves both agents with
``save_pretrained`` and prints the before/after table with sample answers.

    python examples/default_run.py                                   # the full default run
    python examples/default_run.py --train-items 16 --eval-items 8   # a quick look
    tensorboard --logdir runs/                                       # the curves

Any option of ``DEFAULT_RUN`` or config field can be changed with ``--set name=value``
(e.g. ``--set learner=marloo --set num_generations=8``); values are parsed as YAML.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import yaml

from llm_marl.cli import DEFAULT_RUN, build_trainer, format_summary, train_and_summarize


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train-items", type=int, default=DEFAULT_RUN["train_items"])
    parser.add_argument("--eval-items", type=int, default=DEFAULT_RUN["eval_num_samples"])
    parser.add_argument("--output-dir", help="run directory (default runs/default-<time>)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="override an option")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    cli = parser.parse_args()
    if cli.threads:
        torch.set_num_threads(cli.threads)

    options = dict(DEFAULT_RUN)
    options.update(train_items=cli.train_items, eval_num_samples=cli.eval_items, eval_batch_size=cli.eval_items)
    for assignment in cli.set:
        name, _, value = assignment.partition("=")
        options[name.strip().replace("-", "_")] = yaml.safe_load(value)
    options["output_dir"] = cli.output_dir or os.path.join("runs", time.strftime("default-%Y%m%d-%H%M%S"))
    summary = train_and_summarize(build_trainer(options), options)
    print(format_summary(summary))


if __name__ == "__main__":
    main()

"""The ``llm-marl`` command.

``llm-marl train`` with no arguments runs the embedded default: two tiny local language models
(built and warm-started on first use, cached under ``~/.cache/llm_marl``) trained with MAGRPO on
the writing-collaboration task, on the CPU: about 25 s once the models are cached (building them
takes about 90 s the first time) on a 2-core machine. It shows a progress bar, writes
TensorBoard logs, checkpoints and a summary into a run directory, and ends with a table of eval
reward before and after training and sample answers.

Any config field is a flag (``--num_generations 8`` or ``--num-generations 8``); ``--config
run.yaml`` loads fields (and ``env``/``policy``/``learner``/``model``) from YAML, and flags
override it. Examples::

    llm-marl train --env ClimbingGame-v0 --policy tabular --learner magrpo --num_turns 1
    llm-marl train --config run.yaml --resume            # continue the newest checkpoint
    llm-marl eval --env WritingCollab-v0 --model runs/x/final/agent_0
    llm-marl list
    llm-marl plot runs/x                                   # PNG curves from the TensorBoard logs
    llm-marl view runs/x                                   # the recorded rollout trees as one HTML page
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Any, Sequence

LEARNERS = {
    "magrpo": "MAGRPO",
    "mareinforce": "MAREINFORCE",
    "marloo": "MARLOO",
    "maremax": "MAReMax",
    "iac": "IAC",
    "maac": "MAAC",
}

DEFAULT_RUN: dict[str, Any] = {
    "env": "WritingCollab-v0",
    "policy": "lm",
    "model": "tiny",
    "learner": "magrpo",
    "num_turns": 1,
    "num_train_epochs": 1,
    "num_generations": 4,
    "items_per_step": 8,
    "rollout_buffer_size": 8,
    "max_new_tokens": 32,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": None,
    "agent_learning_rate": 3e-4,
    "early_termination_threshold": None,
    "reference_kl_enabled": True,
    "reference_kl_coef": 0.05,
    "eval_interval": 0,
    "eval_num_samples": 32,
    "eval_batch_size": 32,
    "logging_steps": 1,
    "rollout_log_steps": 1,
    "max_grad_norm": 1.0,
    "train_items": 64,
}
"""The embedded default run (``llm-marl train`` with no arguments).

Measured (tests/test_lm_training.py): at agent_learning_rate 3e-4 the mean eval reward of the
tiny models rises from ~0.12 to ~0.20-0.26 within 6 batches; at 1e-3 one Adam step moves the tiny
model so far that the reference KL dominates the [0, 1] reward and some seeds collapse into
punctuation, so the default stays at 3e-4."""


def learner_classes(name: str) -> tuple[type, type]:
    """(config class, trainer class) of learner ``name`` (magrpo, mareinforce, marloo, maremax, iac, maac)."""
    import llm_marl.learners as learners

    key = name.lower()
    if key not in LEARNERS:
        raise SystemExit(f"unknown learner {name!r}; choose one of {', '.join(LEARNERS)}")
    prefix = LEARNERS[key]
    return getattr(learners, f"{prefix}Config"), getattr(learners, f"{prefix}Trainer")


def _field_parser(field: dataclasses.Field) -> Any:
    hint = field.type if not isinstance(field.type, str) else str(field.type)
    text = str(hint)

    def parse(value: str) -> Any:
        if value.lower() in ("none", "null") and "None" in text:
            return None
        if text.startswith("bool"):
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
            raise argparse.ArgumentTypeError(f"--{field.name}: expected true/false, got {value!r}")
        if "Sequence" in text:
            return [v for v in value.split(",") if v]
        for kind in (int, float):
            if text.startswith(kind.__name__):
                try:
                    return kind(value)
                except ValueError:
                    raise argparse.ArgumentTypeError(f"--{field.name}: expected {kind.__name__}, got {value!r}") from None
        if text.startswith("float | None") or text.startswith("int | None"):
            return float(value) if text.startswith("float") else int(value)
        return value

    return parse


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    from llm_marl.learners.actor_critic_config import IACConfig
    from llm_marl.learners.config import MAGRPOConfig

    group = parser.add_argument_group("config fields (MAGRPOConfig; see llm_marl/learners/config.py)")
    names = set(MAGRPOConfig.field_names())
    extra = [f for f in dataclasses.fields(IACConfig) if f.name not in names]  # --learner iac|maac only
    for field in [*dataclasses.fields(MAGRPOConfig), *extra]:
        flags = [f"--{field.name}"]
        if "_" in field.name:
            flags.append(f"--{field.name.replace('_', '-')}")
        group.add_argument(*flags, dest=f"cfg_{field.name}", type=_field_parser(field), default=argparse.SUPPRESS, metavar="V")


def _run_options(ns: argparse.Namespace, use_default: bool) -> dict[str, Any]:
    options: dict[str, Any] = dict(DEFAULT_RUN) if use_default else {"policy": "tabular", "learner": "magrpo"}
    if ns.config:
        import yaml

        with open(ns.config) as f:
            loaded = yaml.safe_load(f) or {}
        if not isinstance(loaded, dict):
            raise SystemExit(f"{ns.config}: expected a mapping of field: value")
        options.update(loaded)
    for key in ("env", "policy", "model", "learner", "output_dir", "actions", "train_items"):
        value = getattr(ns, key, None)
        if value is not None:
            options[key] = value
    for key, value in vars(ns).items():
        if key.startswith("cfg_"):
            options[key[4:]] = value
    return options


def build_trainer(options: dict[str, Any]) -> Any:
    """A trainer from run options: env id, policy kind, model, learner and config fields."""
    config_class, trainer_class = learner_classes(options.get("learner", "magrpo"))
    fields = set(config_class.field_names())
    unknown = sorted(set(options) - fields - {"env", "policy", "model", "learner", "actions", "train_items"})
    if unknown:
        raise SystemExit(f"unknown option(s) {unknown}; config fields are listed by `llm-marl train --help`")
    if "env" not in options:
        raise SystemExit("--env is required (see `llm-marl list`)")
    env_kwargs = {}
    if options.get("num_turns") is not None:
        env_kwargs["num_turns"] = options["num_turns"]
    env = _make_env(options["env"], env_kwargs)
    eval_env = _make_env(options["env"], {**env_kwargs, "split": "eval"})
    if options.get("train_items"):
        env = _limit_items(env, int(options["train_items"]))
    settings = {k: v for k, v in options.items() if k in fields}
    settings.setdefault("num_agents", len(env.possible_agents))
    settings.setdefault("num_turns", getattr(getattr(env, "task", None), "num_turns", 1))
    args = config_class(**settings)
    policies = _make_policies(options, env, args)
    return trainer_class(env=env, policies=policies, args=args, eval_env=eval_env)


def _make_env(env_id: str, kwargs: dict[str, Any]) -> Any:
    from llm_marl.envs import make

    try:
        return make(env_id, **kwargs)
    except TypeError:
        kwargs = {k: v for k, v in kwargs.items() if k != "num_turns"}
        return make(env_id, **kwargs)


def _limit_items(env: Any, count: int) -> Any:
    data = getattr(env, "data", None)
    if data is not None and count < len(data):
        env.data = data.select(range(count))
    return env


def _make_policies(options: dict[str, Any], env: Any, args: Any) -> list[Any]:
    kind = options.get("policy", "tabular")
    if kind == "tabular":
        from llm_marl.policies.tabular import TabularPolicy

        actions = options.get("actions")
        if isinstance(actions, str):
            actions = actions.split(",")
        if actions is None:
            actions = getattr(getattr(env, "task", None), "menu", None)
        if not actions:
            raise SystemExit("--policy tabular needs --actions a,b,c (the env's task has no menu)")
        return [TabularPolicy(actions) for _ in env.possible_agents]
    if kind == "lm":
        from llm_marl.policies.causal_lm import CausalLMPolicy

        model = options.get("model") or "tiny"
        paths = model if isinstance(model, list) else [model] * len(env.possible_agents)
        policies = []
        for path in paths:
            if path == "tiny":
                from llm_marl.policies.tiny import load_tiny

                lm, tokenizer = load_tiny()
                policy = CausalLMPolicy(lm, tokenizer, max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
            else:
                policy = CausalLMPolicy.from_pretrained(
                    path, max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k
                )
            policies.append(policy)
        return policies
    raise SystemExit(f"unknown --policy {kind!r}; choose tabular or lm")


def _samples(trainer: Any, count: int = 2) -> list[dict[str, str]]:
    """One answer per agent to the first ``count`` eval prompts (for the summary)."""
    env = trainer.eval_env or trainer.env
    shown = []
    for index in range(min(count, len(getattr(env, "data", [0])))):
        observations, _ = env.fork().reset(options={"index": index})
        entry = {}
        for agent in trainer.agents:
            [[completion]] = trainer.policies[agent].sample([observations[agent]], 1)
            entry[agent] = completion.text
        shown.append(entry)
    return shown


def cmd_train(ns: argparse.Namespace, argv: Sequence[str]) -> int:
    use_default = not ns.env and not ns.config
    options = _run_options(ns, use_default)
    if not options.get("output_dir"):
        from llm_marl.learners.run_dir import default_run_dir

        options["output_dir"] = default_run_dir(options.get("env", "run"), options.get("learner", "magrpo"))
    if use_default:
        print("llm-marl: no arguments, running the embedded default (tiny local LMs, MAGRPO, WritingCollab-v0)")
    resume = None
    if ns.resume is not None:
        resume = True if ns.resume == "latest" else ns.resume
    summary = train_and_summarize(build_trainer(options), options, resume)
    if summary is not None:
        print(format_summary(summary))
        if os.path.isdir(os.path.join(options["output_dir"], "rollouts")):
            print(f"llm-marl: rollout trees recorded; see them with: llm-marl view {options['output_dir']}")
    return 0


def train_and_summarize(trainer: Any, options: dict[str, Any], resume: str | bool | None = None) -> dict[str, Any] | None:
    """Evaluate, train, evaluate again, save the models to ``output_dir/final`` and write
    ``summary.json``; returns the summary (None on ranks other than 0)."""
    main_rank = trainer.dist.is_main
    run_dir = trainer.args.output_dir
    if main_rank:
        print(f"llm-marl: run directory {run_dir} (TensorBoard: tensorboard --logdir {run_dir}/logs)")
    before = trainer.evaluate() if not resume and main_rank else None
    samples_before = _samples(trainer) if not resume and main_rank else None
    started = time.time()
    state = trainer.train(resume_from_checkpoint=resume)
    if not main_rank:
        return None
    after = trainer.evaluate()
    summary = {
        "options": dict(options),
        "seconds": round(time.time() - started, 1),
        "batches": state.batch_step,
        "optimizer_steps": state.global_step,
        "skipped_items": state.skipped_items,
        "eval_before": before,
        "eval_after": after,
        "samples_before": samples_before,
        "samples_after": _samples(trainer),
    }
    trainer.save_model(os.path.join(run_dir, "final"))
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, default=str)
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    """The end-of-run table: eval metrics before and after training, and sample answers."""
    before, after = summary.get("eval_before") or {}, summary.get("eval_after") or {}
    names = sorted(set(before) | set(after))
    width = max([len(n) for n in names] + [6])
    lines = ["", f"trained {summary['batches']} batches, {summary['optimizer_steps']} optimizer steps in {summary['seconds']} s"]
    lines.append(f"{'metric':<{width}}  {'before':>10}  {'after':>10}")
    for name in names:
        b = f"{before[name]:.4f}" if name in before else "-"
        a = f"{after[name]:.4f}" if name in after else "-"
        lines.append(f"{name:<{width}}  {b:>10}  {a:>10}")
    for label in ("samples_before", "samples_after"):
        for i, entry in enumerate(summary.get(label) or []):
            for agent, text in entry.items():
                lines.append(f"{label.replace('_', ' ')} [eval item {i}] {agent}: {text[:160]!r}")
    return "\n".join(lines)


def cmd_eval(ns: argparse.Namespace, argv: Sequence[str]) -> int:
    options = _run_options(ns, use_default=not ns.env and not ns.config)
    options.pop("output_dir", None)
    trainer = build_trainer(options)
    if ns.checkpoint:
        from llm_marl.learners import checkpoint

        checkpoint.load(trainer, checkpoint.resolve(ns.checkpoint, None))
    metrics = trainer.evaluate()
    for name, value in sorted(metrics.items()):
        print(f"{name}\t{value:.4f}")
    return 0


def cmd_list(ns: argparse.Namespace, argv: Sequence[str]) -> int:
    from llm_marl.envs import registered_ids

    print("environments:")
    for env_id in registered_ids():
        print(f"  {env_id}")
    print("learners:")
    for key, prefix in LEARNERS.items():
        print(f"  {key:<12} {prefix}Trainer / {prefix}Config")
    print("policies:\n  tabular      TabularPolicy over the task's menu (or --actions)\n  lm           CausalLMPolicy (--model PATH, or 'tiny')")
    return 0


def cmd_plot(ns: argparse.Namespace, argv: Sequence[str]) -> int:
    from llm_marl.plotting import plot_run

    written = plot_run(ns.run_dir, ns.out)
    for path in written:
        print(path)
    return 0


def cmd_view(ns: argparse.Namespace, argv: Sequence[str]) -> int:
    from llm_marl import viewer

    if not os.path.isdir(ns.run_dir):
        raise SystemExit(f"llm-marl view: run directory {ns.run_dir!r} does not exist")
    if ns.serve:
        viewer.serve(ns.run_dir, ns.port)
        return 0
    path = viewer.write_page(ns.run_dir, ns.out)
    print(f"llm-marl view: wrote {path} (open it in a browser; it needs no network)")
    return 0


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="llm-marl", description=__doc__.split("\n\n")[0])
    commands = root.add_subparsers(dest="command", required=True)

    def run_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", help="YAML file of config fields and env/policy/learner/model")
        p.add_argument("--env", help="environment id (see `llm-marl list`)")
        p.add_argument("--policy", choices=["tabular", "lm"], help="policy kind for every agent")
        p.add_argument("--model", help="model path or hub id for --policy lm ('tiny': the local tiny model)")
        p.add_argument("--learner", choices=sorted(LEARNERS), help="learner (default magrpo)")
        p.add_argument("--actions", help="comma-separated menu for --policy tabular")
        p.add_argument("--train-items", "--train_items", dest="train_items", type=int, help="train on the first N dataset rows only")
        _add_config_flags(p)

    train = commands.add_parser("train", help="train agents (no arguments: the embedded default run)")
    run_flags(train)
    train.add_argument("--resume", nargs="?", const="latest", help="resume from a checkpoint path, or the newest in output_dir")
    train.set_defaults(func=cmd_train)

    evaluate = commands.add_parser("eval", help="evaluate policies on an env's eval split")
    run_flags(evaluate)
    evaluate.add_argument("--checkpoint", help="load policies from this checkpoint first")
    evaluate.set_defaults(func=cmd_eval)

    listing = commands.add_parser("list", help="list environments, learners and policies")
    listing.set_defaults(func=cmd_list)

    plot = commands.add_parser("plot", help="write PNG learning curves of a run")
    plot.add_argument("run_dir")
    plot.add_argument("--out", help="output folder (default RUN_DIR/plots)")
    plot.set_defaults(func=cmd_plot)

    view = commands.add_parser("view", help="write (or --serve) an HTML viewer of a run's recorded rollout trees")
    view.add_argument("run_dir")
    view.add_argument("--out", help="output file (default RUN_DIR/viewer.html)")
    view.add_argument("--serve", action="store_true", help="serve the viewer on 127.0.0.1 instead of writing a file")
    view.add_argument("--port", type=int, default=8765, help="port for --serve (0: any free port)")
    view.set_defaults(func=cmd_view)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover - transformers is a dependency
        pass
    ns = parser().parse_args(argv)
    return ns.func(ns, argv)


if __name__ == "__main__":
    raise SystemExit(main())

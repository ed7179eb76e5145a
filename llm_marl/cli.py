"""The ``llm-marl`` command.

``llm-marl train`` with no arguments runs the main job (:data:`MAIN_RUN`): two LoRA adapters on
one frozen SmolLM2-135M-Instruct (fetched from the package registry and converted on first use,
cached under ``~/.cache/llm_marl``: :mod:`llm_marl.policies.models`) learn with MAGRPO to agree
on answers in NameMatch (:mod:`llm_marl.tasks.naming`), on the CPU, in minutes.
``llm-marl train --model tiny`` runs the tiny-model writing run instead (:data:`DEFAULT_RUN`:
two tiny local GPT-2s, about 25 s once built). Either shows a progress bar, writes TensorBoard
logs, checkpoints and a summary into a run directory, and ends with a table of eval reward
before and after training and sample answers. ``llm-marl models`` lists the named models.

Any config field is a flag (``--num_generations 8`` or ``--num-generations 8``); ``--config
run.yaml`` loads fields (and ``env``/``policy``/``learner``/``model``/``actions``/``import``)
from YAML, and flags override it. Flags and YAML values go through one typed path per field
(``learners/config_types.py``): ``1e-3`` is a float, ``"false"`` is False, ``a,b`` a list.
Examples::

    llm-marl train --env ClimbingGame-v0 --policy tabular --learner magrpo --num_turns 1
    llm-marl train --config run.yaml --resume            # continue the newest checkpoint of the run
    llm-marl train --env my_pkg.tasks:make_env ...       # a custom env by entry point
    llm-marl train --import my_pkg.tasks --env Guess-v0  # ids my_pkg.tasks registers
    llm-marl eval --env WritingCollab-v0 --model runs/x/final
    llm-marl list
    llm-marl plot runs/x                                   # PNG curves from the TensorBoard logs
    llm-marl view runs/x                                   # the recorded rollout trees as one HTML page
    llm-marl serve runs/x/final                            # the trained agents behind an OpenAI-compatible endpoint

Run folders never mix runs (``runs/run_folder.py``): a new run refuses a non-empty
``--output_dir`` unless ``--resume`` (continue the run it holds) or ``--overwrite`` (move the old
contents aside). Ctrl-C or SIGTERM stops after the current batch, writes a checkpoint, prints
the command that resumes it and exits 130 / 143; a second Ctrl-C stops at once.

Errors are one or two lines naming the problem, exit status 2 for bad usage (flags, config
values, env ids, folders) and 1 for a run that failed; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import signal
import sys
import time
from typing import Any, Sequence

from llm_marl import assembly
from llm_marl.assembly import SAMPLING_FIELDS  # noqa: F401 (still importable as cli.SAMPLING_FIELDS)

LEARNERS = {
    "magrpo": "MAGRPO",
    "mareinforce": "MAREINFORCE",
    "marloo": "MARLOO",
    "maremax": "MAReMax",
    "iac": "IAC",
    "maac": "MAAC",
    "madpo": "MADPO",
    "marlhf": "MARLHF",
    "madpoiter": "MADPOIter",
    "marlhfiter": "MARLHFIter",
}

RUN_KEYS = ("env", "policy", "model", "learner", "actions", "train_items", "import", "system_prompt")
"""Keys of a run (flags and YAML) that are not config fields."""

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


DEFAULT_TEAM_RUN: dict[str, Any] = {
    "agent_learning_rate": 6e-3,
    "lora_alpha": 16.0,
    "lora_target_modules": ["c_attn", "c_proj", "c_fc"],
}
"""What the default run changes when its agents are LoRA adapters (``llm-marl train --lora_r 8``),
unless given explicitly: adapters on every linear layer of the tiny GPT-2 and a larger learning
rate than full models. Measured (tests/test_lora_learning.py, seeds 0-2, eval gain of the
default run on 48 items): full models +0.087/+0.124/+0.100; adapters on every linear layer at
3e-4 (the full models' rate) +0.009/+0.008/+0.021; on c_attn only at 3e-3
+0.063/+0.033/+0.020, at 5e-3 +0.087/+0.090/+0.060, at 1e-2 +0.103/-0.043/+0.077; on every linear
layer at 5e-3 +0.103/+0.107/+0.057, at 6e-3 +0.127/+0.151/+0.093 (chosen), at 7e-3
+0.103/+0.074/+0.068, at 1e-2 +0.003/+0.009 (collapse); r=16 (alpha 16 or 32) at 5e-3 was worse
(means +0.078, +0.063). Held-out seeds 3-5: full models +0.114/+0.109/+0.076, adapters at 6e-3
+0.134/+0.088/+0.149, at 5e-3 +0.102/+0.079/+0.157. (The sweep predates a float-rounding change of
2026-12-01, after which the chosen setting gained +0.062/+0.109/+0.094 on seeds 0-2 and
+0.135/+0.040/+0.149 on 3-5: a sweep's differences under ~0.03 are within such noise.)"""


MAIN_RUN: dict[str, Any] = {
    "env": "NameMatch-v0",
    "policy": "lm",
    "model": "smollm2-135m",
    "learner": "magrpo",
    "lora_r": 8,
    "lora_alpha": 16.0,
    "lora_target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "num_turns": 1,
    "num_train_epochs": 2,
    "num_generations": 4,
    "joint_mode": "cross",
    "items_per_step": 4,
    "rollout_buffer_size": 4,
    "max_new_tokens": 12,
    "temperature": 0.7,
    "top_p": 0.9,
    "top_k": None,
    "agent_learning_rate": 2e-3,
    "early_termination_threshold": None,
    "reference_kl_enabled": False,
    "eval_interval": 0,
    "eval_num_samples": 30,
    "eval_batch_size": 30,
    "logging_steps": 1,
    "rollout_log_steps": 1,
    "max_grad_norm": 1.0,
    "system_prompt": "You answer every question with a single word.",
}
"""The main job (``llm-marl train`` with no arguments): a team of two SmolLM2-135M-Instruct
LoRA adapters (one frozen base, fetched and converted on first use, :mod:`llm_marl.policies.models`)
learns to agree on answers in :class:`~llm_marl.tasks.naming.NameMatch`, on the CPU. ``--model
tiny`` (or any model other than SmolLM2) runs :data:`DEFAULT_RUN` instead."""

MAIN_RUN_MODELS = ("smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct")
"""Models the main job's settings were made for (a named model or its hub id)."""


GAME_RUN: dict[str, Any] = {"early_termination_threshold": None}
"""What a run on a game with a ``text`` switch (the OpenSpiel ids) sets unless given: no early
termination. A game pays at its end; the config's default (-0.2) would cut every tree after the
first move, whose reward is 0, so the later players would never act in training."""

GAME_LM_RUN: dict[str, Any] = {"max_new_tokens": 16}
"""What ``--policy lm`` adds on such a game (prompts list the legal moves by name): short answers.
A move name is at most ~10 tokens (Hanabi's "(Reveal player +1 color R)"), and the parser takes
the one legal move an answer names."""

TABULAR_RUN: dict[str, Any] = {"agent_learning_rate": 0.1, "critic_learning_rate": 0.1}
"""What ``--policy tabular`` sets unless given: learning rates for tables of logits (and of
values). The configs' 5e-6 is for a language model's weights; a table moves by about the rate per
AdamW step, so at 5e-6 it stays uniform for thousands of steps. 0.1 is what benchmarks/tiny_hanabi.py
trains every policy and critic at (docs/games.md)."""


LEARNER_FAMILIES = {
    "magrpo": "reinforce",
    "mareinforce": "reinforce",
    "marloo": "reinforce",
    "maremax": "reinforce",
    "iac": "actor_critic",
    "maac": "actor_critic",
    "madpo": "preference",
    "madpoiter": "preference",
    "marlhf": "rlhf",
    "marlhfiter": "rlhf",
}
"""The family of each learner the command lists: the embedded defaults are made per family."""

FOREIGN_FIELDS: dict[str, tuple[str, ...]] = {
    "reinforce": (),
    # answer g of every agent forms joint action g, and the critic makes the advantages
    "actor_critic": ("joint_mode", "advantage_mode"),
    # MADPO's reference enters the DPO margins (dpo_reference), not a KL penalty on returns
    "preference": ("reference_kl_enabled", "reference_kl_coef"),
    # MARLHF's RL phase is a REINFORCE learner: the reference KL penalty applies there
    "rlhf": (),
}
"""Fields of the embedded defaults (REINFORCE settings) that a family's config refuses or
ignores: dropped from its defaults, so a user who never named them never meets them."""

TINY_FAMILY_RUNS: dict[str, dict[str, Any]] = {
    "reinforce": {},
    # tests/test_actor_critic_lm.py: IAC and MAAC gain +0.10 (seeds 0-2) over 48 items at this rate
    "actor_critic": {"critic_learning_rate": 3e-4},
    # tests/test_preference_lm.py: MADPO gains > 0.05 on the writing reward with these (slow test)
    "preference": {"preference_num_candidates": 4, "preference_pairs_per_sample": 4, "dpo_beta": 0.1},
    # tests/test_preference_lm.py: the reward model of a tiny team fits at this rate
    "rlhf": {"preference_num_candidates": 4, "preference_pairs_per_sample": 4, "reward_learning_rate": 1e-3, "reward_num_train_epochs": 1},
}
"""What :data:`DEFAULT_RUN` changes for each family's tiny run (``--model tiny --learner NAME``):
a handful of candidates instead of the anchor's 80 or 20, so one pass over the 64 items takes
about as long as MAGRPO's."""

TINY_LEARNER_RUNS: dict[str, dict[str, Any]] = {
    "madpoiter": {"num_iterations": 2},
    "marlhfiter": {"num_iterations": 2},
}
"""Per learner, on top of :data:`TINY_FAMILY_RUNS`: two rounds instead of the anchor's six."""


def default_options(model: Any, learner: str = "magrpo") -> dict[str, Any]:
    """The embedded default run for ``--model`` (None: the main job's model) and ``--learner``:
    :data:`MAIN_RUN` for SmolLM2-135M-Instruct, :data:`DEFAULT_RUN` (the tiny-model writing run)
    otherwise; without the fields the learner's family does not use (:data:`FOREIGN_FIELDS`)
    and, for the tiny run, with the family's own settings (:data:`TINY_FAMILY_RUNS`)."""
    key = str(learner).lower()
    family = LEARNER_FAMILIES.get(key, "reinforce")
    if model is None or str(model).strip().lower() in {m.lower() for m in MAIN_RUN_MODELS}:
        options = dict(MAIN_RUN)
    else:
        options = dict(DEFAULT_RUN)
        options.update(TINY_FAMILY_RUNS[family])
        options.update(TINY_LEARNER_RUNS.get(key, {}))
    for name in FOREIGN_FIELDS[family]:
        options.pop(name, None)
    if key in LEARNERS:
        options["learner"] = key
    return options


class UsageError(Exception):
    """Bad usage — a flag, a config value, an env id, a model path or a folder (exit status 2)."""


def learner_config(name: str) -> type:
    """The config class of learner ``name`` alone: the REINFORCE and actor-critic configs import
    without torch, so the command parses and checks its flags before any heavy import."""
    import llm_marl.learners as learners

    key = str(name).lower()
    if key not in LEARNERS:
        raise UsageError(f"unknown learner {name!r}; choose one of {', '.join(LEARNERS)}")
    return getattr(learners, f"{LEARNERS[key]}Config")


def learner_classes(name: str) -> tuple[type, type]:
    """(config class, trainer class) of learner ``name`` (magrpo, mareinforce, marloo, maremax, iac, maac,
    madpo, marlhf, madpoiter, marlhfiter)."""
    import llm_marl.learners as learners

    return learner_config(name), getattr(learners, f"{LEARNERS[str(name).lower()]}Trainer")


# --- options: flags and YAML ----------------------------------------------------------------


def _metavar(hint: Any) -> str:
    from llm_marl.learners.config_types import describe

    text = describe(hint)
    for word, name in (("list", "LIST"), ("true or false", "true|false"), ("an int", "INT"), ("a float", "FLOAT")):
        if text.startswith(word) or text.startswith(f"a {word}"):
            return name
    return "TEXT"


def _add_config_flags(parser: argparse.ArgumentParser, config_class: type, learner: str) -> None:
    """One flag per config field, grouped by the config's sections, each with its doc and default."""
    from llm_marl.learners.config_docs import field_docs, field_sections
    from llm_marl.learners.config_types import field_types

    docs, sections, types_ = field_docs(config_class), field_sections(config_class), field_types(config_class)
    groups: dict[str, Any] = {}
    for field in dataclasses.fields(config_class):
        section = sections[field.name] or "fields"
        if section not in groups:
            groups[section] = parser.add_argument_group(f"{config_class.__name__} (--learner {learner}): {section}")
        flags = [f"--{field.name}"] + ([f"--{field.name.replace('_', '-')}"] if "_" in field.name else [])
        if field.name == "num_threads":
            flags.append("--threads")
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()  # type: ignore[misc]
        text = f"{plain_text(docs[field.name])} (default: {default!r})".replace("%", "%%")
        bare = {"nargs": "?", "const": "true"} if types_[field.name] is bool else {}  # a bool flag alone means true (--fsdp)
        groups[section].add_argument(
            *flags, dest=f"cfg_{field.name}", default=argparse.SUPPRESS, metavar=_metavar(types_[field.name]), help=text, **bare
        )


def plain_text(text: str) -> str:
    """Docstring text without its reStructuredText markup, for ``--help``: ````x```` -> x,
    ``:class:`~a.b.C``` -> C, ``:func:`label <target>``` -> label."""
    import re

    def role(match: "re.Match[str]") -> str:
        body = match.group(1)
        label = re.match(r"(.*?)\s*<[^>]*>$", body)
        if label:
            return label.group(1)
        return body.rpartition(".")[2] if body.startswith("~") else body.lstrip("!")

    text = re.sub(r":[a-z]+(?::[a-z]+)?:`([^`]+)`", role, text)
    return re.sub(r"``([^`]+)``", r"\1", text)


def _prescan(argv: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` in ``argv`` before parsing (``--flag V`` or ``--flag=V``)."""
    for i, token in enumerate(argv):
        if token == flag and i + 1 < len(argv):
            return argv[i + 1]
        if token.startswith(flag + "="):
            return token.split("=", 1)[1]
    return None


def _learner_of(argv: Sequence[str]) -> str:
    """The learner a command line asks for (``--learner``, else its ``--config`` file's), for help
    and flags; unknown names fall back to magrpo here and are reported when the run is built."""
    name = _prescan(argv, "--learner")
    config = _prescan(argv, "--config")
    if name is None and config and os.path.isfile(config):
        try:
            import yaml

            with open(config) as f:
                loaded = yaml.safe_load(f)
            if isinstance(loaded, dict) and loaded.get("learner"):
                name = str(loaded["learner"])
        except Exception:  # reported properly when the options are read
            pass
    return name.lower() if name and name.lower() in LEARNERS else "magrpo"


def _load_yaml(path: str) -> dict[str, Any]:
    import yaml

    if not os.path.isfile(path):
        raise UsageError(f"--config {path}: no such file")
    try:
        with open(path) as f:
            loaded = yaml.safe_load(f)
    except yaml.YAMLError as exc:
        raise UsageError(f"--config {path}: not valid YAML ({' '.join(str(exc).split())})") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise UsageError(f"--config {path}: expected a mapping of field: value, got {type(loaded).__name__}")
    return {str(k): v for k, v in loaded.items()}


def _check_keys(keys: Sequence[str], config_class: type, source: str) -> None:
    import difflib

    known = {f.name for f in dataclasses.fields(config_class)} | set(RUN_KEYS)
    unknown = sorted(set(keys) - known)
    if unknown:
        close = {k: difflib.get_close_matches(k, known, n=1) for k in unknown}
        hints = "; ".join(f"{k}: did you mean {m[0]}?" for k, m in close.items() if m)
        raise UsageError(
            f"{source}: unknown option(s) {unknown}{' (' + hints + ')' if hints else ''}; "
            "config fields are listed by `llm-marl train --help`"
        )


def _run_options(ns: argparse.Namespace, use_default: bool) -> tuple[dict[str, Any], set[str]]:
    """The run's options from the defaults, ``--config`` and flags, each config value typed by
    its field; and the keys the user gave (flags and YAML)."""
    from llm_marl.learners.config_types import ConfigTypeError, coerce_mapping, coerce_value, field_types

    loaded = _load_yaml(ns.config) if ns.config else {}
    learner = getattr(ns, "learner", None) or loaded.get("learner") or "magrpo"
    options: dict[str, Any] = default_options(getattr(ns, "model", None), learner) if use_default else {"policy": "tabular", "learner": "magrpo"}
    tiny_default = use_default and options["env"] == DEFAULT_RUN["env"]
    config_class = learner_config(learner)
    _check_keys(list(loaded), config_class, f"--config {ns.config}")
    options.update(coerce_mapping(config_class, loaded, source=ns.config or ""))
    explicit = set(loaded)
    for key in ("env", "policy", "model", "learner", "actions", "train_items", "system_prompt"):
        value = getattr(ns, key, None)
        if value is not None:
            options[key] = value
            explicit.add(key)
    if getattr(ns, "program", None):
        from llm_marl.programs.command import program_option

        try:
            options["env"] = program_option(ns.program, ns.agents, ns.items, options.get("env"))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        explicit.add("env")
    imports = options.get("import") or []
    imports = [imports] if isinstance(imports, str) else list(imports)
    options["import"] = imports + list(getattr(ns, "imports", None) or [])
    types_ = field_types(config_class)
    for key, value in vars(ns).items():
        if key.startswith("cfg_"):
            name = key[4:]
            try:
                options[name] = coerce_value(name, types_[name], value)
            except ConfigTypeError as exc:
                raise UsageError(f"--{exc}") from None
            explicit.add(name)
    if "train_items" in options and options["train_items"] is not None:
        count = options["train_items"]
        if isinstance(count, str):
            count = int(count) if count.strip().isdigit() else count
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise UsageError(f"--train-items must be an int >= 1 (the first N train rows), got {options['train_items']!r}")
        options["train_items"] = count
    if tiny_default and options.get("lora_r") is not None:
        options.update({k: v for k, v in DEFAULT_TEAM_RUN.items() if k not in explicit})
    return options, explicit


# --- building a run ---------------------------------------------------------------------------


def build_trainer(options: dict[str, Any], explicit: set[str] | None = None) -> Any:
    """A trainer from run options: env id, policy kind, model, learner and config fields
    (assembled by :mod:`llm_marl.assembly`, whose lines about the models are printed).

    ``explicit``: the option keys the user gave (None: all of them); sampling settings saved
    with a model (``llm_marl_policy.json``) yield only to explicit ones.
    """
    config_class = learner_config(options.get("learner", "magrpo"))
    fields = {f.name for f in dataclasses.fields(config_class)}
    _check_keys(list(options), config_class, "options")
    if not options.get("env"):
        raise UsageError("--env is required (see `llm-marl list`)")
    check_policy_flags(options)
    _import_modules(options.get("import") or [])
    turns = options.get("num_turns") if explicit is None or "num_turns" in explicit else None
    lm = options.get("policy") == "lm"
    if options.get("policy", "tabular") == "tabular":
        for key, value in TABULAR_RUN.items():
            if key in fields:
                options.setdefault(key, value)
    try:
        env = assembly.make_env(options["env"], None, turns, text=lm)
        eval_env = assembly.make_env(options["env"], "eval", turns, text=lm)
        if isinstance(getattr(env, "text", None), bool):  # a game with a text switch (OpenSpiel ids)
            for key, value in {**GAME_RUN, **(GAME_LM_RUN if lm else {})}.items():
                options.setdefault(key, value)
        if options.get("train_items"):
            env = assembly.limit_items(env, int(options["train_items"]), options["env"])
        args = assembly.make_config(config_class, {k: v for k, v in options.items() if k in fields}, env)
        policies = _make_policies(options, env, args, explicit)
        trainer_class = learner_classes(options.get("learner", "magrpo"))[1]  # torch loads here, if not before
        trainer = assembly.build_trainer(trainer_class, env, policies, args, eval_env)
    except assembly.AssemblyError as exc:
        raise UsageError(str(exc)) from None
    trainer.launch_identity = {k: options.get(k) for k in ("env", "policy", "model", "actions", "train_items")}
    return trainer


def check_policy_flags(options: dict[str, Any]) -> None:
    """Refuse ``--actions``, ``--model`` (and ``--policy``) values that cannot build a policy,
    before any env, model or torch is loaded (:func:`llm_marl.assembly.check_policy_options`)."""
    try:
        assembly.check_policy_options(
            options.get("policy", "tabular"), actions=options.get("actions"), model=options.get("model") or "tiny",
            lora_r=options.get("lora_r"), choice_answers=bool(options.get("choice_answers")),
        )
    except assembly.AssemblyError as exc:
        raise UsageError(str(exc)) from None


def _import_modules(names: Sequence[str]) -> None:
    """Import each ``--import`` module, looking in the current folder too (as ``--env module:attr``)."""
    if not names:
        return
    from llm_marl.envs.registry import import_here

    for name in names:
        try:
            import_here(name, name)
        except ImportError as exc:
            detail = str(exc).removeprefix(f"{name}: ")
            raise UsageError(f"--import {name}: cannot import it ({detail})") from None


def _make_policies(options: dict[str, Any], env: Any, args: Any, explicit: set[str] | None = None) -> list[Any]:
    """The run's policies, built by :func:`llm_marl.assembly.make_policies`; its lines are printed."""
    built = assembly.make_policies(
        options.get("policy", "tabular"), env.possible_agents, args, env=env, env_id=options["env"],
        actions=options.get("actions"), model=options.get("model") or "tiny",
        system_prompt=options.get("system_prompt"), explicit=explicit, quiet=True,
    )
    for line in built.lines:
        print(f"llm-marl: {line}")
    return built.policies


def _sample_prompts(trainer: Any, count: int = 3) -> list[str]:
    """The first ``count`` eval prompts (the first agent's, with the others' where they differ)."""
    env = trainer.eval_env or trainer.env
    prompts = []
    for index in range(min(count, len(getattr(env, "data", [0])))):
        fork = env.fork()
        observations, _ = fork.reset(options={"index": index})
        texts = list(dict.fromkeys(str(observations[agent]) for agent in getattr(fork, "acting_agents", None) or trainer.agents))
        prompts.append(" | ".join(texts))
    return prompts


def _samples(trainer: Any, count: int = 3) -> list[dict[str, str]]:
    """One answer per agent to the first ``count`` eval prompts (for the summary)."""
    env = trainer.eval_env or trainer.env
    shown = []
    for index in range(min(count, len(getattr(env, "data", [0])))):
        fork = env.fork()
        observations, _ = fork.reset(options={"index": index})
        entry = {}
        for agent in getattr(fork, "acting_agents", None) or trainer.agents:  # turn-based envs: who answers first
            [[completion]] = trainer.policies[agent].sample([observations[agent]], 1)
            entry[agent] = completion.text
        shown.append(entry)
    return shown


def cmd_train(ns: argparse.Namespace, argv: Sequence[str]) -> int:
    # Every check before build_trainer reads flags and folders only: torch loads after them.
    from llm_marl.runs import run_folder
    from llm_marl.runs.interrupt import TrainingInterrupted

    use_default = not ns.env and not ns.config and not ns.program
    options, explicit = _run_options(ns, use_default)
    resume = None
    if ns.resume is not None:
        resume = True if ns.resume == "latest" else ns.resume
    out = options.get("output_dir")
    if isinstance(resume, str) and not out:
        out = options["output_dir"] = os.path.dirname(os.path.abspath(resume))  # the checkpoint's run folder
    if resume and not out:
        raise UsageError("--resume needs the run folder: give --output_dir RUN (or output_dir in the --config file)")
    if not out:
        from llm_marl.runs.run_dir import default_run_dir

        out = options["output_dir"] = default_run_dir(options.get("env", "run"), options.get("learner", "magrpo"))
    main_rank = os.environ.get("RANK", "0") == "0"  # under torchrun rank 0 judges the folder (the others may find its first files)
    if ns.overwrite:
        if resume:
            raise UsageError("--overwrite starts a new run and --resume continues one: give one of them")
        options["overwrite_output_dir"] = True
        if main_rank and not run_folder.is_empty(out):  # now, before the evaluation that precedes training writes anything
            # (rank 0 alone: the others write nothing there before its claim of the folder, which they wait for)
            print(f"llm-marl: moved the previous contents of {out} aside to {run_folder.move_aside(out)}")
    if not resume and not options.get("overwrite_output_dir") and not run_folder.is_empty(out) and main_rank:
        raise UsageError(run_folder.refusal(out))
    if resume is True and (run_folder.is_empty(out) or not _list_checkpoints(out)):
        raise UsageError(f"nothing to resume in {out}: it holds no checkpoint (start the run without --resume)")
    if isinstance(resume, str) and not os.path.isdir(resume):
        raise UsageError(f"{resume}: no such checkpoint folder")  # checkpoint.verify's message, before torch loads
    if use_default:
        print(f"llm-marl: {'no arguments' if len(argv) <= 1 else 'no --env or --config'}, running the embedded default ({_describe_default(options)})")
    trainer = build_trainer(options, explicit)
    try:
        summary = train_and_summarize(trainer, options, resume)
    except TrainingInterrupted as stop:
        print(_interrupted_message(stop, argv, out), file=sys.stderr)
        return stop.exit_code
    if summary is not None:
        print(format_summary(summary))
        if os.path.isdir(os.path.join(options["output_dir"], "rollouts")):
            print(f"llm-marl: rollout trees recorded; see them with: llm-marl view {options['output_dir']}")
    return 0


def _list_checkpoints(out: str) -> list[str]:
    from llm_marl.runs import checkpoint  # imports torch: only for a folder that holds something

    return checkpoint.list_checkpoints(out)


def _describe_default(options: dict[str, Any]) -> str:
    model = options.get("model") or "tiny"
    kind = "LoRA adapters of" if options.get("lora_r") is not None else "full models"
    learner = str(options.get("learner", "magrpo")).lower()
    name = LEARNERS.get(learner, learner.upper())
    if model == "tiny":
        return f"two tiny local LMs ({kind.split(' of')[0]}), {name}, {options['env']}"
    return f"{kind} {model}, {name}, {options['env']}"


def resume_command(argv: Sequence[str], output_dir: str) -> str:
    """The ``llm-marl`` command line that resumes the run started by ``argv`` in ``output_dir``."""
    kept: list[str] = []
    skip = False
    for i, token in enumerate(argv):
        if skip:
            skip = False
            continue
        if token in ("--overwrite", "--resume") or token.startswith(("--resume=", "--output_dir=", "--output-dir=")):
            if token == "--resume" and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                skip = True
            continue
        if token in ("--output_dir", "--output-dir"):
            skip = True
            continue
        kept.append(token)
    return shlex.join(["llm-marl", *kept, "--output_dir", output_dir, "--resume"])


def _interrupted_message(stop: Any, argv: Sequence[str], output_dir: str) -> str:
    if stop.checkpoint:
        return f"llm-marl: stopped by {stop.signal_name}; checkpoint {stop.checkpoint}\nresume with: {resume_command(argv, output_dir)}"
    return (
        f"llm-marl: stopped at once by a second {stop.signal_name}; no checkpoint of the current batch "
        f"(resume from the run's last checkpoint, if it has one: {resume_command(argv, output_dir)})"
    )


EVAL_BEFORE_FILE = "eval_before.json"
"""The run's first evaluation and sample answers, written before training so that the summary of
a resumed run still shows "before" (``run_folder.OWN_ENTRIES`` lists it)."""


def train_and_summarize(trainer: Any, options: dict[str, Any], resume: str | bool | None = None) -> dict[str, Any] | None:
    """Evaluate, train, evaluate again, save the models to ``output_dir/final`` and write
    ``summary.json``; returns the summary (None on ranks other than 0).

    A new run records its first evaluation in ``output_dir/eval_before.json``; a resumed run
    reads it back, so its summary has "before" too, and counts the batches trained since the
    resume beside the run's total."""
    main_rank = trainer.dist.is_main
    run_dir = trainer.args.output_dir
    if main_rank:
        print(f"llm-marl: run directory {run_dir} (TensorBoard: tensorboard --logdir {run_dir}/logs)")
    sharded = bool(getattr(trainer, "sharded", None))  # fsdp: every rank gathers the weights, rank 0 plays
    first: dict[str, Any] = {}
    if not resume and (main_rank or sharded):
        before = trainer.evaluate()
        with trainer.gathered_weights():
            samples_before = _samples(trainer) if main_rank else None
        if main_rank:
            first = {"eval_before": before, "samples_before": samples_before}
            os.makedirs(run_dir, exist_ok=True)
            with open(os.path.join(run_dir, EVAL_BEFORE_FILE), "w") as f:
                json.dump(first, f, indent=2, default=str)
    elif main_rank and os.path.isfile(os.path.join(run_dir, EVAL_BEFORE_FILE)):
        with open(os.path.join(run_dir, EVAL_BEFORE_FILE)) as f:
            first = json.load(f)
    started = time.time()
    state = trainer.train(resume_from_checkpoint=resume)
    if sharded:
        after = trainer.evaluate()
        with trainer.gathered_weights():
            samples_after = _samples(trainer) if main_rank else None
        trainer.save_model(os.path.join(run_dir, "final"))
    if not main_rank:
        return None
    resumed_at = (getattr(trainer, "resumed_from", None) or {}).get("batch_step") if resume else None
    if not sharded:
        after = trainer.evaluate()
        samples_after = _samples(trainer)
    summary = {
        "options": dict(options),
        "seconds": round(time.time() - started, 1),
        "batches": state.batch_step,
        "resumed_from_batch": resumed_at,
        "batches_since_resume": state.batch_step - resumed_at if resumed_at is not None else None,
        "optimizer_steps": state.global_step,
        "skipped_items": state.skipped_items,
        "eval_before": first.get("eval_before"),
        "eval_after": after,
        "sample_prompts": _sample_prompts(trainer),
        "samples_before": first.get("samples_before"),
        "samples_after": samples_after,
    }
    if not sharded:
        trainer.save_model(os.path.join(run_dir, "final"))
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, default=str)
    return summary


def metric_order(name: str) -> list[Any]:
    """Sort key of metric names with their numbers read as numbers: turn_2 before turn_10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def format_summary(summary: dict[str, Any]) -> str:
    """The end-of-run table: eval metrics before and after training (turns in number order), and sample answers."""
    before, after = summary.get("eval_before") or {}, summary.get("eval_after") or {}
    names = sorted(set(before) | set(after), key=metric_order)
    width = max([len(n) for n in names] + [6])
    trained = f"trained {summary['batches']} batches"
    if summary.get("resumed_from_batch") is not None:
        trained += f" in all ({summary['batches_since_resume']} since the resume from batch {summary['resumed_from_batch']})"
    lines = ["", f"{trained}, {summary['optimizer_steps']} optimizer steps in all; {summary['seconds']} s in this session"
             if summary.get("resumed_from_batch") is not None else
             f"{trained}, {summary['optimizer_steps']} optimizer steps in {summary['seconds']} s"]
    lines.append(f"{'metric':<{width}}  {'before':>10}  {'after':>10}")
    for name in names:
        b = f"{before[name]:.4f}" if name in before else "-"
        a = f"{after[name]:.4f}" if name in after else "-"
        lines.append(f"{name:<{width}}  {b:>10}  {a:>10}")
    before_samples, after_samples = summary.get("samples_before") or [], summary.get("samples_after") or []
    prompts = summary.get("sample_prompts") or []
    for i in range(max(len(before_samples), len(after_samples))):
        if i < len(prompts):
            lines.append(f"eval item {i}: {prompts[i][-200:]!r}")
        for label, entries in (("before", before_samples), ("after", after_samples)):
            for agent, text in (entries[i] if i < len(entries) else {}).items():
                lines.append(f"  {label:<6} {agent}: {text[:160]!r}")
    return "\n".join(lines)


def cmd_eval(ns: argparse.Namespace, argv: Sequence[str]) -> int:
    options, explicit = _run_options(ns, use_default=not ns.env and not ns.config and not ns.program)
    options.pop("output_dir", None)
    if ns.checkpoint and not os.path.isdir(ns.checkpoint):
        raise UsageError(f"--checkpoint {ns.checkpoint}: no such checkpoint folder")
    trainer = build_trainer(options, explicit)
    if ns.checkpoint:
        from llm_marl.runs import checkpoint

        checkpoint.load(trainer, checkpoint.resolve(ns.checkpoint, None))
    metrics = trainer.evaluate()
    for name in sorted(metrics, key=metric_order):
        print(f"{name}\t{metrics[name]:.4f}")
    return 0


def cmd_list(ns: argparse.Namespace, argv: Sequence[str]) -> int:
    from llm_marl.envs import registered_ids
    from llm_marl.envs.registry import load_entry_points

    _import_modules(ns.imports or [])
    load_entry_points()
    print("environments:")
    for env_id in registered_ids():
        print(f"  {env_id}")
    print("learners:")
    for key, prefix in LEARNERS.items():
        print(f"  {key:<12} {prefix}Trainer / {prefix}Config")
    print("policies:\n  tabular      TabularPolicy over the task's menu (or --actions)\n  lm           CausalLMPolicy (--model PATH, a hub id, a named model from `llm-marl models`, or 'tiny')")
    print("custom environments: --env package.module:factory, --import MODULE, or an installed package's llm_marl.envs entry points")
    return 0


def cmd_models(ns: argparse.Namespace, argv: Sequence[str]) -> int:
    from llm_marl.policies import models

    print(f"named models (--model NAME; cache: {models.llm_marl_home()}, set LLM_MARL_HOME to move it):")
    states = {
        "cached": "cached",
        "damaged": "not cached (an incomplete folder is there; rebuilt on first use)",
        "installed": "not cached (package installed; converted on first use)",
        "wheel": "not cached (wheel downloaded; converted on first use)",
        "absent": "not cached (fetched on first use)",
    }
    width = max(len(name) for name in models.MODELS)
    for name, spec in models.MODELS.items():
        state = models.cache_state(name)
        where = f" {models.model_dir(name)}" if state == "cached" else ""
        print(f"  {name:<{width}}  {states[state]}{where}")
        print(f"  {'':<{width}}  {spec.description}; {spec.license}")
        print(
            f"  {'':<{width}}  from {spec.requirement} ({spec.wheel_bytes / 1e6:.0f} MB wheel, "
            f"{spec.converted_bytes / 1e6:.0f} MB converted); on the hub: {spec.hub_id}"
        )
    print(f"  {'tiny':<{width}}  built locally on first use (a 2-layer GPT-2 for tests and quick checks)")
    return 0


def cmd_plot(ns: argparse.Namespace, argv: Sequence[str]) -> int:
    from llm_marl.plotting import plot_run

    if not os.path.isdir(ns.run_dir):
        raise UsageError(f"no such run folder: {ns.run_dir}")
    written = plot_run(ns.run_dir, ns.out)
    for path in written:
        print(path)
    return 0


def cmd_serve(ns: argparse.Namespace, argv: Sequence[str]) -> int:
    from llm_marl.serve import command

    return command.run(ns)


def cmd_view(ns: argparse.Namespace, argv: Sequence[str]) -> int:
    from llm_marl import viewer

    if not os.path.isdir(ns.run_dir):
        raise UsageError(f"view: run directory {ns.run_dir!r} does not exist (give the output_dir of a run)")
    if ns.serve:
        viewer.serve(ns.run_dir, ns.port)
        return 0
    path = viewer.write_page(ns.run_dir, ns.out)
    print(f"llm-marl view: wrote {path} (open it in a browser; it needs no network)")
    return 0


DESCRIPTION = "llm-marl: train teams of language models to cooperate with reinforcement learning."

EPILOG = """\
first commands:
  llm-marl train                  the main job: two SmolLM2-135M-Instruct LoRA adapters learn to
                                  agree on answers (NameMatch-v0); about 3 min 30 s on a quiet
                                  2-core CPU, plus about 45 s to fetch and convert the model once
  llm-marl train --model tiny     the same loop on two tiny local GPT-2s (WritingCollab-v0; add
                                  --learner NAME for any learner of `llm-marl list`)
  llm-marl list                   environments, learners and policies
  llm-marl train --help           every config field as a flag

A run ends with a table of eval reward before and after training and sample answers, and leaves
TensorBoard logs, checkpoints, summary.json and the trained agents (final/) in its run folder."""


class _Parser(argparse.ArgumentParser):
    """argparse, with errors as one line (no usage dump) raised as UsageError."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The ``llm-marl`` parser; ``argv`` selects the learner whose config fields become flags."""
    learner = _learner_of(argv)
    # Only `train` and `eval` need the learner's config class (a preference learner's imports
    # torch): `--help`, `list` and `models` build their parsers without importing it. The trainer
    # class is not imported here, so a bad flag (and `train --help`) needs no torch for the
    # REINFORCE and actor-critic learners. parser() with no argv is complete.
    command = next((token for token in argv if not token.startswith("-")), None)
    config_class = learner_config(learner) if command in ("train", "eval") or not argv else None
    root = _Parser(prog="llm-marl", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    commands = root.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--debug", action="store_true", help="show the traceback of an error")
        p.add_argument("--import", dest="imports", action="append", metavar="MODULE", help="import MODULE first (it registers env ids); repeatable")

    def run_flags(p: argparse.ArgumentParser) -> None:
        group = p.add_argument_group("run")
        group.add_argument("--config", help="YAML file of config fields and env/policy/learner/model/actions/import")
        group.add_argument("--env", help="env id (`llm-marl list`), an entry point package.module:factory, or an id from --import or an installed package's llm_marl.envs entry points")
        group.add_argument("--program", metavar="FILE.py:FUNCTION", help="train the agents of a program(item, client) written with the openai client (docs/programs.md); instead of --env")
        group.add_argument("--agents", metavar="A,B", help="with --program: the model names it calls (default: its module's agents)")
        group.add_argument("--items", metavar="FILE.jsonl", help="with --program: its items, one JSON object a line (default: its module's items)")
        group.add_argument("--policy", choices=["tabular", "lm"], help="policy kind for every agent (default tabular; lm without --env)")
        group.add_argument("--model", help="for --policy lm: a model folder, a run's final/ folder (a folder per agent: final/player_1 ..., or agent_i from older runs), a hub id, a named model (smollm2-135m; `llm-marl models`), or 'tiny'")
        group.add_argument("--learner", choices=sorted(LEARNERS), help=f"learner (default magrpo; this help shows {config_name})")
        group.add_argument("--system-prompt", "--system_prompt", dest="system_prompt", metavar="TEXT", help="for --policy lm with a chat template: a system message before each prompt")
        group.add_argument("--actions", help="comma-separated menu for --policy tabular (default: the task's menu)")
        group.add_argument("--train-items", "--train_items", dest="train_items", type=int, metavar="N", help="train on the first N dataset rows (a game: its first N deals) only (N >= 1)")
        common(p)
        if config_class is not None:
            _add_config_flags(p, config_class, learner)

    config_name = config_class.__name__ if config_class is not None else f"{LEARNERS[learner]}Config"
    config_file = config_class.__module__.replace(".", "/") if config_class is not None else "llm_marl/learners/config"
    description = (
        f"Train agents. Config class: {config_name} (--learner {learner}; fields documented in "
        f"{config_file}.py). Every field is a flag and a --config YAML key."
    )
    usage = "%(prog)s [--env ID | --config YAML] [--policy tabular|lm] [--learner NAME] [--FIELD VALUE ...]"
    train = commands.add_parser("train", allow_abbrev=False, help="train agents (no arguments: the embedded default run)", description=description, usage=usage + " [--resume | --overwrite]")
    state = train.add_argument_group("run folder")
    state.add_argument("--resume", nargs="?", const="latest", metavar="CHECKPOINT", help="continue the run in output_dir from its newest checkpoint (or from CHECKPOINT)")
    state.add_argument("--overwrite", action="store_true", help="start a new run in a non-empty output_dir, moving its old contents aside to OUTPUT_DIR.replaced-<time>")
    run_flags(train)
    train.set_defaults(func=cmd_train)

    evaluate = commands.add_parser("eval", allow_abbrev=False, help="evaluate policies on an env's eval split", description=description.replace("Train", "Evaluate"), usage=usage)
    evaluate.add_argument("--checkpoint", help="load policies from this checkpoint first")
    run_flags(evaluate)
    evaluate.set_defaults(func=cmd_eval)

    listing = commands.add_parser("list", help="list environments, learners and policies")
    common(listing)
    listing.set_defaults(func=cmd_list)

    listing_models = commands.add_parser("models", help="list the named models (--model NAME), their sizes and what is cached")
    common(listing_models)
    listing_models.set_defaults(func=cmd_models)

    plot = commands.add_parser("plot", help="write PNG learning curves of a run")
    plot.add_argument("run_dir")
    plot.add_argument("--out", help="output folder (default RUN_DIR/plots)")
    plot.add_argument("--debug", action="store_true", help="show the traceback of an error")
    plot.set_defaults(func=cmd_plot)

    view = commands.add_parser("view", help="write (or --serve) an HTML viewer of a run's recorded rollout trees")
    view.add_argument("run_dir")
    view.add_argument("--out", help="output file (default RUN_DIR/viewer.html)")
    view.add_argument("--serve", action="store_true", help="serve the viewer on 127.0.0.1 instead of writing a file")
    view.add_argument("--port", type=int, default=8765, help="port for --serve (0: any free port)")
    view.set_defaults(func=cmd_view)

    from llm_marl.serve.command import add_arguments as serve_arguments

    serve = commands.add_parser("serve", allow_abbrev=False, help="answer OpenAI-compatible requests (/v1/chat/completions ...) from a run's final/ agents or a model", description="Serve agents over an OpenAI-compatible HTTP endpoint: each agent is a model name. See docs/serving.md.")
    serve_arguments(serve)
    serve.set_defaults(func=cmd_serve)
    return root


USAGE_ERRORS = {
    "llm_marl.learners.config_types": ("ConfigTypeError",),
    "llm_marl.runs.run_folder": ("RunFolderError",),
    "llm_marl.runs.checkpoint": ("NothingToResume", "NoSuchCheckpoint"),
    "llm_marl.envs.registry": ("UnknownEnvError",),
    "llm_marl.policies.models": ("ModelUnavailable",),
}
"""Exceptions of other modules that are bad usage (exit status 2), by module."""


def _usage_errors() -> tuple[type, ...]:
    """:class:`UsageError` and the :data:`USAGE_ERRORS` of the modules already imported: an
    exception of a module not imported cannot have been raised, and importing it to check
    (``runs.checkpoint`` imports torch) would make every early error slow."""
    loaded = [sys.modules[name] for name in USAGE_ERRORS if name in sys.modules]
    return (UsageError, *(getattr(module, cls) for module in loaded for cls in USAGE_ERRORS[module.__name__]))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns its exit status (0; 2 bad usage; 1 run failure; 130/143 signals)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    import warnings

    formatwarning = warnings.formatwarning
    warnings.formatwarning = lambda message, category, *rest, **kw: f"llm-marl: warning: {message}\n"
    from llm_marl.runs.interrupt import TrainingInterrupted

    def on_sigterm(signum: int, frame: Any) -> None:
        raise TrainingInterrupted(signum, None, immediate=True)

    in_main_thread = signal.getsignal(signal.SIGTERM) is not None and _main_thread()
    previous = signal.signal(signal.SIGTERM, on_sigterm) if in_main_thread else None
    from llm_marl.runs import progress

    shown = progress.enable(True)  # the command shows every long phase, piped or not
    try:
        ns = parser(argv).parse_args(argv)
        return ns.func(ns, argv)
    except TrainingInterrupted as stop:
        print(f"llm-marl: stopped by {stop.signal_name} outside training; nothing was written", file=sys.stderr)
        return stop.exit_code
    except KeyboardInterrupt:
        print("llm-marl: interrupted outside training; nothing was written", file=sys.stderr)
        return 130
    except Exception as exc:
        if debug:
            raise
        if isinstance(exc, _usage_errors()):
            print(f"llm-marl: error: {exc}", file=sys.stderr)
            return 2
        print(f"llm-marl: error: {type(exc).__name__}: {exc}\n(run again with --debug for the traceback)", file=sys.stderr)
        return 1
    finally:
        progress.enable(shown)
        warnings.formatwarning = formatwarning
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


if __name__ == "__main__":
    raise SystemExit(main())

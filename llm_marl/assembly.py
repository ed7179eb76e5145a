"""Assembling a run: which model(s), which learner, which env, turned into policies and a trainer.

Both ways to start a run build their agents here, through :func:`build_policies`: the
``llm-marl`` command (:mod:`llm_marl.cli`, ``--model``) and the drop-in constructor
(``MAGRPOTrainer(agent_model=..., ...)``, :mod:`llm_marl.comlrl.anchor_compat`). So a model
source means the same in a YAML file and in a CoMLRL script:

- ``"tiny"``: the tiny local GPT-2 (:mod:`llm_marl.policies.tiny`), built on first use and cached;
- a named model such as ``"smollm2-135m"`` (``llm-marl models``, :mod:`llm_marl.policies.models`),
  fetched and converted on first use and cached; a near miss (``smollm2-135n``) is refused at once;
- a model folder or a hub id (``"gpt2"``); a local-looking path that does not exist is refused.
  Settings saved with a model (``llm_marl_policy.json``) are its defaults; the config's sampling
  fields override them where the caller counts them as given (``explicit``; None: all);
- a list, one source per agent;
- a folder of per-agent models, one folder per agent named as the agent (a run's ``final/``:
  ``final/player_1``) or ``agent_0 ... agent_{N-1}`` (runs saved before agents' own names were used);
- a team's saved adapters, ``agent_i/adapter_config.json`` or ``<agent>/adapter_config.json``
  (a LoRA team run's ``final/``, ``LoRATeam.save_pretrained``): the team is loaded on the base
  the adapters name and training continues them;
- loaded model objects: one (deep-copied per agent, so agents never share weights) or a list of
  distinct ones, with ``tokenizer=`` (one, copied per agent, or a list with one per agent);
- with ``args.lora_r`` set, ONE source: it is loaded once and every agent is a LoRA adapter on it
  (:class:`~llm_marl.policies.LoRATeam`: ``lora_alpha``, ``lora_target_modules``,
  ``gradient_checkpointing``, ``model_dtype``).

``model_config`` (the drop-in constructor's): ``dtype`` (or ``torch_dtype``),
``attn_implementation`` and ``special_tokens`` (added to the tokenizers; embeddings are
resized). Models go to ``args.agent_devices`` when given. :func:`build_policies` returns an
:class:`Assembled`: the policies in agent order, their tokenizers, and lines describing what was
built (the command prints them).

The command's other options are assembled here too: an env from a registry id or entry point
(:func:`make_env`, :func:`limit_items`), tabular policies over a menu (:func:`tabular_policies`),
the config (:func:`make_config`) and the trainer (:func:`build_trainer`). What can be refused
without building anything (a malformed menu, a model path that does not exist) is refused by
:func:`check_policy_options`, which imports no torch, so the command rejects such flags at once.

Errors are :class:`AssemblyError`, a ``ValueError``, naming the source as the caller spells it
(``label``: ``--model`` for the command, ``agent_model`` or ``agents`` for the constructor).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

SAMPLING_FIELDS = ("max_new_tokens", "temperature", "top_p", "top_k", "sample_dtype")
"""Config fields that set a language-model policy's sampling (shown in the description lines)."""

_CONFIG_FIELD = {"max_batch_size": "generation_batch_size"}
"""Policy settings whose config field has another name."""


class AssemblyError(ValueError):
    """A model source, a menu, an env id or a config that cannot be assembled into a run."""


@dataclass
class Assembled:
    """What :func:`build_policies` built."""

    policies: list[Any]
    """One policy per agent, in agent order."""
    tokenizers: list[Any]
    """Each policy's tokenizer."""
    lines: list[str] = field(default_factory=list)
    """What was built, one line each (the command prints them)."""


POLICY_KINDS = ("tabular", "lm")
"""The policy kinds :func:`make_policies` builds: a tabular policy per agent, or language models."""


def make_policies(
    kind: str,
    agents: Sequence[str],
    args: Any,
    *,
    env: Any = None,
    env_id: str | None = None,
    actions: Any = None,
    model: Any = "tiny",
    tokenizer: Any = None,
    model_config: dict[str, Any] | None = None,
    system_prompt: str | None = None,
    chat_template: bool | None = ...,  # type: ignore[assignment]
    explicit: set[str] | None = None,
    label: str = "--model",
    quiet: bool = False,
) -> Assembled:
    """The policies of ``agents``: the one path the ``llm-marl`` command and the CoMLRL-style
    constructor both build them through. ``kind="tabular"``: one
    :class:`~llm_marl.policies.tabular.TabularPolicy` per agent of ``env`` (:func:`tabular_policies`;
    no tokenizers); ``kind="lm"``: language models from the source ``model``
    (:func:`build_policies`, which the other keywords go to); ``quiet``: hush the model hub's
    download messages first."""
    choice = bool(getattr(args, "choice_answers", False))
    check_policy_options(kind, actions=actions, model=model, lora_r=getattr(args, "lora_r", None), label=label, choice_answers=choice)
    if kind == "tabular":
        policies = tabular_policies(env, actions, env_id)
        return Assembled(policies, [None] * len(policies))
    if quiet:
        quiet_downloads()
    built = build_policies(
        agents, model, args, tokenizer=tokenizer, model_config=model_config, system_prompt=system_prompt,
        chat_template=chat_template, explicit=explicit, label=label,
    )
    if choice:
        from llm_marl.policies.choice import ChoicePolicy

        built.policies = [ChoicePolicy(policy) for policy in built.policies]
        built.lines.append("answers: a choice among the moves each prompt lists (choice_answers), scored by each move's log-probability")
    return built


def check_policy_options(
    kind: str, *, actions: Any = None, model: Any = "tiny", lora_r: Any = None, label: str = "--model", choice_answers: bool = False,
) -> None:
    """Refuse what :func:`make_policies` would refuse before it builds anything, reading no
    model and importing no torch (the command checks its flags with it first): an unknown
    ``kind``; for ``tabular``, a malformed ``actions`` menu (:func:`parse_actions`); for ``lm``,
    several sources for one LoRA base, a local-looking path that does not exist or a near miss
    of a model name (:func:`check_model_source`); ``choice_answers`` with tabular policies."""
    if kind == "tabular":
        if choice_answers:
            raise AssemblyError("--choice_answers: language-model agents only (--policy lm); a tabular policy already chooses from its menu")
        if actions is not None:
            parse_actions(actions)
        return
    if kind != "lm":
        raise AssemblyError(f"unknown --policy {kind!r}; choose {' or '.join(POLICY_KINDS)}")
    if lora_r is not None and (isinstance(model, list) or (isinstance(model, str) and "," in model)):
        raise AssemblyError(f"--lora_r: the agents are adapters of ONE base model; give one {label}, not {model!r}")
    for source in model if isinstance(model, (list, tuple)) else [model]:
        if isinstance(source, (str, os.PathLike)):
            check_model_source(str(source), label)


def build_policies(
    agents: Sequence[str],
    model: Any,
    args: Any,
    *,
    tokenizer: Any = None,
    model_config: dict[str, Any] | None = None,
    system_prompt: str | None = None,
    chat_template: bool | None = ...,  # type: ignore[assignment]
    explicit: set[str] | None = None,
    label: str = "--model",
) -> Assembled:
    """Language-model policies for ``agents`` from the model source ``model`` (see the module
    docstring) and the config ``args``. ``chat_template``: passed to every policy (omitted: the
    policy's default or the model's saved setting); ``explicit``: the config fields the user
    gave (None: all)."""
    agents = list(agents)
    settings: dict[str, Any] = {} if system_prompt is None else {"system_prompt": str(system_prompt)}
    if chat_template is not ...:
        settings["chat_template"] = chat_template
    config = dict(model_config or {})
    saved = saved_adapters(model, agents)
    if getattr(args, "lora_r", None) is not None or saved is not None:
        return _adapter_team(agents, model, args, tokenizer, config, settings, saved, label)
    return _full_models(agents, model, args, tokenizer, config, settings, explicit, label)


def _full_models(
    agents: list[str], model: Any, args: Any, tokenizer: Any, config: dict[str, Any], settings: dict[str, Any],
    explicit: set[str] | None, label: str,
) -> Assembled:
    from llm_marl.policies.causal_lm import SETTINGS_FILE, CausalLMPolicy
    from llm_marl.policies.lm_runner import model_name

    sources, shared = _sources(model, agents, label)
    folders = [_folder(s) if isinstance(s, str) else s for s in sources]
    tokenizers = _tokenizers(tokenizer, folders, label, sources)
    models = [_load_model(f, i, config, shared, label, name=s) for i, (f, s) in enumerate(zip(folders, sources))]
    _add_special_tokens(models, tokenizers, config.get("special_tokens"))
    devices = args.agent_devices or [None] * len(agents)
    policies, lines = [], []
    for i, (agent, source, folder, lm, tok) in enumerate(zip(agents, sources, folders, models, tokenizers)):
        stored = _saved_settings(folder) if isinstance(folder, str) else {}
        options = _sampling_options(args, explicit if stored else None)
        policy = CausalLMPolicy(lm, tok, **{**stored, **options, **settings}, device=devices[i])
        shown = ", ".join(f"{f}={getattr(policy, f)!r}" for f in SAMPLING_FIELDS if f != "sample_dtype" or policy.sample_dtype)
        origin = f"; saved with the model, {SETTINGS_FILE}" if stored else ""
        name = source if isinstance(source, str) else model_name(source)
        lines.append(f"{agent}: model {name} ({shown}{origin})")
        policies.append(policy)
    return Assembled(policies, tokenizers, lines)


def _adapter_team(
    agents: list[str], model: Any, args: Any, tokenizer: Any, config: dict[str, Any], settings: dict[str, Any],
    saved: dict[str, str] | None, label: str,
) -> Assembled:
    """Every agent a LoRA adapter of one shared base (``args.lora_r``, or saved adapters that
    training continues on the base they name); every agent shares the base's tokenizer."""
    from llm_marl.policies.lm_runner import model_name
    from llm_marl.policies.lora_team import LoRATeam, team_options

    if isinstance(tokenizer, (list, tuple)):
        raise AssemblyError("args.lora_r: the agents share one base model, so pass one tokenizer, not a list")
    options, lines, base = team_options(args), [], model
    if isinstance(model, str):
        _check_not_a_misspelt_name(model, label)
    if saved is not None:
        with open(os.path.join(saved[agents[0]], "adapter_config.json"), encoding="utf-8") as handle:
            base = json.load(handle).get("base_model_name_or_path")
        if not base:
            raise AssemblyError(f"{label} {model}: its adapters do not name their base model (base_model_name_or_path)")
        lines.append(f"{label} {model}: one LoRA adapter per agent on base {base}; training continues them")
        options.update(r=None, alpha=None, target_modules=None)
    folder = _folder(base) if isinstance(base, str) else base
    [tok] = _tokenizers(tokenizer, [folder], label, [base])
    if getattr(args, "model_dtype", None) is not None:
        config.setdefault("dtype", args.model_dtype)
    lm = _load_model(folder, 0, config, False, label, name=base)
    _add_special_tokens([lm], [tok], config.get("special_tokens"))
    devices = set(args.agent_devices or [None])
    if len(devices) > 1:
        raise AssemblyError(f"args.lora_r: the adapters share one base model on one device; agent_devices lists {sorted(devices)}")
    team = LoRATeam.from_model(lm, tok, agents, adapters=saved, **options, **settings)
    device = devices.pop()
    if device is not None:
        team.to(device)
    if saved is None:
        lead = team.policies[agents[0]]
        name = named_as(folder) if isinstance(folder, str) else model_name(folder)
        shown = f"{name} ({folder})" if name != folder else name
        template = f"chat template on{', system prompt ' + repr(lead.system_prompt) if lead.system_prompt else ''}" if lead.uses_chat_template else "raw prompts (no chat template)"
        lines.append(f"model {shown}: one LoRA adapter per agent (r={args.lora_r}) on one frozen base; {template}")
    return Assembled([team.policies[agent] for agent in agents], [tok] * len(agents), lines)


def _sources(model: Any, agents: list[str], label: str) -> tuple[list[Any], bool]:
    """One source per agent, and whether they are one source repeated (objects are then copied):
    a list, a folder with one folder per agent (``<agent>`` or ``agent_0 ... agent_{N-1}``), or one source for all. A local-looking path
    that does not exist, or a near miss of a model name, is an error."""
    if isinstance(model, (list, tuple)):
        sources = [str(s) if isinstance(s, os.PathLike) else s for s in model]
        if len(sources) != len(agents):
            raise AssemblyError(f"{label}: {len(sources)} models for {len(agents)} agents {list(agents)}")
        _check_distinct_models(sources)
        shared = False
    elif isinstance(model, (str, os.PathLike)):
        from llm_marl.runs.run_dir import saved_agent_folders

        model = str(model)
        per_agent = saved_agent_folders(model, agents) if os.path.isdir(model) else None
        sources, shared = (per_agent, False) if per_agent is not None else ([model] * len(agents), True)
    else:
        sources, shared = [model] * len(agents), True
    for path in sources:
        if isinstance(path, str):
            check_model_source(path, label)
    return sources, shared


def check_model_source(path: str, label: str = "--model") -> None:
    """Refuse a model source string that cannot be one: a local-looking path (``/``, ``.``,
    ``~``, or two slashes) that does not exist, or a near miss of a model name."""
    local = path.startswith(("/", ".", "~")) or path.count("/") > 1 or os.sep != "/" and os.sep in path
    if path != "tiny" and local and not os.path.exists(os.path.expanduser(path)):
        raise AssemblyError(f"{label} {path}: no such folder (give a model folder, a hub id such as gpt2, or 'tiny')")
    _check_not_a_misspelt_name(path, label)


def _check_not_a_misspelt_name(model: str, label: str) -> None:
    """A source that is no folder but nearly a model name is a typo, refused at once (instead
    of minutes of hub retries ending in a connection error)."""
    import difflib

    from llm_marl.policies.models import MODELS

    names = [*MODELS, "tiny"]
    if model in names or os.path.exists(os.path.expanduser(model)):
        return
    near = difflib.get_close_matches(model.lower(), names, n=1, cutoff=0.75)
    if near:
        raise AssemblyError(f"{label} {model}: no such folder or named model; did you mean {near[0]}? (`llm-marl models` lists them)")


def _check_distinct_models(sources: list[Any]) -> None:
    first: dict[int, int] = {}
    for i, source in enumerate(sources):
        if isinstance(source, str):
            continue
        j = first.setdefault(id(source), i)
        if j != i:
            raise AssemblyError(
                f"agents[{j}] and agents[{i}] (agent_{j} and agent_{i}) are the same model object: they would "
                f"train one set of weights; pass a copy per agent (copy.deepcopy), or agent_model= (copied per agent)"
            )


def saved_adapters(model: Any, agents: Sequence[str]) -> dict[str, str] | None:
    """Agent -> adapter folder where ``model`` is a team's saved adapters: a run's ``final/``
    (``<agent>/``, or ``agent_0 ... agent_{N-1}`` from before) or ``LoRATeam.save_pretrained``'s ``<agent>/`` folders; else None."""
    if not isinstance(model, (str, os.PathLike)) or not os.path.isdir(model):
        return None
    from llm_marl.runs.run_dir import agent_folders

    for names in (agent_folders(list(agents)), [f"agent_{i}" for i in range(len(agents))], list(agents)):
        folders = [os.path.join(model, name) for name in names]
        if all(os.path.isfile(os.path.join(f, "adapter_config.json")) for f in folders):
            return dict(zip(agents, folders))
    return None


def named_as(folder: str) -> str:
    """The model name of a named model's cached folder (:mod:`llm_marl.policies.models`), else ``folder``."""
    from llm_marl.policies import models

    for name in models.MODELS:
        if os.path.abspath(folder) == os.path.abspath(models.model_dir(name)):
            return name
    return folder


def _folder(source: str) -> str:
    """The folder (or hub id) a string source loads from: ``tiny`` built on first use, a named
    model's cached folder."""
    if source == "tiny":
        from llm_marl.policies.tiny import build_tiny_model, default_model_dir

        return str(build_tiny_model(default_model_dir()))
    from llm_marl.policies.models import resolve_model

    return resolve_model(source)


def _saved_settings(folder: str) -> dict[str, Any]:
    """The policy settings saved with a model folder (``llm_marl_policy.json``), or {}."""
    from llm_marl.policies.causal_lm import _SETTING_NAMES, SETTINGS_FILE

    path = os.path.join(folder, SETTINGS_FILE)
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as handle:
        return {k: v for k, v in json.load(handle).items() if k in _SETTING_NAMES}


def _sampling_options(args: Any, explicit: set[str] | None) -> dict[str, Any]:
    """The config's policy settings (:func:`~llm_marl.policies.lora_team.policy_options`), only
    those whose field is in ``explicit`` (None: all)."""
    from llm_marl.policies.lora_team import policy_options

    options = policy_options(args)
    return options if explicit is None else {k: v for k, v in options.items() if _CONFIG_FIELD.get(k, k) in explicit}


@contextlib.contextmanager
def _loading(source: str, label: str) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise AssemblyError(f"{label} {source}: cannot load it ({str(exc).splitlines()[0]})") from None


def _tokenizers(tokenizer: Any, sources: list[Any], label: str, names: list[Any] | None = None) -> list[Any]:
    """One tokenizer per source (a folder or hub id, :func:`_folder`'s, or a loaded model):
    copies of the given one(s), else each string source's own (``names``: the sources as the
    user gave them, for messages)."""
    if isinstance(tokenizer, (list, tuple)):
        if len(tokenizer) != len(sources):
            raise AssemblyError(f"tokenizer: got {len(tokenizer)} tokenizers for {len(sources)} agents (tokenizers length must match)")
        return [copy.deepcopy(t) for t in tokenizer]
    if tokenizer is not None:
        return [copy.deepcopy(tokenizer) for _ in sources]
    from transformers import AutoTokenizer

    loaded = []
    for i, (source, name) in enumerate(zip(sources, names or sources)):
        if not isinstance(source, str):
            raise AssemblyError(f"agent {i} is a loaded model: pass tokenizer= (one, or a list with one per agent)")
        with _loading(name, label):
            loaded.append(AutoTokenizer.from_pretrained(source))
    return loaded


def _load_model(
    source: Any, index: int, model_config: dict[str, Any], shared: bool, label: str = "agent_model", name: str | None = None
) -> Any:
    """Agent ``index``'s model: loaded from a folder or hub id (:func:`_folder`'s; ``name``: the
    source as the user gave it, for messages), else the given causal LM (a copy when ``shared``)."""
    if isinstance(source, str):
        from transformers import AutoModelForCausalLM

        kwargs = {}
        dtype = model_config.get("dtype", model_config.get("torch_dtype"))
        if dtype is not None:
            kwargs[_dtype_keyword()] = dtype
        if model_config.get("attn_implementation") is not None:
            kwargs["attn_implementation"] = model_config["attn_implementation"]
        with _loading(name or source, label):
            return AutoModelForCausalLM.from_pretrained(source, **kwargs)
    if not hasattr(source, "generate"):
        raise TypeError(f"agent {index}: expected a model id/path or a causal LM, got {type(source).__name__}")
    return copy.deepcopy(source) if shared else source


def _dtype_keyword() -> str:
    """``from_pretrained``'s dtype keyword: ``dtype`` from transformers 4.56 on, ``torch_dtype``
    before (older versions would silently store an unknown ``dtype=`` in the config)."""
    import transformers
    from packaging.version import Version

    return "dtype" if Version(transformers.__version__).release >= (4, 56) else "torch_dtype"


def _add_special_tokens(models: list[Any], tokenizers: list[Any], special: dict[str, Any] | None) -> None:
    if not special:
        return
    for model, tok in zip(models, tokenizers):
        if tok.add_special_tokens(dict(special)):
            model.resize_token_embeddings(len(tok))


def quiet_downloads() -> None:
    """No Hugging Face download and loading progress bars (the command's output stays one line per step)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


# --- the command's other options ----------------------------------------------------------------


def make_env(env_id: str, split: str | None = None, num_turns: int | None = None, text: bool = False) -> Any:
    """``make(env_id)`` for the train split (``split`` None) or ``split`` (None where the env has
    no such split); ``num_turns`` (given by the user) must be taken by the env's factory and be
    the horizon it builds. ``text``: an env with a ``text`` switch that is off (an OpenSpiel
    game's tabular keys) is made again with ``text=True`` (prompts for language models)."""
    from llm_marl.envs import make
    from llm_marl.envs.registry import UnknownEnvError, find
    from llm_marl.learners.checks import env_horizon

    kwargs: dict[str, Any] = {} if split is None else {"split": split}
    if num_turns is not None:
        kwargs["num_turns"] = num_turns
    try:
        find(env_id)
        env = make(env_id, **kwargs)
    except UnknownEnvError as exc:
        raise AssemblyError(str(exc)) from None
    except (ImportError, AttributeError) as exc:
        message = str(exc)  # an entry point's own message starts with it
        raise AssemblyError(f"--env {message}" if message.startswith(f"{env_id}: ") else f"--env {env_id}: {message}") from None
    except TypeError as exc:
        if num_turns is not None and "num_turns" in str(exc):
            fixed = make_env(env_id, split, None)  # a fixed-length factory: N may be its own horizon
            horizon = env_horizon(fixed) if fixed is not None else None
            if fixed is not None and horizon == num_turns:
                return fixed
            played = f"{horizon} turn{'s' if horizon != 1 else ''}" if horizon is not None else "a fixed length"
            raise AssemblyError(
                f"--num_turns {num_turns}: the factory of env {env_id} does not take num_turns ({exc}); "
                f"its episodes have {played}: drop --num_turns"
            ) from None
        if split is not None and "split" in str(exc):
            return None  # a factory without splits: the trainer evaluates on the train env
        raise
    except (ValueError, KeyError, NotImplementedError):
        if split is None:
            raise
        return None  # no eval split
    played = env_horizon(env)
    if num_turns is not None and played is not None and played != num_turns:
        raise AssemblyError(f"--num_turns {num_turns}: env {env_id} was built with {played} turns per episode (its factory ignores num_turns)")
    if text and getattr(env, "text", None) is False:
        env = make(env_id, **kwargs, text=True)
    return env


def limit_items(env: Any, count: int, env_id: str) -> Any:
    """``env`` training on its first ``count`` dataset rows only (an env without a dataset but
    with ``num_items``, e.g. an OpenSpiel game's chance streams: its first ``count`` items)."""
    data = getattr(env, "data", None)
    if data is None and isinstance(getattr(env, "num_items", None), int):
        env.num_items = min(env.num_items, count)
        return env
    if data is None:
        raise AssemblyError(f"--train-items {count}: env {env_id} has no dataset to cut (no .data)")
    if count < len(data):
        env.data = data.select(range(count))
    return env


def tabular_policies(env: Any, actions: Any, env_id: str) -> list[Any]:
    """One :class:`~llm_marl.policies.tabular.TabularPolicy` per agent over ``actions`` (``a,b,c``
    or a list), else over the task's ``menu``, else over an OpenSpiel game's moves (its action
    ids ``0 .. num_distinct_actions - 1``, which the env reads as those moves)."""
    from llm_marl.policies.tabular import TabularPolicy

    if actions is None:
        menu = getattr(getattr(env, "task", None), "menu", None)
        game = getattr(env, "game", None)
        if not menu and hasattr(game, "num_distinct_actions"):
            menu = [str(a) for a in range(game.num_distinct_actions())]
        if not menu:
            raise AssemblyError(f"--policy tabular needs --actions a,b,c: env {env_id}'s task has no menu attribute")
        given = list(menu)
    else:
        given = parse_actions(actions)
    return [TabularPolicy(given) for _ in env.possible_agents]


def parse_actions(actions: Any) -> list[str]:
    """The menu ``actions`` names (``a,b,c`` or a list): non-empty, distinct answers, else an
    :class:`AssemblyError` naming ``--actions``."""
    given = [a.strip() for a in actions.split(",")] if isinstance(actions, str) else [str(a) for a in actions]
    if not given or any(a == "" for a in given):
        raise AssemblyError(f"--actions {actions!r}: give a comma-separated menu of non-empty answers, e.g. --actions alpha,beta")
    if len(set(given)) != len(given):
        raise AssemblyError(f"--actions {actions!r}: answers must be distinct")
    return given


def make_config(config_class: type, settings: dict[str, Any], env: Any) -> Any:
    """``config_class(**settings)``, its agent count and horizon taken from ``env`` unless given."""
    from llm_marl.learners.checks import env_horizon
    from llm_marl.learners.config_types import coerce_mapping

    try:
        values = coerce_mapping(config_class, settings)
        values.setdefault("num_agents", len(env.possible_agents))
        values.setdefault("num_turns", env_horizon(env) or 1)  # a task's horizon, or an env's own (OpenSpiel games)
        return config_class(**values)
    except ValueError as exc:
        raise AssemblyError(f"config: {exc}") from None


def build_trainer(trainer_class: type, env: Any, policies: Sequence[Any], args: Any, eval_env: Any = None) -> Any:
    """``trainer_class(env=, policies=, args=, eval_env=)``; what the trainer refuses is an :class:`AssemblyError`."""
    try:
        return trainer_class(env=env, policies=list(policies), args=args, eval_env=eval_env)
    except AssemblyError:
        raise
    except ValueError as exc:
        raise AssemblyError(str(exc)) from None

"""Which policies answer: a run's ``final/`` folder, a model, or a LoRA team.

:func:`load_agents` builds the policies through the same assembly as training
(:func:`llm_marl.assembly.build_policies`), so a model source means what it means to
``llm-marl train --model``:

- a run's ``final/`` folder (or any ``save_model`` folder): one folder per agent, full models
  (``config.json``) or LoRA adapters (``adapter_config.json``, served as a team on the one base
  they name). The agents are the folders found there (``critic/`` and ``reward_model/`` are
  not agents), in name order, unless ``agents`` names them;
- a single model folder: served under the names ``agents`` (default: the folder's name);
- ``model`` (``tiny``, a named model such as ``smollm2-135m``, a folder or a hub id) with
  ``agents``: one copy of the model per agent, or with ``lora_r`` one base and a fresh LoRA
  adapter per agent (a team: every agent's requests share one decode loop).

Each agent's sampling settings are those saved with it (``llm_marl_policy.json``), else
temperature 1, top_p 1, no top-k and 256 new tokens (OpenAI's defaults); a request's own
``temperature``, ``top_p``, ``top_k`` and ``max_tokens`` override them for that request.
"""

from __future__ import annotations

import os
import types
from dataclasses import dataclass
from typing import Any, Sequence

__all__ = ["Agents", "DEFAULT_SAMPLING", "agents_in", "load_agents"]

DEFAULT_SAMPLING = {"max_new_tokens": 256, "temperature": 1.0, "top_p": 1.0, "top_k": None}
"""An agent's sampling settings when none were saved with it."""


@dataclass
class Agents:
    """The served agents."""

    names: list[str]
    """The model names requests use, in ``/v1/models`` order."""
    policies: dict[str, Any]
    """Each name's policy."""
    lines: list[str]
    """What was loaded, one line each (the command prints them)."""


def agents_in(folder: str) -> list[str]:
    """The agent folders of a saved run (``final/``): sub-folders holding a model or an adapter,
    ``critic``/``reward_model`` excluded, in name order; [] for a folder that holds none."""
    from llm_marl.runs.run_dir import RESERVED_FOLDERS

    names = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name in RESERVED_FOLDERS or not os.path.isdir(path):
            continue
        if any(os.path.isfile(os.path.join(path, f)) for f in ("config.json", "adapter_config.json")):
            names.append(name)
    return names


def _args(stored: dict[str, Any], lora_r: int | None, device: str | None, count: int) -> Any:
    sampling = {**DEFAULT_SAMPLING, **{k: v for k, v in stored.items() if k in DEFAULT_SAMPLING}}
    return types.SimpleNamespace(
        **sampling,
        generation_batch_size=None,
        sample_dtype=stored.get("sample_dtype"),
        lora_r=lora_r,
        lora_alpha=16.0,
        lora_target_modules=None,
        gradient_checkpointing=False,
        model_dtype=None,
        agent_devices=[device] * count if device else None,
    )


def load_agents(
    source: str | None = None,
    *,
    model: str | None = None,
    agents: Sequence[str] | None = None,
    lora_r: int | None = None,
    device: str | None = None,
) -> Agents:
    """The policies to serve (see the module docstring). ``source``: a saved folder; or
    ``model`` with ``agents``. Errors are :class:`~llm_marl.assembly.AssemblyError` naming the
    flag."""
    from llm_marl import assembly

    if source is not None and model is not None:
        raise assembly.AssemblyError(f"serve: give a saved folder ({source}) or --model ({model}), not both")
    if source is None and model is None:
        raise assembly.AssemblyError("serve: give a run's final/ folder (or a model folder), or --model M --agents a,b")
    names = [str(a) for a in agents] if agents else None
    if source is not None:
        if not os.path.isdir(source):
            raise assembly.AssemblyError(f"serve {source}: no such folder (give a run's final/ folder or a model folder)")
        if lora_r is not None:
            raise assembly.AssemblyError("serve: --lora_r makes fresh adapters on --model; a saved folder keeps its own agents")
        found = agents_in(source)
        single = os.path.isfile(os.path.join(source, "config.json"))
        if names is None:
            names = found or ([os.path.basename(os.path.normpath(source))] if single else [])
        if not names:
            raise assembly.AssemblyError(f"serve {source}: no agent folders (<agent>/config.json or <agent>/adapter_config.json) and no model here")
        label, where = "serve", source
    else:
        if not names:
            raise assembly.AssemblyError("serve --model: name the agents with --agents a,b (one model name per agent)")
        label, where = "--model", model
    if len(set(names)) != len(names):
        raise assembly.AssemblyError(f"--agents: names must be distinct, got {names}")
    stored: dict[str, Any] = {}
    if source is not None:
        saved = assembly.saved_adapters(source, names)
        first = saved[names[0]] if saved else os.path.join(source, names[0])
        stored = assembly._saved_settings(first) if os.path.isdir(first) else {}
    args = _args(stored, lora_r, device, len(names))
    assembly.quiet_downloads()
    built = assembly.build_policies(names, where, args, explicit=set(), label=label)
    policies = dict(zip(names, built.policies))
    for policy in policies.values():
        policy.eval()
    return Agents(names, policies, list(built.lines))

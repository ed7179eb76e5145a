"""Checks a trainer runs on its inputs at construction, so that a mismatch fails before training.

- **Horizon**: the config's ``num_turns`` must equal the horizon the env declares (its task's
  ``num_turns``; a ``num_turns`` attribute on other envs). A task with ``num_turns = None``, or
  an env that declares nothing, plays the config's ``num_turns``. A mismatch raises
  ``ValueError`` naming both numbers: a 3-turn task trained with ``num_turns=2`` would otherwise
  never play its third turn.
- **Policies**: every policy must implement the :class:`~llm_marl.policies.base.Policy`
  protocol (``sample``, ``log_probs``, ``parameters``); a raw Hugging Face model raises
  ``TypeError`` naming the agent (wrap it in ``CausalLMPolicy``). No trainable parameter may
  belong to two agents — the same policy object twice, or two policies around one model — since
  those agents would then step the same weights: ``ValueError`` naming the agents (pass a copy,
  e.g. ``copy.deepcopy(policy)``). A policy without trainable parameters (a scripted partner)
  may serve several agents.
- **Menu policies** (``natural_gradient=True``): every trained policy must answer from a menu
  (``menu_logits``: a ``TabularPolicy``, or a language model with ``choice_answers``), else
  ``TypeError`` naming the agent; with an optimizer other than SGD a warning says that AdamW's
  per-coordinate scaling undoes the preconditioning.
"""

from __future__ import annotations

import warnings
from typing import Any, Mapping


def env_horizon(env: Any) -> int | None:
    """The number of turns ``env`` plays, or None where it declares none."""
    inner = getattr(env, "unwrapped", env)
    task = getattr(inner, "task", None)
    value = getattr(task, "num_turns", None) if task is not None else getattr(inner, "num_turns", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def check_horizon(env: Any, num_turns: int, name: str = "env") -> None:
    """Raise ValueError when ``env`` declares a horizon other than the config's ``num_turns``."""
    horizon = env_horizon(env)
    if horizon is not None and horizon != num_turns:
        task = getattr(getattr(env, "unwrapped", env), "task", None)
        what = f"task {task.task_name}" if hasattr(task, "task_name") else type(env).__name__
        raise ValueError(
            f"num_turns is {num_turns} in the config but {name} ({what}) plays {horizon} turns; "
            f"set num_turns={horizon} in the config, or build the env with num_turns={num_turns}"
        )


def check_policies(policies: Mapping[str, Any]) -> None:
    """Raise unless every value is a Policy and no trainable parameter is shared by two agents."""
    from llm_marl.policies.base import Policy  # torch: imported here, so env_horizon (the command's env checks) needs none

    for agent, policy in policies.items():
        if not isinstance(policy, Policy):
            missing = [m for m in ("sample", "log_probs", "parameters") if not callable(getattr(policy, m, None))]
            hint = " (wrap a Hugging Face model in CausalLMPolicy(model, tokenizer))" if hasattr(policy, "generate") else ""
            raise TypeError(
                f"policy of agent {agent!r} is a {type(policy).__name__}, which does not implement the Policy "
                f"protocol: missing {', '.join(missing)}{hint}"
            )
    owner: dict[int, str] = {}
    for agent, policy in policies.items():
        for parameter in policy.parameters():
            if not parameter.requires_grad:
                continue
            first = owner.setdefault(id(parameter), agent)
            if first != agent:
                same = "the same policy object" if policy is policies[first] else "policies sharing trainable weights"
                raise ValueError(
                    f"agents {first!r} and {agent!r} were given {same}: they would both step one set of "
                    f"weights; give each agent its own copy (e.g. copy.deepcopy)"
                )


def check_menu_policies(policies: Mapping[str, Any], optim: str) -> None:
    """For ``natural_gradient``: raise TypeError naming an agent whose trained policy has no
    ``menu_logits``; warn when ``optim`` is not "sgd"."""
    for agent, policy in policies.items():
        trained = any(p.requires_grad for p in policy.parameters())
        if trained and not hasattr(policy, "menu_logits"):
            raise TypeError(
                f"natural_gradient needs policies that answer from a menu (a TabularPolicy, or a language model with "
                f"choice_answers=True); agent {agent!r} has a {type(policy).__name__}"
            )
    if optim != "sgd":
        warnings.warn(
            f"natural_gradient with optim={optim!r}: the preconditioned gradient makes an SGD step move the menu logits "
            f"as a table's natural gradient would; AdamW rescales each coordinate and undoes that (use optim='sgd')",
            stacklevel=3,
        )

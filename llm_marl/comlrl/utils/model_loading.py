"""CoMLRL's ``comlrl.utils.model_loading``: a model's name, and one model source per agent.

llm_marl's CoMLRL-namespace trainers resolve ``agent_model`` / ``agents`` themselves
(:mod:`llm_marl.comlrl.anchor_compat`); these are CoMLRL's helpers for scripts that call them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional


def infer_model_name(source: Any) -> Optional[str]:
    """A name for ``source``: the string itself, a PEFT base model's type or path, a (wrapped)
    model's ``config._name_or_path`` or ``model_type``, else the class name; ``None`` for ``None``."""
    if source is None:
        return None
    if isinstance(source, str):
        return source
    base_config = getattr(getattr(source, "base_model", None), "config", None)
    if base_config is not None:
        name = getattr(base_config, "model_type", None) or getattr(base_config, "_name_or_path", None)
        if name:
            return str(name)
    base = getattr(source, "model", None) or getattr(source, "base_model", None) or source
    config = getattr(base, "config", None)
    name = (getattr(config, "_name_or_path", None) or getattr(config, "model_type", None)) if config is not None else None
    return str(name) if name else type(base).__name__


def _count_label(expected_count: int, expected_label: Optional[str]) -> str:
    return expected_label or f"num_agents ({expected_count})"


def resolve_model_sources(*, kind: str, model: Optional[Any], models: Optional[Sequence[Any]], expected_count: int,
                          expected_label: Optional[str] = None, model_label: str = "model") -> tuple[list[Any], Optional[str]]:
    """``expected_count`` model sources (``models``, or ``model`` repeated) and the first one's name.

    Both may be given only when ``models`` is a list of the right length whose names all match
    ``model``'s; every inconsistency is a ``ValueError`` naming ``kind`` and ``model_label``.
    """
    label = _count_label(expected_count, expected_label)
    listed = isinstance(models, Sequence) and not isinstance(models, (str, bytes))
    if model is not None and models is not None:
        if not listed:
            raise ValueError(f"Cannot provide both {model_label} and {kind} unless {kind} is a list of {label} model names.")
        if len(models) != expected_count:
            raise ValueError(f"{kind} length ({len(models)}) must match {label}.")
        name, names = infer_model_name(model), [infer_model_name(m) for m in models]
        if name is None or None in names:
            raise ValueError(f"Cannot verify consistency between {model_label} and {kind}; provide model names or omit one.")
        if any(n != name for n in names):
            raise ValueError(f"{model_label} and {kind} conflict: {name} != {names}.")
    if model is None and models is None:
        raise ValueError(f"Either {model_label} or {kind} must be provided.")
    if expected_count < 1:
        raise ValueError("expected_count must be >= 1.")
    if models is not None:
        if not listed:
            raise ValueError(f"{kind} must be a non-empty sequence.")
        if len(models) != expected_count:
            raise ValueError(f"{kind} length ({len(models)}) must match {label}.")
        sources = list(models)
    else:
        sources = [model] * expected_count
    if any(s is None for s in sources):
        raise ValueError(f"{kind} entries must be non-null.")
    return sources, infer_model_name(sources[0])


def freeze_model(model: Any) -> Any:
    """``model`` in eval mode with every parameter's ``requires_grad`` off."""
    model.eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model


__all__ = ["freeze_model", "infer_model_name", "resolve_model_sources"]

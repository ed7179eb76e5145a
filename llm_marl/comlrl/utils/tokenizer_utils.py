"""CoMLRL's ``comlrl.utils.tokenizer_utils``: tokenizers with a pad token, one per agent or shared.

llm_marl's trainers load and fix their tokenizers themselves (a missing pad token becomes the
EOS token, as here); these are CoMLRL's helpers for scripts that call them directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase


def ensure_pad_token(tokenizer: Any) -> Any:
    """``tokenizer`` with its EOS token as pad token when it has none; ``ValueError`` if it still has no pad id."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.pad_token_id is None:
        raise ValueError("Tokenizer must expose pad_token_id.")
    return tokenizer


def ensure_tokenizer(model: Any, tokenizer: Any) -> Any:
    """``tokenizer``, or the one of the model named ``model``, with a pad token."""
    if tokenizer is not None:
        return ensure_pad_token(tokenizer)
    if model is None or isinstance(model, PreTrainedModel):
        raise ValueError("Tokenizer must be provided when model is a PreTrainedModel instance.")
    return ensure_pad_token(AutoTokenizer.from_pretrained(model))


def _several(tokenizer: Any) -> bool:
    return isinstance(tokenizer, Sequence) and not isinstance(tokenizer, (str, bytes, PreTrainedTokenizerBase))


def resolve_tokenizers(model: Any, tokenizer: Any, agents: Optional[Sequence[Any]]) -> Any:
    """One tokenizer (shared) or a list with one per agent, each with a pad token.

    Without ``agents``: ``tokenizer`` (a single one) or ``model``'s. With ``agents``: a list of
    tokenizers must have one per agent; none given loads one per agent name (model objects need
    tokenizers given).
    """
    if agents is None:
        if tokenizer is not None and not _several(tokenizer):
            return ensure_pad_token(tokenizer)
        return ensure_tokenizer(model, None)
    if tokenizer is None:
        names = isinstance(agents, Sequence) and not isinstance(agents, (str, bytes)) and all(isinstance(a, str) for a in agents)
        if not names:
            raise ValueError("Tokenizer(s) must be provided when agents are model objects.")
        return [ensure_pad_token(AutoTokenizer.from_pretrained(name)) for name in agents]
    if not _several(tokenizer):
        return ensure_pad_token(tokenizer)
    if len(tokenizer) != len(agents):
        raise ValueError("tokenizers length must match agents.")
    return [ensure_pad_token(t) for t in tokenizer]


def apply_tokenizer_specials(tokenizer: Any, models: Sequence[Any]) -> None:
    """Write the tokenizer's pad id and EOS id (the pad id when it has none) into each model's config
    (a wrapper's ``.model.config`` when it has one)."""
    tokenizer = ensure_pad_token(tokenizer)
    pad_id = tokenizer.pad_token_id
    eos_id = tokenizer.eos_token_id or pad_id
    for model in models:
        if model is None:
            continue
        inner = model.model if hasattr(model, "model") and hasattr(model.model, "config") else model
        if hasattr(inner, "config"):
            inner.config.pad_token_id = pad_id
            inner.config.eos_token_id = eos_id


__all__ = ["apply_tokenizer_specials", "ensure_pad_token", "ensure_tokenizer", "resolve_tokenizers"]

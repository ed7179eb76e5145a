"""A request's prompts as the token ids an agent's policy samples from, checked against its context.

A chat request's messages go through the policy's chat template exactly as an observation that
is a list of messages does in training (:meth:`~llm_marl.policies.CausalLMPolicy.render_prompt`:
its ``system_prompt`` first where the messages have none, the assistant's turn opened), tokenized
without adding special tokens again. A model without a chat template (the tiny GPT-2) gets the
messages' contents joined by newlines as raw text, so one user message is exactly the raw prompt
a task would have given it. A completion request's prompt is raw text (tokenized as the policy
tokenizes raw prompts) or token ids.

Unlike training, which cuts an over-long prompt from the left, the server refuses it: a prompt
with no room for one new token, or a ``max_tokens`` that does not fit beside it, is a 400
``context_length_exceeded`` (:func:`~llm_marl.serve.protocol.context_length_exceeded`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from llm_marl.serve import protocol

__all__ = ["answer_budget", "chat_prompt_ids", "chat_prompt_text", "text_prompt_ids"]


def chat_prompt_text(policy: Any, messages: Sequence[Mapping[str, str]]) -> str:
    """The text a chat request's messages become for ``policy`` (see the module docstring)."""
    if policy.uses_chat_template:
        return policy.render_prompt([dict(m) for m in messages])
    return "\n".join(m["content"] for m in messages)


def chat_prompt_ids(policy: Any, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """The token ids of a chat request's prompt for ``policy``."""
    text = chat_prompt_text(policy, messages)
    special = policy.add_special_tokens and not policy.uses_chat_template
    return _ids(policy, text, special)


def text_prompt_ids(policy: Any, prompt: str | Sequence[int], param: str = "prompt") -> list[int]:
    """The token ids of a completion request's prompt (raw text, or ids checked against the vocabulary)."""
    if isinstance(prompt, str):
        return _ids(policy, prompt, policy.add_special_tokens)
    vocab = len(policy.tokenizer)
    wrong = [t for t in prompt if not 0 <= t < vocab]
    if wrong:
        raise protocol.bad_request(f"prompt token id {wrong[0]} is outside the vocabulary (0 to {vocab - 1}).", param, "invalid_value")
    return list(prompt)


def _ids(policy: Any, text: str, special: bool) -> list[int]:
    ids = list(policy.tokenizer(text, add_special_tokens=special, verbose=False)["input_ids"])
    return ids or [policy._empty_prompt_id]


def answer_budget(policy: Any, prompt_tokens: int, requested: int | None) -> int:
    """How many tokens an answer may have: ``requested`` (``max_tokens``), else the policy's own
    ``max_new_tokens`` cut to the room the context leaves; a 400 when the prompt leaves no room or
    ``requested`` does not fit."""
    context = policy.context_length
    if context is not None and prompt_tokens >= context:
        raise protocol.context_length_exceeded(context, prompt_tokens)
    if requested is not None:
        if context is not None and prompt_tokens + requested > context:
            raise protocol.context_length_exceeded(context, prompt_tokens, requested)
        return requested
    budget = policy.max_new_tokens
    return budget if context is None else min(budget, context - prompt_tokens)

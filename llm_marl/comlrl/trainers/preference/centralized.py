"""CoMLRL's ``comlrl.trainers.preference.centralized``: the comparator adapters that turn every
role's prompt into one centralized prompt and split one centralized answer back into roles.

The trainers here are decentralized (one policy per agent); the adapters are importable and
usable on their own (``build_prompt`` / ``parse_completion``), and ``centralized_comparator_adapter=``
is accepted by the trainers and checked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence


class CentralizedComparatorParseError(ValueError):
    """A centralized answer holds none of the roles' sections."""


class CentralizedComparatorAdapter(Protocol):
    """What a centralized comparator needs from a task: one prompt for all roles, and the split."""

    def build_prompt(self, batch_item: Mapping[str, Any], agent_prompts: Sequence[str]) -> str:
        """One prompt asking for every role's answer."""

    def parse_completion(self, completion: str, batch_item: Mapping[str, Any], num_agents: int) -> Sequence[str]:
        """One answer per role, in role order."""


@dataclass(frozen=True)
class TaggedCentralizedComparatorAdapter:
    """Roles' answers in ``<agent_i> ... </agent_i>`` sections (i from 0), any case, any spacing
    inside the tags. A missing section is the empty answer; an answer with no section at all
    raises :class:`CentralizedComparatorParseError`."""

    def build_prompt(self, batch_item: Mapping[str, Any], agent_prompts: Sequence[str]) -> str:
        count = len(agent_prompts)
        originals = "\n\n".join(f"Agent {i} original prompt:\n{prompt}" for i, prompt in enumerate(agent_prompts))
        layout = "\n".join(f"<agent_{i}>\n...\n</agent_{i}>" for i in range(count))
        return (
            f"You are a centralized coordinator producing the separate outputs of {count} agents.\n\n"
            "Each output must satisfy its corresponding original prompt. Keep the outputs separate;\n"
            "do not merge them or add commentary outside the required tags.\n\n"
            f"{originals}\n\nReturn exactly one section for each agent in this format:\n{layout}\n"
        )

    def parse_completion(self, completion: str, batch_item: Mapping[str, Any], num_agents: int) -> list[str]:
        text = str(completion)
        outputs, found = [], False
        for i in range(num_agents):
            match = re.search(rf"<\s*agent_{i}\s*>(.*?)<\s*/\s*agent_{i}\s*>", text, flags=re.IGNORECASE | re.DOTALL)
            found = found or match is not None
            outputs.append(match.group(1).strip() if match else "")
        if not found:
            raise CentralizedComparatorParseError(f"the centralized answer has no <agent_i> section for any of the {num_agents} agents")
        return outputs


def check_adapter(adapter: Any, name: str = "centralized_comparator_adapter") -> Any:
    """``adapter`` (default: a :class:`TaggedCentralizedComparatorAdapter`) after checking that
    ``build_prompt`` and ``parse_completion`` are callable."""
    adapter = TaggedCentralizedComparatorAdapter() if adapter is None else adapter
    for method in ("build_prompt", "parse_completion"):
        if not callable(getattr(adapter, method, None)):
            raise TypeError(f"{name}.{method} must be callable (got {type(adapter).__name__})")
    return adapter


__all__ = ["CentralizedComparatorAdapter", "CentralizedComparatorParseError", "TaggedCentralizedComparatorAdapter"]

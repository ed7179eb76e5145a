"""ChoicePolicy: a language model that answers by choosing one move of a menu.

A free-text policy must first learn to *name* a legal move before it can learn which move to
make; in a game whose prompts differ in one token, the update that names a legal move lifts one
move at every prompt at once, and the policy settles on it (docs/games.md, "Player 1 alone").
A choice policy skips that step. At observation ``o`` with menu ``c_1 … c_M`` it answers
``c_j`` with probability::

    pi(c_j | o) = softmax_j( log p_LM(c_j | o) )

where ``log p_LM(c | o)`` is the wrapped policy's log-probability of the whole answer ``c``
(its tokens and the end of the answer, at the wrapped policy's score temperature). Sampling and
scoring compute this same distribution, so the sampler is the policy being trained; the
gradient of ``log pi`` flows into the wrapped model's trainable weights (a LoRA adapter, or the
full model).

``choices(observation)`` gives the menu; the default, :func:`listed_choices`, reads the moves an
:class:`~llm_marl.envs.openspiel.OpenSpielEnv` text prompt lists ("Choose one of: a, b, c."). A
fixed menu is a sequence of strings. An answer is one "token" to the learners (like a
:class:`~llm_marl.policies.tabular.TabularPolicy`'s): ``reduction="sum"`` and ``"mean"`` agree,
and the entropy the stall metrics log is the menu distribution's.

Everything else (parameters, ``state_dict``, ``save_pretrained``, ``train``/``eval``, ``to``)
is the wrapped policy's, so checkpoints and saved adapters are the same as without the wrapper.
Sampling runs one scoring pass of the wrapped model itself (no decoding), so its sampling
settings (``max_new_tokens``, ``top_p``, ``top_k``, a ``sample_dtype`` copy) do not apply; its
score temperature does. Draws come from torch's global RNG, which checkpoints keep.
The CLI builds it with ``--choice_answers`` (config ``choice_answers``).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterator, Sequence

import torch

from llm_marl.policies.base import Completion, GapMeter, sampler_record, take_token_entropy

LISTED = re.compile(r"Choose one of: (.+?)\.?\s*$", re.DOTALL)


def listed_choices(observation: str) -> list[str]:
    """The moves a prompt lists after its last "Choose one of: " (comma-separated, up to a final
    period): the menu of an :class:`~llm_marl.envs.openspiel.OpenSpielEnv` text prompt. Raises
    ``ValueError`` naming the prompt when it lists none."""
    text = observation if isinstance(observation, str) else ""
    _, found, tail = text.rpartition("Choose one of: ")
    match = LISTED.match(found + tail) if found else None
    names = [name.strip() for name in match.group(1).split(",")] if match else []
    if not names or not all(names):
        raise ValueError(f"ChoicePolicy: the prompt lists no moves after 'Choose one of: ': {observation!r}")
    return names


class ChoicePolicy:
    """``policy`` choosing among ``choices(observation)`` by its whole-answer log-probabilities."""

    def __init__(self, policy: Any, choices: Callable[[str], Sequence[str]] | Sequence[str] = listed_choices):
        if not hasattr(policy, "log_probs") or not hasattr(policy, "parameters"):
            raise TypeError(f"ChoicePolicy wraps a policy that scores answers (log_probs, parameters), got {type(policy).__name__}")
        if not callable(choices):
            menu = [str(c) for c in choices]
            if not menu or len(set(menu)) != len(menu):
                raise ValueError(f"ChoicePolicy: the menu must be distinct strings, at least one, got {menu}")
            choices = lambda observation, menu=menu: menu  # noqa: E731
        self.policy = policy
        """The wrapped language-model policy (its weights are this policy's)."""
        self.choices = choices
        self.sampler_gap = GapMeter("float32")
        """The sampler–scorer gap of this policy's answers (the menu distribution's log-probability)."""
        self.last_token_entropy: tuple[torch.Tensor, torch.Tensor] | None = None

    def menu(self, observation: str) -> list[str]:
        """The choices at ``observation`` (distinct, at least one)."""
        names = list(self.choices(observation))
        if not names or len(set(names)) != len(names):
            raise ValueError(f"ChoicePolicy: the menu at {observation!r} must be distinct strings, at least one, got {names}")
        return names

    def _menu_log_probs(self, observations: Sequence[str]) -> tuple[list[list[str]], list[torch.Tensor]]:
        """Per distinct observation (in first-seen order): its menu and ``log pi`` over it (1-D,
        differentiable where grad is enabled); one scoring call of the wrapped policy for all."""
        menus = [self.menu(o) for o in observations]
        flat_obs = [o for o, names in zip(observations, menus) for _ in names]
        flat = [Completion(name) for names in menus for name in names]
        scores = self.policy.log_probs(flat_obs, flat, reduction="sum")
        take_token_entropy(self.policy)  # the answers' token entropies are not this policy's
        tables, start = [], 0
        for names in menus:
            tables.append(torch.log_softmax(scores[start : start + len(names)].float(), dim=-1))
            start += len(names)
        return menus, tables

    def menu_logits(self, observation: str) -> torch.Tensor:
        """The menu's logits at ``observation`` (1-D, differentiable; ``pi`` is their softmax):
        each choice's whole-answer log-probability, from one scoring call of the wrapped policy
        (the prompt runs once where it shares prompts, :mod:`llm_marl.learners.natural_gradient`)."""
        names = self.menu(observation)
        logits = self.policy.log_probs([observation] * len(names), [Completion(name) for name in names], reduction="sum").float()
        take_token_entropy(self.policy)
        return logits

    def probabilities(self, observation: str) -> dict[str, float]:
        """``pi(choice | observation)`` for each choice of the menu, without gradient."""
        with torch.no_grad():
            [names], [table] = self._menu_log_probs([observation])
        return {name: float(p) for name, p in zip(names, table.exp())}

    def sample(self, observations: Sequence[str], num_samples: int) -> list[list[Completion]]:
        """``num_samples`` choices per observation, drawn from torch's global RNG (as the wrapped
        language model samples); each answer's ``action`` is its index in the menu."""
        distinct = list(dict.fromkeys(observations))
        with torch.no_grad():
            menus, tables = self._menu_log_probs(distinct)
        found = {o: (names, table) for o, names, table in zip(distinct, menus, tables)}
        answers = []
        for observation in observations:
            names, table = found[observation]
            picks = torch.multinomial(table.exp(), num_samples, replacement=True)
            answers.append([
                Completion(names[j], action=j, sampler=sampler_record(self, [float(table[j])])) for j in picks.tolist()
            ])
        return answers

    def log_probs(self, observations: Sequence[str], completions: Sequence[Completion], reduction: str = "sum") -> torch.Tensor:
        """``log pi(completion | observation)`` per pair (differentiable); a completion must be one
        of its observation's choices (``ValueError`` naming the pair otherwise)."""
        if reduction not in ("sum", "mean"):
            raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
        observations, completions = list(observations), list(completions)
        if len(observations) != len(completions):
            raise ValueError(f"{len(observations)} observations but {len(completions)} completions")
        distinct = list(dict.fromkeys(observations))
        menus, tables = self._menu_log_probs(distinct)
        where = {o: i for i, o in enumerate(distinct)}
        values, entropies = [], []
        for row, (observation, completion) in enumerate(zip(observations, completions)):
            i = where[observation]
            if completion.text not in menus[i]:
                raise ValueError(f"ChoicePolicy: answer {row} ({completion.text!r}) is not one of its prompt's choices {menus[i]}")
            table = tables[i]
            values.append(table[menus[i].index(completion.text)])
            entropies.append(-(table.exp() * table).sum())
        values_t = torch.stack(values) if values else torch.zeros(0)
        entropy = torch.stack(entropies).unsqueeze(1) if entropies else torch.zeros(0, 1)
        self.last_token_entropy = (entropy, torch.ones_like(entropy, dtype=torch.bool))
        ones = torch.ones(len(completions), 1, dtype=torch.bool)
        self.sampler_gap.measure(self, self.parameters(), completions, values_t.unsqueeze(1), ones)
        return values_t

    # --- the wrapped policy's weights -------------------------------------------------------------

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.policy.parameters()

    def named_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        return self.policy.named_parameters()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.policy.state_dict()

    def load_state_dict(self, state_dict: Any, strict: bool = True) -> Any:
        return self.policy.load_state_dict(state_dict, strict=strict)

    def save_pretrained(self, directory: Any) -> Any:
        return self.policy.save_pretrained(directory)

    def train(self, mode: bool = True) -> "ChoicePolicy":
        self.policy.train(mode)
        return self

    def eval(self) -> "ChoicePolicy":
        return self.train(False)

    def to(self, device: Any) -> "ChoicePolicy":
        self.policy.to(device)
        return self

    @property
    def training(self) -> bool:
        return bool(getattr(self.policy, "training", False))

    @property
    def tokenizer(self) -> Any:
        return self.policy.tokenizer

    @property
    def reference_policy(self) -> Callable[[], "ChoicePolicy"] | None:
        """Where the wrapped policy has a ``reference_policy()`` (a LoRA agent: the team's base),
        a function giving it as a choice policy over the same menus; else None (the reference-KL
        penalty then freezes a copy of this policy)."""
        own = getattr(self.policy, "reference_policy", None)
        return None if own is None else (lambda: ChoicePolicy(own(), self.choices))

    def __repr__(self) -> str:
        return f"ChoicePolicy({self.policy!r})"


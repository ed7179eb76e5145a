"""FunctionTask: a task built from the anchor library's plain callables.

Scripts written for CoMLRL describe a task with a dataset, a reward function, one formatter per
agent and an external transition. ``FunctionTask`` turns those into a
:class:`~llm_marl.tasks.base.CooperativeTask`, honouring CoMLRL's call conventions:

- ``reward_func`` is called once per joint answer with one single-element list per agent, in
  the form its signature asks for (as CoMLRL's reward caller does; :func:`reward_call`):
  ``f(answers_0, answers_1, ...)`` (also ``f(*answers)``); ``f(prompts, answers_0, ...)`` when it
  has one positional parameter more than there are agents (or its first is named ``prompts``);
  ``f([answers_0, answers_1, ...])`` when it has one positional parameter (and there are several
  agents). Parameters named ``batch_items`` (and ``prompts`` when not first) are never counted
  as positional: unlike CoMLRL 1.4.3's aligned mode, ``f(a, b, batch_items=None)`` does get
  its items. ``batch_items=[item]`` is
  added when it names ``batch_items`` or takes ``**kwargs``, and ``prompts=`` when it names
  ``prompts`` (or takes ``**kwargs``) and did not get them positionally. ``prompts`` is a
  one-element list: agent 0's prompt at this turn. A reward function without an inspectable
  signature gets ``f(answers_0, answers_1, ...)``. It returns one float, a list of one float
  (the shared reward), a list of N floats (agent i's reward at position i) or a dict mapping
  agent index or name to its reward; ``reward_processor`` (float -> float) is applied to each
  value. Any other length raises: no value is dropped. CoMLRL's actor-critic trainers read a
  list of length G (``num_generations``) per generation, checked before N, so with N == G
  per-agent rewards cannot be expressed there (its Q6). Here the function is called once per
  joint answer, with ONE answer per agent, so a per-generation list has length 1 and a list of
  N values is always per agent. Values that differ reach the learners as per-agent rewards
  (IAC and MAAC train on them; the MAGRPO family, which needs one shared reward, raises).
- ``formatters[i](item)`` gives agent i's first prompt. At later turns, unless
  ``external_prompt_passthrough`` is True, the item's ``"prompt"`` is replaced by the
  transition's text and the formatter is called as ``formatter(item, external_prompts=text)``
  when it accepts that keyword (else ``formatter(item)``); with passthrough the transition's text
  is the prompt verbatim. The reward function always sees the original item.
- ``external_transition(prompt=item["prompt"], agent_completions=[one text per agent],
  num_agents=N, prompt_history_per_agent=[[prompts so far] per agent],
  response_history_per_agent=[[answers so far] per agent]) -> N strings``; the histories include
  the turn just played. Required when ``num_turns > 1``.

Agents are named ``agent_0 … agent_{N-1}``.
"""

from __future__ import annotations

import inspect
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

if TYPE_CHECKING:
    import datasets

from llm_marl.tasks.base import CooperativeTask

NEXT_PROMPT_MEMO_SIZE = 4096


def accepts_keyword(fn: Callable[..., Any], name: str) -> bool:
    """Whether ``fn`` can be called with keyword ``name`` (named parameter or ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


@dataclass(frozen=True)
class RewardCall:
    """How to call a reward function (see the module docstring)."""

    form: str
    """"answers" (one positional list per agent), "prompts+answers" or "one list"."""
    batch_items: bool
    """Pass ``batch_items=[item]``."""
    prompts_keyword: bool
    """Pass ``prompts=[prompt]`` as a keyword."""

    @property
    def needs_prompts(self) -> bool:
        return self.form == "prompts+answers" or self.prompts_keyword


def reward_call(fn: Callable[..., Any], num_agents: int) -> RewardCall:
    """The call form ``fn``'s signature asks for, given ``num_agents`` answer lists."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return RewardCall("answers", batch_items=False, prompts_keyword=False)
    positional = [p for p in params if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    # batch_items, and a prompts that is not first, are keyword parameters however declared.
    positional = [p for i, p in enumerate(positional) if p.name != "batch_items" and (p.name != "prompts" or i == 0)]
    star_args = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    star_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    names = {p.name for p in params}
    form = "answers"
    if not star_args:
        if len(positional) == num_agents + 1 or (positional and positional[0].name == "prompts"):
            form = "prompts+answers"
        elif len(positional) == 1 and num_agents > 1:
            form = "one list"
    return RewardCall(
        form,
        batch_items="batch_items" in names or star_kwargs,
        prompts_keyword=form != "prompts+answers" and ("prompts" in names or star_kwargs),
    )


def agent_names(num_agents: int) -> tuple[str, ...]:
    return tuple(f"agent_{i}" for i in range(num_agents))


class FunctionTask(CooperativeTask):
    """A task from ``reward_func``, ``formatters``, ``external_transition`` and datasets."""

    def __init__(
        self,
        reward_func: Callable[..., Sequence[float]],
        formatters: Callable[[Mapping[str, Any]], str] | Sequence[Callable[..., str]],
        external_transition: Callable[..., Sequence[str]] | None = None,
        dataset: datasets.Dataset | Sequence[Mapping[str, Any]] | None = None,
        num_agents: int = 2,
        num_turns: int = 1,
        *,
        eval_dataset: datasets.Dataset | Sequence[Mapping[str, Any]] | None = None,
        reward_processor: Callable[[float], float] | None = None,
        external_prompt_passthrough: bool = False,
        name: str = "FunctionTask",
    ):
        if not callable(reward_func):
            raise TypeError(f"reward_func must be callable, got {type(reward_func).__name__}")
        if num_agents < 1:
            raise ValueError(f"num_agents must be >= 1, got {num_agents}")
        if num_turns < 1:
            raise ValueError(f"num_turns must be >= 1, got {num_turns}")
        if num_turns > 1 and external_transition is None:
            raise ValueError(f"num_turns={num_turns} needs an external_transition to produce the next prompts")
        if callable(formatters):
            formatters = [formatters] * num_agents
        formatters = list(formatters)
        if len(formatters) != num_agents:
            raise ValueError(f"formatters: expected 1 or {num_agents} (one per agent), got {len(formatters)}")
        for i, formatter in enumerate(formatters):
            if not callable(formatter):
                raise TypeError(f"formatters[{i}] must be callable, got {type(formatter).__name__}")
        self.agents = agent_names(num_agents)
        self.num_turns = num_turns
        self.name = name
        self.reward_func = reward_func
        self.reward_processor = reward_processor
        self.formatters = formatters
        self.external_transition = external_transition
        self.external_prompt_passthrough = external_prompt_passthrough
        self._splits = {"train": _as_dataset(dataset), "eval": _as_dataset(eval_dataset)}
        self._reward_call = reward_call(reward_func, num_agents)
        self._next_prompts: dict[Any, dict[str, str]] = {}
        self._formatter_takes_external = [accepts_keyword(f, "external_prompts") for f in formatters]

    def dataset(self, split: str) -> datasets.Dataset:
        if split not in self._splits:
            raise ValueError(f"unknown split {split!r}; FunctionTask has 'train' and 'eval'")
        data = self._splits[split]
        if data is None:
            raise ValueError(f"FunctionTask has no {split!r} dataset")
        return data

    def initial_observations(self, item):
        return {agent: self._format(i, item) for i, agent in enumerate(self.agents)}

    def _format(self, i: int, item: Mapping[str, Any]) -> str:
        prompt = self.formatters[i](item)
        if not isinstance(prompt, str):
            raise TypeError(f"formatters[{i}] returned {type(prompt).__name__}, not a str")
        return prompt

    def reward(self, item, actions, history):
        answers = [[actions[agent]] for agent in self.agents]
        call = self._reward_call
        prompts = [self._current_prompt(item, history)] if call.needs_prompts else None
        args: list[Any] = answers
        if call.form == "prompts+answers":
            args = [prompts, *answers]
        elif call.form == "one list":
            args = [answers]
        kwargs: dict[str, Any] = {"batch_items": [item]} if call.batch_items else {}
        if call.prompts_keyword:
            kwargs["prompts"] = prompts
        result = self.reward_func(*args, **kwargs)
        values = self._reward_values(result)
        if self.reward_processor is not None:
            values = [self.reward_processor(v) for v in values]
        if len(values) == 1 or all(v == values[0] for v in values):
            return values[0]
        return dict(zip(self.agents, values))

    def _reward_values(self, result: Any) -> list[Any]:
        """``reward_func``'s result as one value (shared) or N values (agent order)."""
        n = len(self.agents)
        if isinstance(result, Mapping):
            keys = {k: self.agents[k] if isinstance(k, int) and not isinstance(k, bool) and 0 <= k < n else k for k in result}
            if len(keys) != n or set(keys.values()) != set(self.agents):
                raise TypeError(
                    f"reward_func must return a non-empty list of floats (or a dict agent -> float); its dict has keys "
                    f"{list(result)}, not one per agent (0..{n - 1} or {list(self.agents)})"
                )
            by_agent = {keys[k]: v for k, v in result.items()}
            values = [by_agent[agent] for agent in self.agents]
        elif isinstance(result, (int, float)) and not isinstance(result, bool):
            values = [result]
        elif isinstance(result, Sequence) and not isinstance(result, str) and len(result) in (1, n):
            values = list(result)
        elif isinstance(result, Sequence) and not isinstance(result, str) and len(result) > 0:
            raise TypeError(
                f"reward_func returned {len(result)} values for one joint answer of {n} agents: expected 1 "
                f"(shared) or {n} (one per agent, in agent order), got {result!r}"
            )
        else:
            raise TypeError(f"reward_func must return a non-empty list of floats, got {result!r}")
        for i, value in enumerate(values):
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"reward_func must return a list of floats; its element [{i}] is {type(value).__name__} {value!r}")
        return values

    def _current_prompt(self, item: Mapping[str, Any], history: Sequence[Any]) -> str:
        """Agent 0's prompt at the turn after ``history``: its formatter's at turn 0, else what
        the transition gave it (remembered from that call; recomputed when not at hand)."""
        if not history:
            return self._format(0, item)
        prompts = self._next_prompts.get(_path_key(item, history))
        if prompts is None:
            prompts = self.transition(item, history[-1].actions, history)
        return prompts[self.agents[0]]

    def transition(self, item, actions, history):
        prompts = self._transition(item, actions, history)
        if self._reward_call.needs_prompts:
            if len(self._next_prompts) >= NEXT_PROMPT_MEMO_SIZE:
                self._next_prompts.clear()
            self._next_prompts[_path_key(item, history)] = prompts
        return prompts

    def _transition(self, item, actions, history):
        n = len(self.agents)
        completions = [actions[agent] for agent in self.agents]
        texts = self.external_transition(
            prompt=item.get("prompt", ""),
            agent_completions=completions,
            num_agents=n,
            prompt_history_per_agent=[[turn.observations[a] for turn in history] for a in self.agents],
            response_history_per_agent=[[turn.actions[a] for turn in history] for a in self.agents],
        )
        if isinstance(texts, str) or not isinstance(texts, Sequence) or len(texts) != n:
            raise TypeError(f"external_transition must return a list of {n} strings (one per agent), got {texts!r}")
        prompts = {}
        for i, (agent, text) in enumerate(zip(self.agents, texts)):
            if not isinstance(text, str):
                raise TypeError(f"external_transition returned a {type(text).__name__} for agent {i}, not a str")
            if self.external_prompt_passthrough:
                prompts[agent] = text
            else:
                revised = {**item, "prompt": text}
                if self._formatter_takes_external[i]:
                    prompts[agent] = self.formatters[i](revised, external_prompts=text)
                else:
                    prompts[agent] = self.formatters[i](revised)
        return prompts


def _path_key(item: Mapping[str, Any], history: Sequence[Any]) -> tuple[str, tuple[tuple[tuple[str, str], ...], ...]]:
    """The item and the answers played so far: what the next prompts depend on."""
    return repr(sorted(item.items(), key=lambda kv: str(kv[0]))), tuple(tuple(sorted(turn.actions.items())) for turn in history)


def _as_dataset(data: datasets.Dataset | Sequence[Mapping[str, Any]] | None) -> datasets.Dataset | None:
    import datasets

    if data is None or isinstance(data, datasets.Dataset):
        return data
    return datasets.Dataset.from_list([dict(row) for row in data])

"""Centralized MAGRPO: ONE policy writes every role's answer in one text (docs/preference.md §4).

:class:`CentralizedEnv` turns an N-role one-turn env into a one-agent env: its prompt is the
adapter's ``build_prompt(item, [prompt of each role])``; its action, one text, is split by the
adapter's ``parse_completion`` into one answer per role and stepped in the inner env, whose
shared reward it returns (an answer with no role section plays every role with the empty answer).
:class:`CentralizedMAGRPOTrainer` is :class:`~llm_marl.learners.reinforce.trainer.MAGRPOTrainer` on it,
so the joint answer is trained as one sequence and evaluation splits it the same way.

The adapters: anything with ``build_prompt(batch_item, agent_prompts) -> str`` and
``parse_completion(completion, batch_item, num_agents) -> list[str]``;
:class:`TaggedCentralizedComparatorAdapter` (the default) uses ``<agent_i> ... </agent_i>``.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

from pettingzoo import ParallelEnv

from llm_marl.learners.config import MAGRPOConfig
from llm_marl.learners.reinforce.trainer import MAGRPOTrainer, _eval_split, _instantiate
from llm_marl.learners.tree import fork_env, shared_reward

__all__ = [
    "Centralized",
    "CentralizedComparatorAdapter",
    "CentralizedComparatorParseError",
    "CentralizedEnv",
    "CentralizedMAGRPOConfig",
    "CentralizedMAGRPOTrainer",
    "TaggedCentralizedComparatorAdapter",
]


class CentralizedComparatorParseError(ValueError):
    """A centralized answer holds none of the roles' sections."""


class CentralizedComparatorAdapter(Protocol):
    """What centralized collaboration needs from a task: one prompt for all roles, and the split."""

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


def check_adapter(adapter: Any, name: str = "centralized_adapter") -> Any:
    """``adapter`` (default: a :class:`TaggedCentralizedComparatorAdapter`) after checking that
    ``build_prompt`` and ``parse_completion`` are callable."""
    adapter = TaggedCentralizedComparatorAdapter() if adapter is None else adapter
    for method in ("build_prompt", "parse_completion"):
        if not callable(getattr(adapter, method, None)):
            raise TypeError(f"{name}.{method} must be callable (got {type(adapter).__name__})")
    return adapter


class CentralizedEnv(ParallelEnv):
    """A one-turn N-role ``env`` played by one agent ``actor`` (see the module docstring)."""

    def __init__(self, env: ParallelEnv, adapter: Any = None, actor: str = "actor"):
        self.env = env
        self.adapter = check_adapter(adapter)
        self.roles = list(env.possible_agents)
        self.actor = actor
        self.possible_agents = [actor]
        self.agents: list[str] = []
        self.data = getattr(env, "data", None)
        self.num_turns = 1
        name = (getattr(env, "metadata", None) or {}).get("name", type(env).__name__)
        self.metadata = {"name": f"centralized_{name}", "render_modes": [], "is_parallelizable": True}
        self._prompt: str | None = None

    def observation_space(self, agent: str) -> Any:
        return self.env.observation_space(self.roles[0])

    def action_space(self, agent: str) -> Any:
        return self.env.action_space(self.roles[0])

    def _item(self) -> Mapping[str, Any]:
        item = getattr(self.env, "item", None)
        return item if isinstance(item, Mapping) else {}

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None):
        observations, infos = self.env.reset(seed=seed, options=options)
        prompt = self.adapter.build_prompt(self._item(), [observations[r] for r in self.roles])
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"centralized adapter {type(self.adapter).__name__}.build_prompt returned {prompt!r}, not a non-empty string")
        self._prompt = prompt
        self.agents = [self.actor]
        return {self.actor: prompt}, {self.actor: {**dict(infos.get(self.roles[0], {})), "acting_agents": [self.actor]}}

    def split(self, text: str) -> list[str]:
        """The roles' answers in ``text`` (every role empty where it has no section)."""
        try:
            outputs = self.adapter.parse_completion(text, self._item(), len(self.roles))
        except CentralizedComparatorParseError:
            return [""] * len(self.roles)
        if isinstance(outputs, (str, bytes)) or len(list(outputs)) != len(self.roles) or not all(isinstance(o, str) for o in outputs):
            raise ValueError(f"centralized adapter {type(self.adapter).__name__}.parse_completion must return {len(self.roles)} strings (one per role {self.roles}), got {outputs!r}")
        return list(outputs)

    def _wrap(self, twin: ParallelEnv, roles: list[str], result: Sequence[Any]):
        _, rewards, terminations, truncations, infos = result
        where = f"{self.metadata['name']}, item {getattr(self.env, 'item_index', '?')}"
        reward = shared_reward(rewards, self.roles, where, learner="CentralizedMAGRPOTrainer")
        info = {**dict(infos.get(self.roles[0], {})), "role_answers": dict(zip(self.roles, roles)), "acting_agents": []}
        self.agents = []
        return {self.actor: ""}, {self.actor: reward}, {self.actor: True}, {self.actor: False}, {self.actor: info}

    def step(self, actions: Mapping[str, str]):
        roles = self.split(actions[self.actor])
        return self._wrap(self.env, roles, self.env.step(dict(zip(self.roles, roles))))

    def fork(self) -> "CentralizedEnv":
        twin = copy.copy(self)
        twin.env = fork_env(self.env)
        twin.agents = list(self.agents)
        return twin


@dataclass
class CentralizedMAGRPOConfig(MAGRPOConfig):
    """Configuration of :class:`CentralizedMAGRPOTrainer`: MAGRPOConfig's fields; ``num_agents``
    is the number of ROLES (the actor is one)."""

    num_turns: int = 1
    """Turns per episode; must be 1."""
    collaboration_mode: str = "centralized"
    """Must be "centralized" (CoMLRL's field)."""

    def validate(self) -> None:
        super().validate()
        if self.num_turns != 1:
            raise ValueError(f"num_turns must be 1 for centralized MAGRPO (num_turns=1); got {self.num_turns!r}")
        if self.collaboration_mode != "centralized":
            raise ValueError(f"collaboration_mode must be 'centralized' for CentralizedMAGRPOConfig (centralized collaboration: one joint policy); got {self.collaboration_mode!r}")


class CentralizedMAGRPOTrainer(MAGRPOTrainer):
    """MAGRPO with one joint policy (see the module docstring).

    Env-native: ``CentralizedMAGRPOTrainer(env=..., policy=..., args=..., eval_env=None,
    centralized_adapter=None)``; ``env`` has ``args.num_agents`` roles and one turn; ``policy``
    (or ``policies=[p]``) writes every role's answer. Evaluation plays ``eval_env``, else the
    inner env's eval split, both centralized the same way.
    """

    _fsdp_supported = False  # fsdp=True: refused with a one-line error (not sharded yet)

    config_class = CentralizedMAGRPOConfig

    def __init__(self, env: Any = None, policy: Any = None, args: CentralizedMAGRPOConfig | None = None, eval_env: Any = None, *,
                 policies: Any = None, centralized_adapter: Any = None, **kwargs: Any):
        if args is not None and not isinstance(args, self.config_class):
            raise TypeError(f"args must be a {self.config_class.__name__}, got {type(args).__name__}")
        if (policy is None) == (policies is None):
            raise TypeError("pass the one joint policy as policy= (or policies=[policy])")
        inner = _instantiate(env, "env")
        if args is None:
            args = self.config_class(num_agents=len(inner.possible_agents))
        one = Centralized(inner, [policy] if policies is None else policies, args, eval_env, centralized_adapter, "centralized MAGRPO")
        super().__init__(one.env, one.policies, one.args, one.eval_env, **kwargs)
        one.attach(self)


class Centralized:
    """What a centralized learner is built from: the N-role ``env`` (and ``eval_env``, else its
    eval split) wrapped in :class:`CentralizedEnv`, the ONE policy as agent "actor", and a copy
    of ``args`` for one actor (``args.num_agents`` must be the number of roles)."""

    def __init__(self, env: Any, policies: Any, args: Any, eval_env: Any, adapter: Any, learner: str):
        values = list(policies.values()) if isinstance(policies, Mapping) else list(policies)
        if len(values) != 1:
            raise ValueError(f"{learner} trains ONE policy for every role; got {len(values)}")
        inner = _instantiate(env, "env")
        self.roles = list(inner.possible_agents)
        if args.num_agents != len(self.roles):
            raise ValueError(f"num_agents is {args.num_agents} (the roles) but the env has {len(self.roles)} roles {self.roles}")
        self.role_args = args
        self.adapter = check_adapter(adapter)
        inner_eval = _instantiate(eval_env, "eval_env") if eval_env is not None else _eval_split(inner)[0]
        self.args = copy.copy(args)
        self.args.num_agents = 1
        for name in ("agent_devices", "reference_devices", "critic_devices"):
            devices = getattr(self.args, name, None)
            if devices is not None:
                setattr(self.args, name, list(devices)[:1])
        self.env = CentralizedEnv(inner, self.adapter)
        self.eval_env = CentralizedEnv(inner_eval, self.adapter) if inner_eval is not None else None
        self.policies = {"actor": values[0]}

    def attach(self, trainer: Any) -> None:
        """Give ``trainer`` ``roles``, ``role_args`` (the config as given; ``trainer.args`` is the
        one-actor copy) and ``centralized_adapter``."""
        trainer.roles, trainer.role_args, trainer.centralized_adapter = self.roles, self.role_args, self.adapter

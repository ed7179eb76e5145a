"""Actor-critic learners: IAC (a critic per agent) and MAAC (one central critic), docs/actor_critic.md.

They run the REINFORCE learners' loop (:mod:`llm_marl.learners.reinforce.trainer`) and differ from it in
four named pieces:

* ``_samples``: a trajectory is a rollout tree with G aligned answers per node (G =
  ``num_generations``; answer g of every agent forms joint action g; G = 1 gives one chain per
  item). Each (node, agent) becomes an :class:`ACSample` with the shaped rewards r̃ = R − β·KL,
  the critic's rollout-time values, the one-step TD targets y = r̃ + γ·V_old(h') (y = r̃ where the
  episode ended: last turn, early stop or env termination) and the advantages A = y − V_old(h).
* ``_minibatches``: the buffered samples of an agent are whitened together (one group per agent
  per update, all turns pooled) and cut, in collection order, into mini-batches. Sizes count
  groups of G answers, or with ``sample_unit="answer"`` (CoMLRL's unit; the anchor keywords'
  default) single answers, cut turn by turn, the buffers checked once per batch.
* ``_loss_sum``: the actor loss mean(−ℓ_θ·Â); with ``use_separate_critic=False`` plus the value
  loss c_v·mean e, in ONE step of the actor's optimizer (which then holds the critic's head too).
* ``_other_backwards``: separate critics take their own AdamW steps on the value loss, one per
  mini-batch — IAC's critic i on agent i's mini-batches; MAAC's central critic once per *joint*
  mini-batch on all agents' outputs together — in the same all-or-nothing step as the actors.

Critics follow :class:`~llm_marl.policies.critic.Critic`. IAC's critic i reads agent i's
observation (``critic_type="v"``) or its observation and answer (``"q"``); MAAC's reads the joint
observation text (:func:`~llm_marl.policies.critic.joint_observation`) and has one output per
agent. Without ``critics=`` each agent gets a default: a :class:`TabularCritic` for a tabular
policy, a :class:`CausalLMCritic` (a copy of the actor's model, or a head on the actor's own model
when ``use_separate_critic=False``) for a language-model policy.

With ``critic_type="q"`` the critic also reads V(h) at the prompt's end and both are regressed on
y; the actor's advantage is Q_old(h, a) − V_old(h) and the bootstrap is V_old(h'), so the baseline
never depends on the action (docs/actor_critic.md §3; docs/actor_critic_learners.md, Q7).

Constructors: env-native ``IACTrainer(env=..., policies=..., critics=None, args=IACConfig(...))``,
or the anchor library's keywords (``agent_model``/``agents``, ``critic_model``/``critics``,
``reward_func``, ``formatters``, ``external_transition``, ``metrics_callback``, ...).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from llm_marl.learners.actor_critic import math as acm
from llm_marl.learners.actor_critic.config import IACConfig, MAACConfig
from llm_marl.learners.buffer import Sample
from llm_marl.learners.reinforce.trainer import MAGRPOTrainer, _UnfinishedBatch, default_optimizer
from llm_marl.learners.tree import RolloutNode, derive_seed, iter_nodes
from llm_marl.policies.base import Completion
from llm_marl.policies.critic import Critic, joint_observation
from llm_marl.policies.tabular_critic import TabularCritic
from llm_marl.runs.fsdp import full_state_dict

__all__ = ["ACSample", "ActorCriticTrainerBase", "IACConfig", "IACTrainer", "MAACConfig", "MAACTrainer"]


@dataclass
class ACSample(Sample):
    """A :class:`Sample` with what the critic needs: per answer k the shaped reward, the
    rollout-time baseline V_old(h) (and Q_old(h, a_k) for a q critic), the TD target and the
    critic's inputs. ``advantages`` are raw until the update whitens them. ``returns`` are the
    logged returns Σ_{t'≥t} r̃_{t'} of the agent: undiscounted and shaped, used by no loss
    (:func:`~llm_marl.learners.actor_critic.math.logged_returns`)."""

    rewards: list[float] = field(default_factory=list)
    """r̃_k = R_k − β·KL_k (R_k: this agent's own reward)."""
    values: list[float] = field(default_factory=list)
    """V_old(h) per answer (the same for every answer of the node)."""
    action_values: list[float] = field(default_factory=list)
    """Q_old(h, a_k) (critic_type "q"); empty otherwise."""
    targets: list[float] = field(default_factory=list)
    """y_k = r̃_k + γ·V_old(h'_k), or r̃_k at an episode's end."""
    critic_observation: Any = None
    """What the critic reads for V(h): the agent's observation (IAC) or the joint text (MAAC)."""
    critic_actions: list[Any] = field(default_factory=list)
    """Q inputs per answer: the Completion (IAC) or the joint text with the joint action (MAAC)."""


@dataclass
class RolloutSample:
    """One answer as CoMLRL 1.4.3's actor-critic ``metrics_callback`` receives it. Trainers built
    from the anchor keywords (``agent_model=``, ``reward_func=``, ...) call ``metrics_callback``
    with a list of these, so that callbacks written for CoMLRL read the same attributes; the
    env-native constructor passes :class:`ACSample` groups. ``reward`` is the shaped reward r̃,
    ``returns`` the answer's logged return (undiscounted, shaped: Σ_{t'≥t} r̃_{t'}),
    ``advantage`` the raw y − V (whitened only at the update);
    the token-level fields CoMLRL filled from its own tokenization (``full_input_ids``,
    ``attention_mask``, ``prompt_len``, ``old_logprob``) are None here."""

    agent_idx: int
    prompt: str
    completion: str
    full_input_ids: Any
    attention_mask: Any
    prompt_len: int | None
    response_len: int | None
    old_logprob: Any
    old_value: torch.Tensor
    reward: torch.Tensor
    returns: torch.Tensor
    advantage: torch.Tensor
    normalized_advantage: torch.Tensor | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


def rollout_samples(samples: Sequence[ACSample], agents: Sequence[str]) -> list[RolloutSample]:
    """Each answer of each group as a :class:`RolloutSample` (agents in the trainer's order)."""
    out = []
    for sample in samples:
        for k, completion in enumerate(sample.completions):
            kl = sample.kl[k] if sample.kl else 0.0
            out.append(
                RolloutSample(
                    agent_idx=list(agents).index(sample.agent),
                    prompt=str(sample.observation),
                    completion=completion.text,
                    full_input_ids=None,
                    attention_mask=None,
                    prompt_len=None,
                    response_len=len(completion.token_ids) if completion.token_ids is not None else None,
                    old_logprob=None,
                    old_value=torch.tensor(sample.values[k]),
                    reward=torch.tensor(sample.rewards[k]),
                    returns=torch.tensor(sample.returns[k]),
                    advantage=torch.tensor(sample.advantages[k]),
                    metadata={"turn_idx": sample.turn, "item_index": sample.index, "target": sample.targets[k], "reference_kl": kl},
                )
            )
    return out


class ActorCriticTrainerBase(MAGRPOTrainer):
    """The actor-critic loop (module docstring); :class:`IACTrainer` and :class:`MAACTrainer`."""

    _fsdp_supported = True  # fsdp=True: critics built before the agents are sharded, then sharded too (runs/fsdp.py)

    config_class = IACConfig
    central = False

    def __init__(
        self,
        env: Any = None,
        policies: Any = None,
        args: IACConfig | None = None,
        eval_env: Any = None,
        *,
        critics: Critic | Mapping[str, Any] | Sequence[Any] | None = None,
        critic_model: Any = None,
        critic_optimizers: Mapping[str, torch.optim.Optimizer] | None = None,
        metrics_callback: Callable[[list[ACSample]], Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ):
        if args is not None and not isinstance(args, self.config_class):
            raise TypeError(f"args must be a {self.config_class.__name__}, got {type(args).__name__}")
        model_config = dict(kwargs.get("model_config") or {})
        anchor = bool({k for k in kwargs if k not in ("optimizers", "eval_logger", "eval_aggregator")}) or env is None
        self._critic_sources = (critics, critic_model, model_config, anchor)
        self.critic_by_agent: dict[str, Critic] = {}
        super().__init__(env, policies, args, eval_env, **kwargs)  # fsdp=True: calls _make_critics before sharding
        self.metrics_callback = metrics_callback
        self._callback_takes_rollouts = anchor  # CoMLRL's keywords: CoMLRL's RolloutSample objects
        if not self.critic_by_agent:
            self._make_critics()
        self.critic_optimizers: dict[str, torch.optim.Optimizer] = {}
        self.critic_params: dict[str, list[torch.nn.Parameter]] = {}
        for name, critic in self.critic_by_agent.items():
            params = [p for p in critic.parameters() if p.requires_grad]
            if not self.args.use_separate_critic:
                # One step on L_pi + L_V at the actor's rate: the actor's optimizer holds the critic.
                known = {id(p) for p in self.trainable[name]}
                extra = [p for p in params if id(p) not in known]
                self.trainable[name] = self.trainable[name] + extra
                if extra and name in self.optimizer_by_agent:
                    self.optimizer_by_agent[name].add_param_group({"params": extra})
            elif params:
                self.critic_params[name] = params
                if critic_optimizers is not None and name in critic_optimizers:
                    self.critic_optimizers[name] = critic_optimizers[name]
                else:
                    self.critic_optimizers[name] = default_optimizer(params, lr=self.args.critic_rate, weight_decay=self.args.weight_decay, kind=self.args.optim)

    # --- critics ----------------------------------------------------------------------------

    @property
    def critics(self) -> dict[str, Critic]:
        """Agent name (MAAC: "critic") -> critic (``critic_by_agent``; a list of models in
        :mod:`llm_marl.comlrl`)."""
        return self.critic_by_agent

    @critics.setter
    def critics(self, critics: dict[str, Critic]) -> None:
        self.critic_by_agent = critics


    def _make_critics(self) -> None:
        """Build and place the critics from the constructor's ``critics`` / ``critic_model``."""
        critics, critic_model, model_config, anchor = self._critic_sources
        if anchor:
            critics = self._anchor_critics(critics, critic_model, model_config)
        elif critic_model is not None:
            raise TypeError("critic_model= belongs to the anchor keywords; env-native trainers take critics=")
        self.critic_by_agent = self._resolve_critics(critics)
        self._place_critics()

    def critic_of(self, agent: str) -> tuple[str, int]:
        """(name of the critic judging ``agent``, index of ``agent``'s output in it)."""
        if self.central:
            return "critic", self.agent_ids.index(agent)
        return agent, 0

    def _critic_count(self) -> int:
        return 1 if self.central else len(self.agent_ids)

    def _resolve_critics(self, critics: Any) -> dict[str, Critic]:
        outputs = len(self.agent_ids) if self.central else 1
        if critics is None:
            if self.central:
                critics = {"critic": self._default_critic(self.agent_ids[0], outputs)}
            else:
                critics = {agent: self._default_critic(agent, outputs) for agent in self.agent_ids}
        elif self.central:
            if isinstance(critics, Mapping):
                critics = list(critics.values())
            if isinstance(critics, (list, tuple)):
                if len(critics) != 1:
                    raise ValueError(f"MAAC takes exactly one central critic, got {len(critics)}")
                critics = critics[0]
            critics = {"critic": critics}
        else:
            from llm_marl.learners.reinforce.trainer import _by_agent

            critics = _by_agent(critics, self.agent_ids, "critics")
        for name, critic in critics.items():
            if not callable(getattr(critic, "values", None)) or not callable(getattr(critic, "parameters", None)):
                raise TypeError(f"critic {name!r} must have values() and parameters() (the Critic protocol), got {type(critic).__name__}")
            have = getattr(critic, "num_outputs", 1)
            if have != outputs:
                raise ValueError(f"critic {name!r} has {have} outputs; {type(self).__name__} needs {outputs} (one per agent)" if self.central
                                 else f"critic {name!r} has {have} outputs; IAC critics have 1")
        return critics

    def _default_critic(self, agent: str, num_outputs: int) -> Critic:
        """A TabularCritic, or for a language-model policy a CausalLMCritic on (a copy of) its model;
        for an agent of a LoRA team an AdapterCritic on the team's base."""
        policy = self.policies[agent]
        if hasattr(policy, "model") and hasattr(policy, "tokenizer"):
            from llm_marl.policies.adapter_critic import AdapterCritic
            from llm_marl.policies.lm_critic import CausalLMCritic
            from llm_marl.policies.lora_team import AdapterPolicy

            shared = not self.args.use_separate_critic
            width = self.args.value_head_hidden_dim if shared else self.args.critic_value_head_hidden_dim
            # An agent's own critic reads its observation as the agent does (chat template, system prompt); a central one, the joint text.
            options = dict(shared=shared, num_outputs=num_outputs, hidden_dim=width, seed=self._critic_seed(agent), actor_prompts=not self.central)
            if isinstance(policy, AdapterPolicy):  # on the team's one base: its own adapter or a value adapter
                return AdapterCritic.for_agent(policy, name="critic" if self.central else f"{agent}_critic", **options)
            return CausalLMCritic.for_policy(policy, **options)
        return TabularCritic(num_outputs)

    def _critic_seed(self, agent: str | int) -> int:
        """The seed of a fresh value head: ``args.seed`` and the critic's index (IAC: the agent's)."""
        index = agent if isinstance(agent, int) else (0 if self.central else self.agent_ids.index(agent))
        return derive_seed(self.args.seed, "value_head", index)

    def _place_critics(self) -> None:
        devices = self.args.critic_devices
        for i, (name, critic) in enumerate(self.critic_by_agent.items()):
            device = None
            if devices:
                device = devices[min(i, len(devices) - 1)]
            elif not self.central and self.args.agent_devices is not None:
                device = self.args.agent_devices[i]
            if device is not None and hasattr(critic, "to") and not getattr(critic, "shared", False):
                self.critic_by_agent[name] = critic.to(device) or critic

    def _anchor_critics(self, critics: Any, critic_model: Any, model_config: dict[str, Any]) -> Any:
        """Critics from the anchor keywords: ``critics`` (IAC: one per agent; MAAC: one) or one
        ``critic_model``; a string is loaded (with ``model_config["critic_model_kwargs"]``), a
        model gets a value head (copied per agent when one object serves several agents)."""
        if not self.args.use_separate_critic:
            if critics is not None or critic_model is not None:
                raise ValueError("use_separate_critic=False puts the value head on each agent's own model: pass neither critics= nor critic_model=")
            return None
        if critics is not None and critic_model is not None:
            raise ValueError("pass critics= or critic_model=, not both")
        count = self._critic_count()
        if critic_model is not None:
            sources = [critic_model] * count
        elif critics is not None:
            sources = list(critics) if isinstance(critics, (list, tuple)) else [critics]
            if len(sources) != count:
                raise ValueError(f"critics: expected {count} (" + ("one central critic" if self.central else "one per agent") + f"), got {len(sources)}: critics length must match")
        else:
            return None
        built = []
        for i, source in enumerate(sources):
            built.append(self._critic_from_source(source, i, shared_source=critic_model is not None and count > 1, model_config=model_config))
        return built[0] if self.central else built

    def _critic_from_source(self, source: Any, i: int, shared_source: bool, model_config: dict[str, Any]) -> Critic:
        from llm_marl.policies.lm_critic import CausalLMCritic

        outputs = len(self.agent_ids) if self.central else 1
        width = self.args.critic_value_head_hidden_dim or model_config.get("critic_value_head_hidden_dim")
        if isinstance(source, str):
            from transformers import AutoModelForCausalLM, AutoTokenizer

            model = AutoModelForCausalLM.from_pretrained(source, **dict(model_config.get("critic_model_kwargs") or {}))
            tokenizer = AutoTokenizer.from_pretrained(source)
            return CausalLMCritic(model, tokenizer, num_outputs=outputs, hidden_dim=width, use_token_ids=False, seed=self._critic_seed(i))
        if hasattr(source, "values") and hasattr(source, "parameters"):
            return copy.deepcopy(source) if shared_source else source
        if hasattr(source, "forward") and hasattr(source, "config"):
            tokenizer = self._critic_tokenizer(source, i, model_config)
            model = copy.deepcopy(source) if shared_source else source
            return CausalLMCritic(model, tokenizer, num_outputs=outputs, hidden_dim=width, seed=self._critic_seed(i))
        raise TypeError(f"critic {i}: expected a model id/path, a causal LM or a Critic, got {type(source).__name__}")

    def _critic_tokenizer(self, model: Any, i: int, model_config: dict[str, Any]) -> Any:
        """The tokenizer of a critic given as a model object: ``model_config["critic_tokenizer"]``
        (a tokenizer, or a path or id), else (central critic) the one saved with the model, else
        the agents' when they all share one; agent ``i``'s for agent ``i``'s own critic. A central
        critic never falls back to agent 0's tokenizer over agents with others (CoMLRL's Q16)."""
        from transformers import AutoTokenizer

        given = model_config.get("critic_tokenizer")
        if given is not None:
            return AutoTokenizer.from_pretrained(given) if isinstance(given, (str, os.PathLike)) else given
        if not self.central:
            return self.tokenizers[i]
        path = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
        if path and os.path.isdir(path):
            return AutoTokenizer.from_pretrained(path)
        first = self.tokenizers[0]
        alike = lambda t: t is first or (type(t) is type(first) and t.get_vocab() == first.get_vocab())  # noqa: E731
        if all(alike(t) for t in self.tokenizers):
            return first
        raise ValueError(
            "critic_model: the agents use different tokenizers and the critic model has no saved one "
            "(config._name_or_path); pass the critic's own as model_config['critic_tokenizer']"
        )

    def checkpoint_extras(self) -> dict[str, Any]:
        """Critics and their optimizers, saved in and restored from checkpoints."""
        extras: dict[str, Any] = {}
        for i, (name, critic) in enumerate(self.critic_by_agent.items()):
            shard = getattr(self, "sharded_critics", {}).get(name)
            if shard is not None and not shard.frozen:
                continue  # fsdp: its shards, head and optimizer state are written by torch.distributed.checkpoint
            extras[f"critic_{i}"] = critic
            if name in self.critic_optimizers:
                extras[f"critic_{i}_optimizer"] = self.critic_optimizers[name]
        return extras

    def save_model(self, output_dir: str) -> None:
        """Agents as :meth:`MAGRPOTrainer.save_model`; critics to ``<agent>/critic`` (IAC) or
        ``critic`` (MAAC), with ``save_pretrained`` where they have it, else ``critic.pt``."""
        from llm_marl.runs.run_dir import agent_folders

        super().save_model(output_dir)
        folders = agent_folders(self.agent_ids)
        for i, (name, critic) in enumerate(self.critic_by_agent.items()):
            target = os.path.join(output_dir, "critic") if self.central else os.path.join(output_dir, folders[i], "critic")
            os.makedirs(target, exist_ok=True)
            shard = getattr(self, "sharded_critics", {}).get(name)
            if shard is not None and not shard.frozen:  # fsdp: every rank gathers, rank 0 writes
                full = full_state_dict(shard.model)
                if self.dist.is_main:
                    critic.save_pretrained(target, state_dict=full)
            elif self.sharded and not self.dist.is_main:
                continue  # fsdp: every rank calls save_model; whole critics are written by rank 0
            elif hasattr(critic, "save_pretrained"):
                critic.save_pretrained(target)
            else:
                torch.save(critic.state_dict(), os.path.join(target, "critic.pt"))

    # --- rollout -> samples -------------------------------------------------------------------

    def _samples(self, roots: list[RolloutNode]) -> list[Sample]:
        nodes = list(iter_nodes(roots))
        if not nodes:
            return []
        args = self.args
        row = {id(node): n for n, node in enumerate(nodes)}
        kl = self._answer_kl(nodes)
        v_inputs, values = {}, {}
        q_inputs: dict[str, list[list[Any]]] = {}
        q_values: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for name, critic in self.critic_by_agent.items():
                agent = None if self.central else name
                v_inputs[name] = [self._critic_observation(node, agent) for node in nodes]
                values[name] = self._checked(critic.values(v_inputs[name]), name, nodes, "V")
                if args.critic_type == "q":
                    q_inputs[name] = [self._critic_actions(node, agent) for node in nodes]
                    flat = [x for per_node in q_inputs[name] for x in per_node]
                    if self.central:
                        result = critic.values(flat)
                    else:
                        result = critic.values([v_inputs[name][n] for n, per_node in enumerate(q_inputs[name]) for _ in per_node], flat)
                    q_values[name] = result.float().cpu()
        samples: list[Sample] = []
        passed: dict[tuple[int, str], float | None] = {}

        def after_value(child: RolloutNode | None, agent: str, name: str, out: int) -> float | None:
            """What a TD target bootstraps from: V_old of ``agent`` at ``child`` where it acts there;
            where it does not (turn-based), the mean over the child's joint actions of its reward
            plus γ times this, recursively (the tree's backup through its partners' turns)."""
            if child is None:
                return None
            if child.acts(agent):
                return float(values[name][row[id(child)], out])
            key = (id(child), agent)
            if key not in passed:
                own = child.rewards_of(agent)
                nexts = [after_value(c, agent, name, out) for c in list(child.children) + [None] * (len(own) - len(child.children))]
                passed[key] = sum(acm.td_target(r, v, args.discount) for r, v in zip(own, nexts)) / len(own)
            return passed[key]

        for n, node in enumerate(nodes):
            for agent in self.agent_ids:
                if not node.acts(agent):
                    continue  # turn-based: no sample where the agent does not act
                name, out = self.critic_of(agent)
                v_old = float(values[name][n, out])
                k = len(node.completions[agent])
                own = node.rewards_of(agent)  # the agent's own reward where the env gave agents different ones
                rewards = acm.shaped_rewards([own[j] for j in range(k)], kl[agent][n], args.reference_kl_coef)
                acm.check_finite(rewards, f"agent {agent!r}, item {node.index}, turn {node.turn}: shaped rewards")
                targets = []
                for j in range(k):
                    child = node.children[j] if j < len(node.children) else None
                    after = after_value(child, agent, name, out)
                    targets.append(acm.td_target(rewards[j], after, args.discount))
                baseline = [v_old] * k
                q_old: list[float] = []
                actions: list[Any] = []
                if args.critic_type == "q":
                    start = sum(len(x) for x in q_inputs[name][:n])
                    q_old = [float(q_values[name][start + j, out]) for j in range(k)]
                    actions = list(q_inputs[name][n])
                    raw = acm.advantages(q_old, baseline)
                else:
                    raw = acm.advantages(targets, baseline)
                samples.append(
                    ACSample(
                        agent,
                        node.observations[agent],
                        list(node.completions[agent]),
                        [],  # the logged returns, filled in below from the children's
                        raw,
                        node.index,
                        node.turn,
                        list(kl[agent][n]),
                        rewards=rewards,
                        values=baseline,
                        action_values=q_old,
                        targets=targets,
                        critic_observation=v_inputs[name][n],
                        critic_actions=actions,
                    )
                )
        own_sample = {(id(node), s.agent): s for node, s in zip([n for n in nodes for a in self.agent_ids if n.acts(a)], samples)}
        logged: dict[tuple[int, str], list[float] | None] = {}

        def child_returns(child: RolloutNode | None, agent: str) -> list[float] | None:
            """The agent's logged returns at ``child`` (a node where it does not act: through it)."""
            if child is None:
                return None
            if (id(child), agent) in own_sample:
                return own_sample[(id(child), agent)].returns
            key = (id(child), agent)
            if key not in logged:
                own = child.rewards_of(agent)
                logged[key] = acm.logged_returns(own, [child_returns(child.children[j] if j < len(child.children) else None, agent) for j in range(len(own))])
            return logged[key]

        for n in reversed(range(len(nodes))):  # children before their parents
            for agent in self.agent_ids:
                sample = own_sample.get((id(nodes[n]), agent))
                if sample is None:
                    continue
                children = nodes[n].children
                after = [child_returns(children[j] if j < len(children) else None, agent) for j in range(len(sample.rewards))]
                sample.returns = acm.logged_returns(sample.rewards, after)
        for sample in samples:
            self._note(f"train/{sample.agent}/value_mean", float(np.mean(sample.values)))
            self._note(f"train/{sample.agent}/target_mean", float(np.mean(sample.targets)))
        self._callback_metrics(samples)
        return samples

    def _critic_observation(self, node: RolloutNode, agent: str | None) -> Any:
        if agent is None:
            return joint_observation(node.observations, self.agent_ids)
        return node.observations[agent]

    def _critic_actions(self, node: RolloutNode, agent: str | None) -> list[Any]:
        """The Q critic's action inputs at ``node``: per joint action (central: every agent's
        answer, "" for an agent that does not act there), or the agent's K answers ([] where it
        does not act)."""
        if agent is None:
            acting = node.agents
            return [
                joint_observation(
                    node.observations, self.agent_ids, [node.completions[a][combo[acting.index(a)]].text if a in acting else "" for a in self.agent_ids]
                )
                for combo in node.joint
            ]
        return list(node.completions.get(agent, ()))

    def _checked(self, values: torch.Tensor, name: str, nodes: list[RolloutNode], what: str) -> torch.Tensor:
        values = values.detach().float().cpu()
        bad = (~torch.isfinite(values)).any(dim=-1).nonzero().flatten().tolist()
        if bad:
            node = nodes[bad[0]] if bad[0] < len(nodes) else nodes[-1]
            raise FloatingPointError(
                f"critic {name!r}: {what} value is not finite for item {node.index}, turn {node.turn} "
                f"(optimizer step {self.state.global_step}){self._last_good()}"
            )
        return values

    def _answer_kl(self, nodes: list[RolloutNode]) -> dict[str, list[list[float]]]:
        kl: dict[str, list[list[float]]] = {agent: [[] for _ in nodes] for agent in self.agent_ids}
        if self.reference_policies is None:
            return kl
        for agent in self.agent_ids:
            observations = [node.observations[agent] for node in nodes for _ in node.completions.get(agent, ())]
            completions = [c for node in nodes for c in node.completions.get(agent, ())]
            if not completions:
                continue
            values = self._kl_penalty(agent, observations, completions)
            offset = 0
            for n, node in enumerate(nodes):
                k = len(node.completions.get(agent, ()))
                kl[agent][n] = list(values[offset : offset + k])
                offset += k
        return kl

    def _callback_metrics(self, samples: list[ACSample]) -> None:
        if self.metrics_callback is None:
            return
        try:
            result = self.metrics_callback(rollout_samples(samples, self.agent_ids) if self._callback_takes_rollouts else samples)
        except Exception as exc:
            raise RuntimeError(f"metrics_callback raised {type(exc).__name__}: {exc} (batch {self.state.batch_step})") from exc
        for key, value in dict(result or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                self._note(f"train/{key}", float(value))

    def _buffer_and_update(
        self, batch_step: int, roots: list[RolloutNode], samples: list[Sample], elapsed: float, rest: list[Sample]
    ) -> None:
        """As the REINFORCE learners' (an update whenever a buffer is full), except that with
        ``sample_unit`` "answer" the buffers are checked once the whole batch is appended, as
        CoMLRL checks after each item (its batch is one item)."""
        if not self._counts_answers():
            super()._buffer_and_update(batch_step, roots, samples, elapsed, rest)
            if self._unfinished is None:  # else max_steps cut the batch: it is logged once finished
                self._note_logged_returns(samples)
            return
        self._appending = True
        try:
            super()._buffer_and_update(batch_step, roots, samples, elapsed, rest)
        finally:
            self._appending = False
        self._note_logged_returns(samples)
        if self.dist.max(int(self._buffers_full())):
            self._update_or_keep(_UnfinishedBatch(batch_step, roots, samples, elapsed, []))

    def _counts_answers(self) -> bool:
        """Whether rollout_buffer_size and train_batch_size count answers (``sample_unit``; None:
        answers for a trainer built from the anchor keywords, CoMLRL's unit) rather than groups."""
        unit = self.args.sample_unit
        return self._callback_takes_rollouts if unit is None else unit == "answer"

    def _buffer_full(self, agent: str) -> bool:
        if not self._counts_answers():
            return super()._buffer_full(agent)
        return sum(len(s.completions) for s in self.buffers[agent].samples) >= self._buffer_size(agent)

    def _buffers_full(self) -> bool:
        return not (self._counts_answers() and getattr(self, "_appending", False)) and super()._buffers_full()

    def _note_logged_returns(self, samples: list[Sample]) -> None:
        """``train/turn_k/expected_return``: the mean logged return (undiscounted, shaped) of every
        agent's answers at turn k, in place of the tree's (unshaped) value just noted for this batch."""
        by_turn: dict[int, list[float]] = {}
        for sample in samples:
            by_turn.setdefault(sample.turn, []).extend(sample.returns)
        for turn, returns in by_turn.items():
            pending = self._pending.get(f"train/turn_{turn + 1}/expected_return")
            if pending:
                pending[-1] = float(np.mean(returns))

    # --- update -------------------------------------------------------------------------------

    def _update(self, full_only: bool = False) -> None:
        if self.dist.enabled:
            for critic in self.critic_by_agent.values():
                if hasattr(critic, "pending_observations"):
                    critic.add_observations(self.dist.union(critic.pending_observations()))
        super()._update(full_only)

    def _minibatches(self, agent: str, size: int) -> list[list[Sample]]:
        """The buffer's samples with their advantages whitened together (one group per agent and
        update, all turns pooled), cut into consecutive mini-batches of ``size`` samples; the
        buffer keeps the samples until they are trained on. With ``sample_unit`` "answer" a sample
        is one answer: the buffer is re-cut into one-answer samples and each turn's answers
        (turns ascending, as CoMLRL updates one turn group after another) into mini-batches of
        ``size`` answers."""
        raw = list(self.buffers[agent].samples)
        if self._counts_answers():
            singles = [_one_answer(s, k) for s in raw for k in range(len(s.completions))]
            turns = sorted({s.turn for s in singles})
            raw = [s for t in turns for s in singles if s.turn == t]
            self.buffers[agent].samples = list(raw)  # the same order as the mini-batches: discard() drops what was trained
        samples = raw
        if self.args.advantage_normalization_of(self.agent_ids.index(agent)):
            flat = acm.whiten([a for s in raw for a in s.advantages])
            out, offset = [], 0
            for s in raw:
                out.append(dataclasses.replace(s, advantages=flat[offset : offset + len(s.advantages)]))
                offset += len(s.advantages)
            samples = out
        if not self._counts_answers():
            return [samples[start : start + size] for start in range(0, len(samples), size)]
        batches = []
        for turn in sorted({s.turn for s in samples}):
            of_turn = [s for s in samples if s.turn == turn]
            batches += [of_turn[start : start + size] for start in range(0, len(of_turn), size)]
        return batches

    def _loss_sum(self, agent: str, batch: list[Sample]) -> tuple[torch.Tensor, float]:
        loss, log_prob_mean = super()._loss_sum(agent, batch)
        if not self.args.use_separate_critic:
            loss = loss + self._value_loss_sum(agent, batch).to(loss.device)
        return loss, log_prob_mean

    def _value_loss_sum(self, agent: str, batch: list[ACSample]) -> torch.Tensor:
        """c_v × Σ over ``batch`` of each sample's mean value error over its answers (V, plus Q
        for a q critic), read at ``agent``'s output of its critic."""
        name, out = self.critic_of(agent)
        critic, args = self.critic_by_agent[name], self.args
        sizes = [len(s.completions) for s in batch]
        v = critic.values([s.critic_observation for s in batch])[:, out]
        v = v.repeat_interleave(torch.tensor(sizes, device=v.device))
        targets = torch.tensor([y for s in batch for y in s.targets], device=v.device)
        old = torch.tensor([b for s in batch for b in s.values], device=v.device)
        errors = acm.value_errors(v, old, targets, args.value_clip_range)
        if args.critic_type == "q":
            actions = [x for s in batch for x in s.critic_actions]
            if self.central:
                q = critic.values(actions)[:, out]
            else:
                q = critic.values([s.critic_observation for s in batch for _ in s.completions], actions)[:, out]
            q_old = torch.tensor([x for s in batch for x in s.action_values], device=v.device)
            errors = errors + acm.value_errors(q, q_old, targets, args.value_clip_range)
        self._note(f"train/{agent}/value_loss", args.value_loss_coef * errors.detach().mean().item())
        return args.value_loss_coef * torch.stack([chunk.mean() for chunk in errors.split(sizes)]).sum()

    def _other_backwards(self, step: dict[str, list[Sample]]) -> list[tuple[str, torch.optim.Optimizer, Any]]:
        """Separate critics' gradients on this step's mini-batches: IAC's critic i on agent i's;
        MAAC's central critic on every agent's at once (its outputs), so it steps once per joint
        mini-batch. Stepped together with the agents, or not at all."""
        results = []
        for name, optimizer in self.critic_optimizers.items():
            judged = [a for a in step if a == name or self.central]
            if not judged:  # its agent takes no step now (no samples on any rank, or not trained)
                continue
            parts = {a: step[a] for a in judged}
            total = self.dist.sum(sum(len(b) for b in parts.values()))
            optimizer.zero_grad(set_to_none=True)
            shard = getattr(self, "sharded_critics", {}).get(name)  # fsdp: values on the gathered weights
            try:
                with shard.accumulating() if shard is not None else contextlib.nullcontext():
                    local = sum((self._value_loss_sum(a, b) for a, b in parts.items() if b), torch.zeros((), dtype=torch.float64)) / max(total, 1)
                    if shard is not None and local.requires_grad and torch.isfinite(local):
                        local.backward()  # this rank's full gradient, kept locally
            finally:
                if shard is not None:
                    shard.reduce()  # every rank: reduce-scatter into the shards
            local = local.detach() if shard is not None else local
            who = "central critic" if self.central else f"critic of agent {name!r}"
            label = "critic" if self.central else f"{name}/critic"
            joined = [s for b in parts.values() for s in b]
            results.append((label, optimizer, self._gradient(who, self.critic_params[name], local, joined)))
        return results


def _one_answer(sample: ACSample, k: int) -> ACSample:
    """Answer ``k`` of ``sample`` as a sample of its own (every per-answer list cut to entry k)."""
    pick = lambda values: values[k : k + 1] if values else values  # noqa: E731
    return dataclasses.replace(
        sample,
        completions=pick(sample.completions),
        returns=pick(sample.returns),
        advantages=pick(sample.advantages),
        kl=pick(sample.kl),
        rewards=pick(sample.rewards),
        values=pick(sample.values),
        action_values=pick(sample.action_values),
        targets=pick(sample.targets),
        critic_actions=pick(sample.critic_actions),
    )


class IACTrainer(ActorCriticTrainerBase):
    """Independent actor-critic: every agent has its own critic over its own observation."""

    config_class = IACConfig
    central = False


class MAACTrainer(ActorCriticTrainerBase):
    """Multi-agent actor-critic: one central critic over the joint observation, one output per agent."""

    config_class = MAACConfig
    central = True

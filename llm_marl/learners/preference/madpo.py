"""MADPO: multi-agent direct preference optimization on the env API (docs/preference.md).

It runs the REINFORCE learners' loop (:mod:`llm_marl.learners.reinforce.trainer`: run folder, logging,
recorded trees, checkpoints with exact resume, distributed and adapter teams) and differs from
it in three named pieces:

* ``_collect``: each dataset item is rolled out as a one-turn tree with
  ``preference_num_candidates`` answers per agent (C joint answers aligned, C^N cross), each
  scored with the env's shared reward.
* ``_samples``: per item, winner/loser pairs of joint answers are selected from those rewards
  (:func:`~llm_marl.learners.preference.math.select_pairs`); each (item, agent) becomes one
  :class:`PreferenceSample` holding the agent's answers, the pairs, and the frozen reference's
  log-probs of the answers in them (computed once, at collection).
* ``_team_backward``: a mini-batch's loss is the mean over its pairs of the JOINT DPO loss
  −log σ(β Σ_i Δ_i), Δ_i = (log π_i(w_i) − log π_i,ref(w_i)) − (log π_i(l_i) − log π_i,ref(l_i)),
  back-propagated once; since it depends on the agents only through Σ_i Δ_i, agent i's
  gradient flows only through its own sequence log-probs (CoMLRL computes the same gradient
  agent by agent, with the other agents' margins detached).

Agents without an optimizer (fixed partners) still enter Σ_i Δ_i with their margins, computed
at collection. The reference is a frozen copy of each policy made when the trainer is built, or
a :class:`~llm_marl.policies.LoRATeam`'s base with adapters disabled (no copy);
``dpo_reference=False`` drops it (CoMLRL 1.4.3's reference-free margin).

Online by default: every epoch samples new candidates from the current policies;
``preference_refresh="once"`` trains every epoch on the first epoch's pairs, as CoMLRL 1.4.3
does (docs/preference.md lists every difference).
"""

from __future__ import annotations

import random
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from llm_marl.learners.preference import math as pm
from llm_marl.learners.buffer import Sample
from llm_marl.learners.config import MAGRPOConfig, _at_least, _one_of, _positive
from llm_marl.learners.reinforce.trainer import MAGRPOTrainer
from llm_marl.learners.update import _score_batches
from llm_marl.learners.tree import RolloutNode, derive_seed, iter_nodes
from llm_marl.policies.base import Completion, Policy

__all__ = ["MADPOConfig", "MADPOTrainer", "PreferenceSample"]

COLLABORATION_MODES = ("decentralized", "centralized")
PREFERENCE_REFRESH = ("epoch", "once")


@dataclass
class MADPOConfig(MAGRPOConfig):
    """Configuration of :class:`MADPOTrainer`: MAGRPOConfig's fields plus the preference ones."""

    # --- the anchor's defaults for shared fields ---
    num_turns: int = 1
    """Turns per episode; the preference learners need 1."""
    num_generations: int = 4
    """Unused by MADPO, which samples preference_num_candidates answers (MARLHF: the RL phase's K)."""
    early_termination_threshold: float | None = None
    """Unused with one turn; None."""

    # --- preference fields ---
    preference_num_candidates: int = 80
    """C: answers sampled per agent per item to build preference pairs from (>= 2)."""
    preference_pairs_per_sample: int | None = 16
    """At most this many (winner, loser) pairs per item; None: every pair (required for pair_selection="all")."""
    pair_selection: str = "reward_gap"
    """"reward_gap": largest reward gaps first; "all": every pair; "random": a random subset."""
    dpo_beta: float = 0.1
    """beta of the DPO loss -log sigmoid(beta * sum_i margin_i) (> 0)."""
    dpo_reference: bool = True
    """Margins against the frozen reference (standard DPO); False: CoMLRL 1.4.3's reference-free margin."""
    collaboration_mode: str = "decentralized"
    """"decentralized": one policy per agent; "centralized": ONE policy writes every role (num_agents: the roles; docs/preference.md §4)."""
    preference_refresh: str = "epoch"
    """"epoch": new candidates from the current policies every epoch; "once": the first epoch's pairs are trained on again in every later epoch (CoMLRL 1.4.3's schedule)."""
    use_environment_step: bool = True
    """Accepted for CoMLRL scripts (its W&B step counter); logs here are indexed by dataset batch."""
    environment_steps_per_pair: int = 2
    """Accepted for CoMLRL scripts (its W&B step counter, >= 1); unused here."""

    def validate(self) -> None:
        super().validate()
        if self.num_turns != 1:
            raise ValueError(f"num_turns must be 1 for {type(self).__name__} (preferences are over one-turn joint answers); got {self.num_turns!r}")
        _at_least(self, "preference_num_candidates", 2)
        if self.preference_pairs_per_sample is not None:
            _at_least(self, "preference_pairs_per_sample", 1)
        _one_of(self, "pair_selection", self._pair_selections())
        if self.pair_selection == "all" and self.preference_pairs_per_sample is not None:
            raise ValueError("preference_pairs_per_sample must be None when pair_selection='all' (every pair is kept)")
        _positive(self, "dpo_beta")
        _one_of(self, "collaboration_mode", COLLABORATION_MODES)
        _one_of(self, "preference_refresh", PREFERENCE_REFRESH)
        _at_least(self, "environment_steps_per_pair", 1)
        self._check_reference_kl()

    def _pair_selections(self) -> tuple[str, ...]:
        return pm.PAIR_SELECTIONS

    def _check_reference_kl(self) -> None:
        if self.reference_kl_enabled:
            raise ValueError(
                "reference_kl_enabled is a REINFORCE field: MADPO's reference enters the DPO margins (dpo_reference)"
            )


@dataclass
class PreferenceSample(Sample):
    """One (item, agent) of MADPO: the agent's answers to the item, its returns (the shared
    reward of its answers' joint actions), and the item's preference pairs.

    ``advantages`` holds, per answer, (times in a winner − times in a loser) / pairs: the sign
    of the push DPO gives it (recorded; the loss does not read it)."""

    pairs: list[tuple[int, int]] = field(default_factory=list)
    """(winner, loser) joint-action indices of the item's tree node."""
    answer_pairs: list[tuple[int, int]] = field(default_factory=list)
    """Per pair, this agent's answer indices in the winner and the loser joint answer."""
    pair_rewards: list[tuple[float, float]] = field(default_factory=list)
    """Per pair, the winner's and the loser's shared reward."""
    reference_log_probs: list[tuple[float, float]] = field(default_factory=list)
    """Per pair, the frozen reference's log-prob of this agent's winner and loser answer; empty without a reference."""
    fixed_margins: list[float] = field(default_factory=list)
    """Per pair, the summed DPO margins of the agents that are not trained (fixed partners)."""


class MADPOTrainer(MAGRPOTrainer):
    """Multi-agent DPO with a joint loss over agents (see the module docstring).

    Env-native: ``MADPOTrainer(env=..., policies=..., args=MADPOConfig(...), eval_env=None)``.
    """


    config_class = MADPOConfig

    def __init__(self, env: Any = None, policies: Any = None, args: MADPOConfig | None = None, eval_env: Any = None, *,
                 centralized_comparator_adapter: Any = None, **kwargs: Any):
        if args is not None and not isinstance(args, self.config_class):
            raise TypeError(f"args must be a {self.config_class.__name__}, got {type(args).__name__}")
        if args is not None and args.fsdp and centralized_comparator_adapter is not None:
            raise ValueError("fsdp=True does not shard a centralized comparator yet; train it without fsdp")
        env, policies, args, eval_env, one = centralize_if_asked(env, policies, args, eval_env, centralized_comparator_adapter, type(self).__name__)
        super().__init__(env, policies, args, eval_env, **kwargs)
        if one is not None:
            one.attach(self)
        self.dpo_references: dict[str, Policy] | None = None
        """Agent -> frozen reference of the DPO margins (None with dpo_reference=False)."""
        if self.args.dpo_reference:
            if self.reference_policies is None:
                self.reference_policies = self._make_references()  # saved and restored by checkpoints
            self.dpo_references = self.reference_policies
        self.pair_store = _PairStore()
        """preference_refresh="once": the first epoch's samples of each dataset batch."""

    def checkpoint_extras(self) -> dict[str, Any]:
        """preference_refresh="once": the first epoch's samples (trained on again later)."""
        return {"preference_store": self.pair_store} if self.args.preference_refresh == "once" else {}

    # --- rollout -> preference samples ------------------------------------------------------

    def _collect(self, indices: list[int]) -> tuple[list[RolloutNode], list[Sample], float]:
        """The batch's one-turn trees with ``preference_num_candidates`` answers per agent; with
        preference_refresh="once", after the first epoch: no trees, the first epoch's samples of
        this batch again."""
        once = getattr(self.args, "preference_refresh", "epoch") == "once"
        if once and self.state.epoch > 0 and self.state.batch_in_epoch in self.pair_store.batches:
            return [], list(self.pair_store.batches[self.state.batch_in_epoch]), 0.0
        saved = self.args.num_generations
        self.args.num_generations = self._candidates()
        try:
            roots, samples, elapsed = super()._collect(indices)
        finally:
            self.args.num_generations = saved
        if once and self.state.epoch == 0:
            self.pair_store.batches[self.state.batch_in_epoch] = list(samples)
        return roots, samples, elapsed

    def _candidates(self) -> int:
        """Answers per agent per item: ``preference_num_candidates``."""
        return self.args.preference_num_candidates

    def _pair_rng(self, node: RolloutNode) -> random.Random:
        """The private random source of pair_selection="random" for one item of this epoch."""
        return random.Random(derive_seed(self.args.seed, "preference_pairs", self.state.epoch, node.index))

    def _node_pairs(self, node: RolloutNode) -> list[tuple[int, int]]:
        args = self.args
        return select_pairs(node.rewards, args.pair_selection, args.preference_pairs_per_sample, self._pair_rng(node))

    def _samples(self, roots: list[RolloutNode]) -> list[Sample]:
        nodes = list(iter_nodes(roots))
        if not nodes:
            return []
        pairs = [self._node_pairs(node) for node in nodes]
        answer_pairs = {  # [] at a node where the agent does not act (turn-based envs)
            agent: [
                [(node.joint[w][node.agents.index(agent)], node.joint[l][node.agents.index(agent)]) for w, l in node_pairs] if node.acts(agent) else []
                for node, node_pairs in zip(nodes, pairs)
            ]
            for agent in self.agent_ids
        }
        reference = {a: [[] for _ in nodes] for a in self.agent_ids}
        if self.dpo_references is not None:
            for agent in self.agent_ids:
                reference[agent] = _pair_log_probs(self.dpo_references[agent], nodes, agent, answer_pairs[agent], self.args.logprob_reduction)
        fixed = [[0.0] * len(node_pairs) for node_pairs in pairs]
        for agent in self.agent_ids:
            if agent in self.optimizer_by_agent:
                continue
            with torch.no_grad():
                own = _pair_log_probs(self.policies[agent], nodes, agent, answer_pairs[agent], self.args.logprob_reduction)
            for n in range(len(nodes)):
                for q, (w, l) in enumerate(own[n]):
                    ref_w, ref_l = reference[agent][n][q] if reference[agent][n] else (0.0, 0.0)
                    fixed[n][q] += (w - ref_w) - (l - ref_l)
        samples: list[Sample] = []
        for n, node in enumerate(nodes):
            rewards = [(float(node.rewards[w]), float(node.rewards[l])) for w, l in pairs[n]]
            for agent in self.agent_ids:
                # An agent that does not act here keeps a placeholder (no answers, margin 0, no
                # log-prob or gradient) so that every agent's samples hold the same pairs.
                k = len(node.completions.get(agent, ()))
                samples.append(
                    PreferenceSample(
                        agent,
                        node.observations[agent],
                        list(node.completions.get(agent, ())),
                        node.agent_returns(agent) if k else [],
                        pm.net_preferences(k, answer_pairs[agent][n]) if k else [],
                        node.index,
                        node.turn,
                        pairs=list(pairs[n]),
                        answer_pairs=list(answer_pairs[agent][n]),
                        pair_rewards=rewards,
                        reference_log_probs=list(reference[agent][n]),
                        fixed_margins=list(fixed[n]),
                    )
                )
            self._note("train/preference/pairs_per_item", float(len(pairs[n])))
            if rewards:
                self._note("train/preference/reward_gap_mean", float(np.mean([w - l for w, l in rewards])))
        return samples

    # --- the joint DPO update -----------------------------------------------------------------

    def _team_backward(self, step: Mapping[str, list[Sample]]) -> dict[str, tuple[torch.Tensor, float | None]]:
        """The mean joint DPO loss of the step's pairs, back-propagated ONCE into every trained
        agent (each through its own margins); agent -> (this rank's share of the loss, mean
        log-prob of its scored answers). ``fsdp=True``: on every agent's gathered weights, then
        each agent's gradients are reduce-scattered into its shards (every rank, in agent order)."""
        sharded = list({id(m): m for m in (self.sharded[a] for a in step if a in self.sharded)}.values())  # a team: one base
        if not sharded:
            return self._joint_backward(step)
        try:
            with ExitStack() as stack:
                for model in sharded:
                    stack.enter_context(model.accumulating())
                return self._joint_backward(step)
        finally:
            for model in sharded:
                model.reduce()

    def _joint_backward(self, step: Mapping[str, list[Sample]]) -> dict[str, tuple[torch.Tensor, float | None]]:
        """:meth:`_team_backward` on weights at hand."""
        agents = list(step)
        with_samples = {a: list(b) for a, b in step.items() if b}
        _check_aligned(with_samples)
        count = len(_flat_pairs(next(iter(with_samples.values())))) if with_samples else 0
        total = self.dist.sum(count)
        for agent in agents:
            self.optimizer_by_agent[agent].zero_grad(set_to_none=True)
        local = torch.zeros((), dtype=torch.float64)
        means: dict[str, float | None] = {a: None for a in agents}
        if count:
            margins, means = self._margins(with_samples)
            first = next(iter(with_samples.values()))
            fixed = torch.tensor([m for s in first for m in s.fixed_margins], dtype=margins.dtype, device=margins.device)
            all_margins = torch.cat([margins, fixed[None]])
            losses = pm.joint_dpo_losses(all_margins, self.args.dpo_beta)
            local = losses.sum() / total
            if torch.isfinite(local):
                local.backward()
            joint = all_margins.detach().sum(dim=0)
            self._note("train/dpo/loss", float(losses.detach().mean()))
            self._note("train/dpo/margin_mean", float(joint.mean()))
            self._note("train/dpo/accuracy", float((joint > 0).double().mean()))
            for row, agent in enumerate(with_samples):
                self._note(f"train/{agent}/margin_mean", float(margins[row].detach().mean()))
        return {agent: (local, means.get(agent)) for agent in agents}

    def _margins(self, batches: Mapping[str, list[PreferenceSample]]) -> tuple[torch.Tensor, dict[str, float]]:
        """Differentiable margins Δ of every pair of ``batches`` (rows: agents in order), and each
        agent's mean log-prob of its scored answers. Agents of one team score in one forward."""
        proxies, positions = {}, {}
        for agent, batch in batches.items():
            proxies[agent], positions[agent] = [], []
            for s in batch:
                if not s.completions:
                    continue  # a placeholder: the agent did not act at that node
                unique = sorted({k for pair in s.answer_pairs for k in pair})
                proxies[agent].append(Sample(agent, s.observation, [s.completions[k] for k in unique], [], [], s.index, s.turn))
                positions[agent].append({k: i for i, k in enumerate(unique)})
        scored = _score_batches(self.policies, {a: p for a, p in proxies.items() if p}, self.args.logprob_reduction)
        rows, means = [], {}
        device = next((t.device for t in scored.values()), None)
        for agent, batch in batches.items():
            flat = scored.get(agent)
            chosen, rejected, offset, place = [], [], 0, []
            proxy_iter = iter(zip(positions[agent], proxies[agent]))
            for s in batch:
                if not s.completions:
                    place += [False] * len(s.pairs)
                    continue
                where, proxy = next(proxy_iter)
                for w, l in s.answer_pairs:
                    chosen.append(offset + where[w])
                    rejected.append(offset + where[l])
                offset += len(proxy.completions)
                place += [True] * len(s.answer_pairs)
            row = torch.zeros(len(place), dtype=torch.float64 if flat is None else flat.dtype, device=device)
            if flat is not None and chosen:
                lp_w, lp_l = flat[chosen], flat[rejected]
                ref = [r for s in batch for r in s.reference_log_probs]
                ref_w = torch.tensor([r[0] for r in ref], dtype=flat.dtype, device=flat.device) if ref else None
                ref_l = torch.tensor([r[1] for r in ref], dtype=flat.dtype, device=flat.device) if ref else None
                row = row.index_put((torch.tensor(place, device=row.device).nonzero().flatten(),), pm.dpo_margins(lp_w, lp_l, ref_w, ref_l).to(row.device))
            rows.append(row)
            means[agent] = float(flat.detach().mean()) if flat is not None and flat.numel() else None
        dtype = next((r.dtype for r, a in zip(rows, batches) if scored.get(a) is not None), torch.float64)
        return torch.stack([r.to(dtype) for r in rows]), means

    def _loss_sum(self, agent: str, batch: list[Sample]) -> tuple[torch.Tensor, float]:
        raise NotImplementedError("MADPO's loss is joint over agents: it is computed for all agents at once in _team_backward")


class _PairStore:
    """Samples kept per dataset batch (checkpointed as a state dict)."""

    def __init__(self) -> None:
        self.batches: dict[int, list[Sample]] = {}

    def state_dict(self) -> dict[str, Any]:
        return {"batches": self.batches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batches = dict(state["batches"])


def centralize_if_asked(env: Any, policies: Any, args: Any, eval_env: Any, adapter: Any, learner: str) -> tuple[Any, Any, Any, Any, Any]:
    """With ``args.collaboration_mode == "centralized"`` (env-native constructor): the env, eval
    env, policies and config of :class:`~llm_marl.learners.reinforce.centralized.Centralized`, and it (to
    attach); otherwise everything as given and None."""
    if args is None or getattr(args, "collaboration_mode", "decentralized") != "centralized" or env is None:
        return env, policies, args, eval_env, None
    from llm_marl.learners.reinforce.centralized import Centralized

    if policies is None:
        raise TypeError(f"{learner}: collaboration_mode='centralized' needs policies=[the one joint policy]")
    one = Centralized(env, policies, args, eval_env, adapter, learner)
    return one.env, one.policies, one.args, one.eval_env, one


def select_pairs(rewards: Sequence[float], mode: str, limit: int | None, rng: random.Random) -> list[tuple[int, int]]:
    """:func:`~llm_marl.learners.preference.math.select_pairs` (looked up here, so a test's
    control can replace it)."""
    return pm.select_pairs(rewards, mode, limit, rng)


def _pair_log_probs(
    policy: Policy, nodes: Sequence[RolloutNode], agent: str, answer_pairs: Sequence[Sequence[tuple[int, int]]], reduction: str
) -> list[list[tuple[float, float]]]:
    """Per node, per pair: ``policy``'s log-prob (no gradient) of ``agent``'s winner and loser
    answer; each distinct answer is scored once, all nodes in one call."""
    observations: list[Any] = []
    completions: list[Completion] = []
    where: list[dict[int, int]] = []
    for node, pairs in zip(nodes, answer_pairs):
        unique = sorted({k for pair in pairs for k in pair})
        where.append({k: len(observations) + i for i, k in enumerate(unique)})
        observations += [node.observations[agent]] * len(unique)
        completions += [node.completions[agent][k] for k in unique]
    if not completions:
        return [[] for _ in nodes]
    with torch.no_grad():
        values = policy.log_probs(observations, completions, reduction=reduction).detach().float().cpu().tolist()
    return [[(values[at[w]], values[at[l]]) for w, l in pairs] for at, pairs in zip(where, answer_pairs)]


def _flat_pairs(batch: Sequence[PreferenceSample]) -> list[tuple[int, int]]:
    return [pair for s in batch for pair in s.pairs]


def _check_aligned(batches: Mapping[str, Sequence[PreferenceSample]]) -> None:
    """Every agent's mini-batch must hold the same items' pairs in the same order."""
    items = None
    for agent, batch in batches.items():
        key = [(s.index, tuple(s.pairs)) for s in batch]
        if items is None:
            items, first = key, agent
        elif key != items:
            raise ValueError(
                f"agents {first!r} and {agent!r} have mini-batches of different preference pairs "
                f"(items {[k[0] for k in items]} vs {[k[0] for k in key]}); MADPO's loss needs every agent's samples of the same items"
            )

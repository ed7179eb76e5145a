"""The update: buffered samples -> mini-batches -> one all-or-nothing optimizer step of every agent.

:class:`JointUpdate` is the part of every trainer that turns what the buffers hold into optimizer
steps (mixed into :class:`~llm_marl.learners.reinforce.trainer.MAGRPOTrainer`). Its methods are the hooks
a learner overrides: ``_minibatches`` (how a buffer is cut), ``_loss_sum`` (an agent's loss),
``_team_backward`` (a team of adapters scored in one forward), ``_other_backwards`` (critics,
reward models: what else steps with the agents). The invariant: mini-batch i of every agent is
scored and its loss and gradient checked before any optimizer steps; a non-finite one raises
``FloatingPointError`` and leaves weights, optimizer states, buffers and ``global_step`` as they
were before that step.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from llm_marl.advantages import answer_entropies, sample_losses
from llm_marl.learners.buffer import Sample
from llm_marl.learners.natural_gradient import precondition
from llm_marl.learners.staleness import SamplerStalenessError, StalenessChecks
from llm_marl.learners.stalls import entropy_coefficient
from llm_marl.learners.tree import ask_team
from llm_marl.policies.base import GAP_BASELINE_MULTIPLE, GAP_PERSISTENCE, Policy, calibrated_threshold, gap_baseline, take_token_entropy
from llm_marl.policies.weight_changes import optimizer_parameters, weights_changed
from llm_marl.runs.fsdp import grad_norm as sharded_grad_norm
from llm_marl.runs.fsdp import is_sharded

__all__ = ["JointUpdate", "SamplerGapError", "SamplerStalenessError", "default_optimizer"]

GAP_CAUSES = (
    "likely causes: a sampling copy not refreshed after a weight change (bf16 shadow, packed weights; "
    "code that writes weights outside an optimizer calls llm_marl.policies.weight_changes.weights_changed), "
    "dropout active while scoring, sampling and scoring settings that differ (temperature, chat template, "
    "generation_kwargs), or the rounding of a low-precision sampler"
)


class SamplerGapError(RuntimeError):
    """The sampler–scorer gap of an agent exceeded ``max_sampler_gap``."""


def default_optimizer(
    params: list[torch.nn.Parameter], lr: float, weight_decay: float, kind: str = "adamw_torch"
) -> torch.optim.Optimizer:
    """AdamW with torch's fused kernel where every parameter allows it (floating point, on CPU or
    CUDA), the usual per-tensor loop elsewhere. Both compute the same update. FSDP shards beside
    whole tensors (a sharded critic's value head) go in two groups: AdamW steps a group at once.
    ``kind="sgd"`` (config ``optim``): plain SGD, no momentum, ``weight_decay`` as an L2 term."""
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay)
    fusable = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    shards = [p for p in params if is_sharded(p)]
    if shards and len(shards) < len(params):
        params = [{"params": shards}, {"params": [p for p in params if not is_sharded(p)]}]  # type: ignore[list-item]
    if fusable:
        try:
            return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
        except (RuntimeError, TypeError):  # a torch build without the fused kernel for this device
            pass
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def _grad_norm(params: list[torch.nn.Parameter], max_norm: float | None) -> torch.Tensor:
    """The total 2-norm of the gradients, after clipping them to ``max_norm`` when it is given
    (sharded ``fsdp`` gradients: over all ranks' shards, :func:`llm_marl.runs.fsdp.grad_norm`)."""
    if any(is_sharded(p) for p in params):
        return sharded_grad_norm(params, max_norm)
    if max_norm is not None:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    norms = torch._foreach_norm(grads) if hasattr(torch, "_foreach_norm") else [g.norm() for g in grads]
    return torch.linalg.vector_norm(torch.stack([n.to(grads[0].device) for n in norms]))



@dataclass
class _Backward:
    """One agent's scored mini-batch: its loss and gradient norm, or why it cannot be stepped."""

    loss: float
    grad_norm: float
    log_prob_mean: float | None
    error: str | None



class JointUpdate(StalenessChecks):
    """The update half of a trainer (module docstring). Needs ``args``, ``agents``, ``policies``,
    ``buffers``, ``optimizers``, ``trainable``, ``dist``, ``state`` and ``_note``/``_last_good``."""

    _fsdp_supported = True
    """Whether ``fsdp=True`` shards this learner's agents (False: a one-line error; llm_marl/runs/fsdp.py)."""

    _update_plan: dict | None = None
    """The rest of an update that ``max_steps`` cut (its mini-batches, counts, next index), or None."""

    def _update_cut(self) -> bool:
        """Whether the last update stopped at ``max_steps`` with mini-batches left."""
        return self._update_plan is not None

    def _cut_pending(self) -> bool:
        """Whether ``max_steps`` cut a batch or an epoch's closing update that is still to finish."""
        return getattr(self, "_unfinished", None) is not None or self._update_cut()

    def _update_or_keep(self, unfinished: object) -> bool:
        """:meth:`_update`; if it raises, or stops at ``max_steps``, keep ``unfinished`` (the
        batch, :class:`~llm_marl.learners.reinforce.trainer._UnfinishedBatch`) for the next call to
        finish. Returns whether the update finished."""
        try:
            self._update(full_only=True)
        except Exception:
            self._unfinished = unfinished
            raise
        if self._update_cut():
            self._unfinished = unfinished
            return False
        return True

    def _buffer_size(self, agent: str) -> int:
        """``agent``'s rollout_buffer_size (``agent_rollout_buffer_sizes`` where set)."""
        of = getattr(self.args, "rollout_buffer_size_of", None)
        return self.args.rollout_buffer_size if of is None else of(self.agent_ids.index(agent))

    def _train_batch_size(self, agent: str) -> int:
        """``agent``'s samples per optimizer step: train_batch_size, else its buffer size."""
        return self._buffer_size(agent) if self.args.train_batch_size is None else self.args.train_batch_size

    def _buffer_full(self, agent: str) -> bool:
        return len(self.buffers[agent]) >= self._buffer_size(agent)

    def _buffers_full(self) -> bool:
        """Whether an update is due: some agent's buffer holds ``rollout_buffer_size`` samples.
        Every agent's fills at once where every agent acts at every node; in a turn-based env an
        agent that acts less (or never) does not hold up the others' updates."""
        return any(self._buffer_full(agent) for agent in self.agent_ids)

    def _update(self, full_only: bool = False) -> None:
        """Consume every agent's buffer in mini-batches of train_batch_size, one optimizer step each;
        ``full_only``: only the buffers that are full (an update during the epoch; a partly filled
        buffer waits for the epoch's end, docs/algorithms.md §4).

        All-or-nothing across agents: mini-batch i of every agent is scored and its loss and
        gradient checked before any agent's optimizer steps. A non-finite loss or gradient raises
        ``FloatingPointError`` and leaves every agent's weights and optimizer state, the samples
        not yet trained on (still in the buffers) and ``global_step`` as they were before that
        step; steps before it stand. Gradients of all agents are held at once for this.

        ``max_steps`` is checked before every optimizer step: reached, the update stops there and
        its remaining mini-batches, cut as they were (advantages whitened over the whole buffer
        included), are kept in ``_update_plan`` (checkpointed); the next call finishes them first,
        so a run stopped at ``max_steps`` and continued equals one that never stopped (distributed:
        every rank stops at the same step and its checkpoint keeps each rank's own rest).

        Distributed: every rank takes the same number of steps (the most any rank needs); a rank
        out of samples contributes zero gradient. parallel_training="mp": agents are scored
        concurrently, each on its own device.
        """
        self._reown_restored()  # a resume's buffered answers, the cut update's included
        plan, self._update_plan = getattr(self, "_update_plan", None), None
        if plan is not None:  # the rest of an update that max_steps cut: its mini-batches as planned then
            batches, counts, first = plan["batches"], plan["counts"], plan["next"]
        else:
            if not self.dist.max(int(any(len(buffer) for buffer in self.buffers.values()))):
                return
            if self.dist.enabled:
                for agent in self.agent_ids:
                    policy = self.policies[agent]
                    if hasattr(policy, "pending_observations"):
                        policy.add_observations(self.dist.union(policy.pending_observations()))
            chosen = [agent for agent in self.agent_ids if not full_only or self.dist.max(int(self._buffer_full(agent)))]
            batches = {agent: self._minibatches(agent, self._train_batch_size(agent)) if agent in chosen else [] for agent in self.agent_ids}
            counts = {agent: self.dist.max(len(batches[agent])) for agent in self.agent_ids}
            first = 0
        for i in range(first, max(counts.values())):
            if self._reached_max_steps():  # the rest stays planned (each rank's, checkpointed) for the next call
                self._update_plan = {"batches": batches, "counts": counts, "next": i}
                return
            step = {
                agent: batches[agent][i] if i < len(batches[agent]) else []
                for agent in self.agent_ids
                if agent in self.optimizer_by_agent and i < counts[agent]
            }
            self._joint_optimizer_step(step)
            for agent in self.agent_ids:
                if i < len(batches[agent]):
                    self.buffers[agent].discard(len(batches[agent][i]))
            self.state.global_step += 1

    def _minibatches(self, agent: str, size: int) -> list[list[Sample]]:
        """``agent``'s buffer as this update's consecutive mini-batches (kept in the buffer until trained on)."""
        return self.buffers[agent].batches(size)

    def _joint_optimizer_step(self, step: dict[str, list[Sample]]) -> None:
        """One optimizer step of every agent in ``step`` (agent -> mini-batch), or of none."""
        self._reown_restored()
        agents = list(step)
        concurrent = self.args.parallel_training == "mp" and not self.dist.enabled and len(agents) > 1
        results: list[_Backward] = []
        others: list[tuple[str, torch.optim.Optimizer, _Backward]] = []
        try:
            done = self._team_backward(step)  # each team of adapters: one forward, one backward
            if concurrent:
                with ThreadPoolExecutor(max_workers=len(agents)) as pool:
                    results = list(pool.map(lambda agent: self._backward(agent, step[agent], done.get(agent)), agents))
            else:
                for agent in agents:  # stops at the first failure: the decision is the same on every rank
                    results.append(self._backward(agent, step[agent], done.get(agent)))
                    if results[-1].error:
                        break
            failed = next((r.error for r in results if r.error), None)
            if not failed:
                self._check_sampler_staleness(step)
                self._check_sampler_gaps(agents)
                others = self._other_backwards(step)
                failed = next((r.error for _, _, r in others if r.error), None)
            if failed:
                raise FloatingPointError(
                    f"{failed}; no agent was updated (weights, optimizer states, buffered samples and "
                    f"global_step are as before this step){self._last_good()}"
                )
        except BaseException:
            for optimizer in [self.optimizer_by_agent[agent] for agent in agents] + [o for _, o, _ in others]:
                optimizer.zero_grad(set_to_none=True)
            raise
        for agent, result in zip(agents, results):
            self.optimizer_by_agent[agent].step()
            weights_changed(optimizer_parameters(self.optimizer_by_agent[agent]))  # whatever the optimizer
            self.weight_versions.advance(agent, self.policies[agent].parameters())
            self.optimizer_by_agent[agent].zero_grad(set_to_none=True)
            self._note(f"train/{agent}/loss", result.loss)
            self._note(f"train/{agent}/grad_norm", result.grad_norm)
            if result.log_prob_mean is not None:
                self._note(f"train/{agent}/logprob_mean", result.log_prob_mean)
        for name, optimizer, result in others:
            optimizer.step()
            weights_changed(optimizer_parameters(optimizer))
            optimizer.zero_grad(set_to_none=True)
            self._note(f"train/{name}/loss", result.loss)
            self._note(f"train/{name}/grad_norm", result.grad_norm)

    def _check_sampler_gaps(self, agents: Sequence[str]) -> None:
        """Log each agent's ``train/<agent>/sampler_gap`` (mean |log p_sampler - log p_scorer| per
        token of the answers scored for this step that it sampled with the same weights; see
        :class:`~llm_marl.policies.base.GapMeter`). Past a threshold calibrated on the run's first
        measured gap (:func:`~llm_marl.policies.base.calibrated_threshold`: a multiple of it, at most
        the sampler dtype's default) on :data:`~llm_marl.policies.base.GAP_PERSISTENCE` optimizer
        steps in a row it warns once per agent; past ``max_sampler_gap`` it raises :class:`SamplerGapError` (no agent
        is updated). Distributed: the ranks' tokens are pooled, so every rank decides alike."""
        limit = getattr(self.args, "max_sampler_gap", None)
        baselines = self.__dict__.setdefault("_gap_baselines", {})  # per agent: the run's gaps so far (policies/base.py)
        over = self.__dict__.setdefault("_gaps_over", {})  # per agent: optimizer steps in a row past the threshold
        for agent in agents:
            meter = getattr(self.policies[agent], "sampler_gap", None)
            if meter is None:
                continue
            total, tokens = meter.drain()
            if self.dist.enabled:
                total, tokens = self.dist.sum(total), int(self.dist.sum(tokens))
            if not tokens:
                continue
            gap = total / tokens
            self._note(f"train/{agent}/sampler_gap", gap)
            baseline = baselines.get(agent)
            threshold = calibrated_threshold(meter.threshold, baseline)
            where = (
                f"agent {agent!r}, optimizer step {self.state.global_step + 1}: the sampled tokens' log-probs "
                f"differ from the scorer's by {gap:.3g} per token (mean |delta| over {tokens} tokens, {meter.dtype} sampler)"
            )
            if limit is not None and gap > limit:
                raise SamplerGapError(f"{where}, past max_sampler_gap={limit:g}; {GAP_CAUSES}")
            if gap <= threshold:
                baselines[agent] = gap_baseline(baseline, gap)  # a gap past it does not raise the bar
                over[agent] = 0
                continue
            over[agent] = over.get(agent, 0) + 1
            if over[agent] >= GAP_PERSISTENCE:
                self._warn_once(
                    f"sampler_gap/{agent}",
                    f"{where}, past the threshold {threshold:g} ({_calibration(baseline)}, at most the default "
                    f"{meter.threshold:g} for {meter.dtype} sampling) for {over[agent]} optimizer steps in a row: the answers "
                    f"are not quite drawn from the policy being trained; {GAP_CAUSES}. max_sampler_gap stops a run instead",
                )

    def _other_backwards(self, step: dict[str, list[Sample]]) -> list[tuple[str, torch.optim.Optimizer, "_Backward"]]:
        """Gradients of what else learns from this step's mini-batches, after every agent's
        gradient is known to be finite: ``(metric name, optimizer, _Backward)`` each, stepped
        together with the agents or not at all. None here; actor-critic learners: their critics."""
        return []

    def _local_loss(self, batch: list[Sample], log_probs: torch.Tensor, total: int) -> torch.Tensor:
        """This rank's share of the mean sample loss of ``batch`` (``total`` samples on all ranks)."""
        advantages = torch.tensor([a for s in batch for a in s.advantages], device=log_probs.device)
        return sample_losses(log_probs, advantages, [len(s.completions) for s in batch]).sum() / total

    def _team_backward(self, step: Mapping[str, list[Sample]]) -> dict[str, tuple[torch.Tensor, float | None]]:
        """For the agents of each team of adapters in ``step`` (at least two with samples): their
        answers scored in ONE forward, their finite losses back-propagated in ONE backward (each
        reaches only its agent's adapter). Returns agent -> (local loss, mean log-prob).
        Distributed runs score agents one by one (every rank then makes the same collective
        calls in the same order, whichever agents have samples there), as do learners whose
        loss is not this class's ``_loss_sum`` (the actor-critic learners)."""
        done: dict[str, tuple[torch.Tensor, float | None]] = {}
        if self.dist.enabled or type(self)._loss_sum is not JointUpdate._loss_sum:
            return done  # learners with their own loss (actor-critic) score agents one by one
        with_samples = {agent: batch for agent, batch in step.items() if batch}
        for group in _update_groups(self.policies, list(with_samples)):
            if len(group) < 2:
                continue
            for agent in group:
                self.optimizer_by_agent[agent].zero_grad(set_to_none=True)
            scored = _score_batches(self.policies, {a: with_samples[a] for a in group}, self.args.logprob_reduction)
            finite = []
            for agent in group:
                total = self.dist.sum(len(with_samples[agent]))
                local = self._local_loss(with_samples[agent], scored[agent], total)
                bonus = self._entropy_bonus(agent, with_samples[agent])
                if bonus is not None:
                    local = local - bonus.to(local.device, local.dtype) / total
                if torch.isfinite(local):
                    finite.append(local)
                done[agent] = (local, scored[agent].detach().mean().item())
            if finite:
                torch.stack([f.to(finite[0].device) for f in finite]).sum().backward()
        return done

    def _backward(
        self, agent: str, batch: list[Sample], done: tuple[torch.Tensor, float | None] | None = None
    ) -> "_Backward":
        """Gradient of the mean sample loss of ``batch`` (of the union of the ranks' batches) in
        the agent's parameters, summed over ranks and clipped; nothing is stepped. ``done``: the
        loss and mean log-prob where the team's backward already ran (:meth:`_team_backward`)."""
        optimizer, params = self.optimizer_by_agent[agent], self.trainable[agent]
        if done is not None:  # back-propagated with its team: only sum over ranks, check and clip
            local, log_prob_mean = done
            return self._gradient(f"agent {agent!r}", params, local.detach(), batch, log_prob_mean, agent)
        total = self.dist.sum(len(batch))
        optimizer.zero_grad(set_to_none=True)
        local = torch.zeros((), dtype=torch.float64)
        log_prob_mean = None
        sharded = getattr(self, "sharded", {}).get(agent)  # fsdp: score on the gathered weights
        try:
            with sharded.accumulating() if sharded is not None else nullcontext():
                if batch:
                    loss_sum, log_prob_mean = self._loss_sum(agent, batch)
                    local = loss_sum / total
                if sharded is not None and local.requires_grad and torch.isfinite(local):
                    local.backward()  # this rank's full gradient, kept locally
        finally:
            if sharded is not None:
                sharded.reduce()  # every rank, whatever its batch held: reduce-scatter into the shards
        return self._gradient(f"agent {agent!r}", params, local.detach() if sharded is not None else local, batch, log_prob_mean, agent)

    def _loss_sum(self, agent: str, batch: list[Sample]) -> tuple[torch.Tensor, float]:
        """The sum over ``batch`` of each sample's loss mean_k(-A_k log pi(answer_k)), differentiable,
        and the mean log pi of its answers."""
        observations = [s.observation for s in batch for _ in s.completions]
        completions = [c for s in batch for c in s.completions]
        log_probs = self.policies[agent].log_probs(observations, completions, reduction=self.args.logprob_reduction)
        advantages = torch.tensor([a for s in batch for a in s.advantages], device=log_probs.device)
        losses = sample_losses(log_probs, advantages, [len(s.completions) for s in batch])
        total = losses.sum()
        bonus = self._entropy_bonus(agent, batch)
        if bonus is not None:
            total = total - bonus.to(total.device, total.dtype)
        return total, log_probs.detach().mean().item()

    def _entropy_bonus(self, agent: str, batch: list[Sample]) -> torch.Tensor | None:
        """Log ``train/<agent>/entropy`` (mean entropy per sampled token, from the agent's last
        scoring pass) and return ``entropy_coef`` x the sum over ``batch`` of each sample's mean
        per-answer entropy (differentiable), or None where the policy records no entropy or
        ``entropy_coef`` is 0."""
        found = take_token_entropy(self.policies[agent])
        if found is None:
            return None
        entropy, mask = found
        tokens = int(mask.sum())
        if tokens:
            self._note(f"train/{agent}/entropy", float((entropy.detach() * mask).sum()) / tokens)
        coef = self._entropy_coef()
        if not coef:
            return None
        per_answer = answer_entropies(entropy, mask)
        sizes = [len(s.completions) for s in batch]
        return coef * torch.stack([chunk.mean() for chunk in per_answer.split(sizes)]).sum()

    def _entropy_coef(self) -> float:
        """``entropy_coef`` at this dataset batch: annealed towards ``entropy_coef_final`` over the
        run's batches (:func:`~llm_marl.learners.stalls.entropy_coefficient`), noted as
        ``train/entropy_coef`` when annealed."""
        start, final = getattr(self.args, "entropy_coef", 0.0), getattr(self.args, "entropy_coef_final", None)
        batches = getattr(self, "_schedule_batches", None)
        if final is None or batches is None:
            return start
        coef = entropy_coefficient(start, final, self.state.batch_step, batches)
        self._note("train/entropy_coef", coef)
        return coef

    def _gradient(
        self, who: str, params: list[torch.nn.Parameter], local: torch.Tensor, batch: list[Sample],
        log_prob_mean: float | None = None, agent: str | None = None,
    ) -> "_Backward":
        """Backpropagate this rank's share ``local`` of a mini-batch loss, sum the gradients of
        ``params`` over ranks, precondition them (``agent``'s, with ``natural_gradient``) and clip
        them; errors name ``who``, the optimizer step and the items."""
        if local.requires_grad and torch.isfinite(local):
            local.backward()
        loss = self.dist.sum(local.item())
        where = f"{who}, optimizer step {self.state.global_step + 1}, items {sorted({s.index for s in batch})}"
        if not math.isfinite(loss):
            return _Backward(loss, math.nan, log_prob_mean, f"{where}: loss is {loss}")
        self.dist.sum_gradients(params)
        if agent is not None and getattr(self.args, "natural_gradient", False):
            # every rank preconditions the summed gradient with the same logits and sample counts
            observations = self.dist.gather([s.observation for s in batch])
            precondition(self.policies[agent], params, observations, self.args.natural_gradient_damping)
        grad_norm = _grad_norm(params, self.args.max_grad_norm).item()
        if not math.isfinite(grad_norm):
            return _Backward(loss, grad_norm, log_prob_mean, f"{where}: gradient norm is {grad_norm}")
        return _Backward(loss, grad_norm, log_prob_mean, None)


def _update_groups(policies: Mapping[str, Policy], agents: Sequence[str]) -> list[list[str]]:
    """Agents updated together: each team of adapters (policies sharing a ``team`` that scores
    with ``log_probs(requests)``) is one group, every other agent its own, in agent order."""
    groups: list[list[str]] = []
    by_team: dict[int, list[str]] = {}
    for agent in agents:
        team = getattr(policies[agent], "team", None)
        if team is None or not hasattr(team, "log_probs"):
            groups.append([agent])
        elif id(team) in by_team:
            by_team[id(team)].append(agent)
        else:
            by_team[id(team)] = [agent]
            groups.append(by_team[id(team)])
    return groups



def _score_batches(
    policies: Mapping[str, Policy], batches: Mapping[str, list[Sample]], reduction: str
) -> dict[str, torch.Tensor]:
    """Each agent's log-probs of its batch's answers; a team's agents in one forward."""
    requests = {
        agent: ([s.observation for s in batch for _ in s.completions], [c for s in batch for c in s.completions])
        for agent, batch in batches.items()
        if batch
    }
    scored: dict[str, torch.Tensor] = {}
    for group in _update_groups(policies, list(requests)):
        team = getattr(policies[group[0]], "team", None)
        if len(group) > 1 and team is not None:
            scored.update(ask_team(policies, group, requests, lambda asked: team.log_probs(asked, reduction=reduction)))
        else:
            for agent in group:
                scored[agent] = policies[agent].log_probs(*requests[agent], reduction=reduction)
    return scored



def _calibration(baseline: float | None) -> str:
    if baseline is None:
        return "the default: the first measured step"
    return f"{GAP_BASELINE_MULTIPLE:g} x this run's running gap {baseline:.3g}, at least a tenth of the default"

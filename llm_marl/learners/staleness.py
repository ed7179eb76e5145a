"""Sampler staleness: how many optimizer steps the weights that drew an answer lagged behind the
agent's trained weights at the moment it was drawn (``train/<agent>/sampler_staleness``).

Every answer a policy samples carries the version of the weights that drew it
(:attr:`~llm_marl.policies.base.SamplerRecord.weights`: the change epoch of the newest notice
those weights held, :mod:`~llm_marl.policies.weight_changes`; a sampling copy such as the bf16
shadow reports the weights it last copied, not the ones it copies from) and when it was drawn
(:attr:`~llm_marl.policies.base.SamplerRecord.epoch`). The trainer keeps, per agent, the epochs
at which its weights changed (:class:`WeightVersions`: every optimizer step, and the load and
broadcast that set them when ``train()`` starts), so at the update that uses an answer it counts
exactly the changes between the sampler's weights and the trained weights of that moment: no
threshold, no guess.

For on-policy learners anything but 0 stops the run with :class:`SamplerStalenessError` before
any agent is updated: the answers were drawn by older weights than the ones in place, the
off-by-one that asynchronous or cached samplers make. What the trainer's own schedule does is
not staleness: answers of a rollout trained after an earlier update of the same batch (a buffer
smaller than a batch's samples, several mini-batches per update) were drawn by the weights in
place then. Answers drawn before ``train()`` set the weights (a checkpoint's buffered samples)
and answers without a record are not counted.

A checkpoint keeps, per rank, which buffered answers were drawn by the weights it holds
(:func:`sampler_marks`); a resumed run re-owns them (:func:`restamp`), so their gap and
staleness are measured as in the run that never stopped.
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Any, Iterable, Sequence

from llm_marl.policies.base import SESSION
from llm_marl.policies.weight_changes import epoch, weights_epoch

__all__ = ["SamplerStalenessError", "StalenessChecks", "WeightVersions", "STALENESS_CAUSES"]

STALENESS_CAUSES = (
    "the sampler drew with weights older than the ones being trained: a sampling copy (bf16 shadow, packed "
    "weights, a team's adapters, an asynchronous sampler) refreshed one change late or not at all, or weights "
    "written without llm_marl.policies.weight_changes.weights_changed"
)


class SamplerStalenessError(RuntimeError):
    """An on-policy learner was about to train on answers drawn with older weights."""


class WeightVersions:
    """Per agent, the change epochs of its weights since ``train()`` set them: version v is the
    weights after the v-th change."""

    def __init__(self) -> None:
        self.epochs: dict[str, list[int]] = {}
        self.since: dict[str, int] = {}

    def restart(self, agent: str, parameters: Iterable[Any]) -> None:
        """``train()`` has set ``agent``'s weights (loaded, broadcast): version 0 from now on."""
        self.epochs[agent] = [weights_epoch(parameters)]
        self.since[agent] = epoch()

    def advance(self, agent: str, parameters: Iterable[Any]) -> None:
        """``agent``'s weights changed (an optimizer step): one version more."""
        self.epochs.setdefault(agent, [0]).append(weights_epoch(parameters))

    def version(self, agent: str, at: int | None = None) -> int:
        """``agent``'s weight version now, or at change epoch ``at``."""
        epochs = self.epochs.get(agent, [0])
        return len(epochs) - 1 if at is None else bisect.bisect_right(epochs, at) - 1

    def lag(self, agent: str, samples: Sequence[Any]) -> int | None:
        """The most versions the weights that drew any recorded answer of ``samples`` lagged behind
        ``agent``'s weights when it was drawn, or None when none of them carries a version drawn
        in this process (an answer drawn before :meth:`restart` counts as drawn by the weights in
        place then)."""
        found = None
        for sample in samples:
            for completion in getattr(sample, "completions", ()):
                record = getattr(completion, "sampler", None)
                if record is None or record.weights is None or record.sampler[0] != SESSION:
                    continue
                found = max(found or 0, self.version(agent, record.epoch) - self.version(agent, record.weights))
        return found


def sampler_marks(policies: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint keeps to re-own its buffered answers: this process, each agent's policy
    and the version its weights hold now (an answer drawn since was drawn by them)."""
    return {"session": SESSION, "owners": {a: id(p) for a, p in policies.items()},
            "fresh": {a: weights_epoch(p.parameters()) for a, p in policies.items()}}


def restamp(samples: Iterable[Any], marks: dict[str, Any], policies: dict[str, Any]) -> None:
    """Re-own the restored ``samples``' records drawn by the saved run's policies (``marks``,
    :func:`sampler_marks`): an answer drawn by the weights the checkpoint holds becomes one drawn
    by ``policies``' current weights (its gap is measured at its first update, as it would have
    been); an older one, one drawn by earlier weights (not measured, staleness 0)."""
    now = epoch()
    seen: set[int] = set()
    for sample in samples:
        if id(sample) in seen or sample.agent not in policies:
            continue
        seen.add(id(sample))
        owner = (marks["session"], marks["owners"].get(sample.agent))
        policy = policies[sample.agent]
        current = weights_epoch(policy.parameters())
        completions = []
        for completion in sample.completions:
            record = getattr(completion, "sampler", None)
            if record is not None and record.sampler == owner:
                fresh = record.epoch >= marks["fresh"][sample.agent]
                record = dataclasses.replace(record, sampler=(SESSION, id(policy)), epoch=now if fresh else 0,
                                             weights=current if fresh else 0)
                completion = dataclasses.replace(completion, sampler=record)
            completions.append(completion)
        sample.completions[:] = completions


class StalenessChecks:
    """The staleness half of a trainer's update (mixed into
    :class:`~llm_marl.learners.update.JointUpdate`). Needs ``agents``, ``policies``, ``trainable``,
    ``buffers``, ``dist``, ``state`` and ``_note``."""

    on_policy = True
    """Whether every answer must be drawn by the agent's weights in place: a nonzero
    ``train/<agent>/sampler_staleness`` stops the run."""

    @property
    def weight_versions(self) -> WeightVersions:
        """Each agent's weight versions in this process."""
        return self.__dict__.setdefault("_weight_versions", WeightVersions())

    def _weights_set(self) -> None:
        """At ``train()``'s start, after a load: every rank takes rank 0's weights and every
        agent's version is 0."""
        for agent in self.agent_ids:
            self.dist.broadcast_parameters(self.trainable[agent])
            self.weight_versions.restart(agent, self.policies[agent].parameters())

    def _reown_restored(self) -> None:
        """Before the first optimizer step after a resume: the checkpoint's buffered answers are
        re-owned (:func:`restamp`). Not earlier: a resumed run that trains nothing re-saves its
        checkpoint byte for byte (its marks and answers as loaded)."""
        marks = self.__dict__.pop("_restored_samplers", None)
        if marks is not None:
            plan = getattr(self, "_update_plan", None) or {}
            unfinished = getattr(self, "_unfinished", None)
            samples = [s for b in self.buffers.values() for s in b.samples]
            samples += [s for batches in plan.get("batches", {}).values() for batch in batches for s in batch]
            samples += list(getattr(unfinished, "samples", [])) + list(getattr(unfinished, "rest", []))
            restamp(samples, marks, self.policies)

    def sampler_marks(self) -> dict[str, Any]:
        """What a checkpoint keeps to re-own its buffered answers (:func:`sampler_marks`; the
        loaded ones while they are not re-owned yet)."""
        return self.__dict__.get("_restored_samplers") or sampler_marks(self.policies)

    def _check_sampler_staleness(self, step: dict[str, list[Any]]) -> None:
        """Log each agent's ``train/<agent>/sampler_staleness``: the most optimizer steps by which
        the weights that drew any of its answers in ``step`` lagged behind its trained weights when
        they were drawn (distributed: the most of any rank). Nonzero for an :attr:`on_policy`
        learner raises :class:`SamplerStalenessError` (no agent is updated)."""
        for agent in step:
            lag = self.weight_versions.lag(agent, step[agent])
            lag = self.dist.max(-1 if lag is None else lag)
            if lag < 0:
                continue
            self._note(f"train/{agent}/sampler_staleness", float(lag))
            if lag and self.on_policy:
                raise SamplerStalenessError(
                    f"agent {agent!r}, optimizer step {self.state.global_step + 1}: answers drawn with weights {lag} "
                    f"optimizer step(s) older than the agent's trained weights at the time (train/{agent}/sampler_staleness "
                    f"= {lag}; an on-policy learner needs 0); {STALENESS_CAUSES}"
                )

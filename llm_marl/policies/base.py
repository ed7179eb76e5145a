"""What acts: the policy protocol every learner drives.

A policy answers observations (prompt strings) with completions and scores completions it
(or another policy with the same vocabulary) produced. Tabular, scripted and language-model
policies all speak this protocol, so the learners have one code path for all of them.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Protocol, Sequence, runtime_checkable

import torch

from llm_marl.policies.weight_changes import epoch, last_change, weights_epoch


@dataclass(frozen=True)
class SamplerRecord:
    """What the sampler saw when it drew an answer, for the sampler–scorer gap (:class:`GapMeter`)."""

    sampler: tuple[str, int]
    """The process (:data:`SESSION`) and ``id`` of the policy whose weights drew it (a team's
    agent: its own policy); a record restored from a checkpoint in another process matches none."""
    epoch: int
    """The weights' change epoch at sampling time (:mod:`~llm_marl.policies.weight_changes`)."""
    log_probs: tuple[float, ...]
    """Per token, the sampler's log-probability of the drawn token under its temperature-scaled
    (score temperature), untruncated distribution: what the scorer computes for the same token."""
    weights: int | None = None
    """The version of the weights that drew it: the change epoch of the newest notice its sampling
    weights held (:func:`~llm_marl.policies.weight_changes.weights_epoch`; a sampling copy's: of
    the weights it last copied). The trainers count the optimizer steps between it and the
    weights they train (``train/<agent>/sampler_staleness``). None: not known."""


@dataclass(frozen=True)
class Completion:
    """One answer of a policy.

    Attributes:
        text: the answer as the environment sees it.
        token_ids: the generated token ids, end-of-sequence included and padding excluded
            (language-model policies); None otherwise.
        action: the index of the answer in a fixed menu (tabular policies); None otherwise.
        sampler: what the sampler saw (:class:`SamplerRecord`), where the policy records it;
            not part of equality.
    """

    text: str
    token_ids: tuple[int, ...] | None = None
    action: int | None = None
    sampler: SamplerRecord | None = field(default=None, compare=False, repr=False)


SESSION = uuid.uuid4().hex
"""This process's name in :class:`SamplerRecord` (ids and change epochs are per process)."""

DEFAULT_GAP_THRESHOLDS = {"float32": 1e-3, "float64": 1e-3, "bfloat16": 0.15, "float16": 0.05}
"""Default warning thresholds of the mean |Δ log-prob| per token, by the sampler's dtype. Measured
(``benchmarks/decode.py --mismatch`` on an AMD EPYC, 2026-12-01; git history of benchmarks/README.md): fp32 sampling differs from the fp32
scorer by kernel rounding, ~1e-5 per token on SmolLM2-135M (packed fp32 weights: summation
order, same size); bf16 sampling by ~4e-2 on SmolLM2-135M-Instruct (5e-3 on random weights).
Each threshold leaves a margin of about 4x (bf16) to 100x (fp32) over those; a stale sampling
copy or dropout in scoring is off by 0.1-1 nats per token."""

GAP_BASELINE_MULTIPLE = 4.0
"""The warning threshold of an agent's sampler gap is this multiple of the gap the run measured so
far (:func:`gap_baseline`), between a tenth of the dtype's default threshold and that default
(:func:`calibrated_threshold`). A healthy bf16 gap grows slowly as the policy sharpens (0.003 to
0.045 per token over 9 steps of the tiny model at lr 0.05, at most 2.1x from one step to the
next); a sampler one optimizer step behind jumps to 10-20x the healthy gap at once."""

GAP_PERSISTENCE = 3
"""The gap warns only when it is past its threshold on this many optimizer steps in a row: a
sampler that lags stays off, while a step's gap over a few dozen tokens can spike, alone or
twice (on SmolLM2-135M with a bf16 sampler, a healthy step of 48 tokens measured 0.149, 6.7x
the step before, from one token 3.3 nats off, and the steps after it 0.03; a tiny LoRA team at
lr 0.2 measured 0.022 and 0.020 on two steps between gaps of 0.003). A sampler one step
behind stays past it: on the main job (two SmolLM2-135M LoRA adapters, ``--sample_dtype
bfloat16``) 0.15-1.8 on every step from the second on, against 0.011-0.073 when healthy
(``benchmarks/sampler_lag.py``)."""


def gap_baseline(previous: float | None, gap: float) -> float:
    """The running baseline after a step that measured ``gap``: the mean of ``previous`` and
    ``gap`` (a moving average whose weight halves each step), or ``gap`` first."""
    return gap if previous is None else (previous + gap) / 2


def calibrated_threshold(default: float, baseline: float | None) -> float:
    """The gap warning threshold against running baseline ``baseline``:
    ``GAP_BASELINE_MULTIPLE × baseline``, at least ``default / 10`` (a step's gap over a few
    tokens is noisy), at most ``default``; ``baseline`` None (nothing measured yet): ``default``."""
    if baseline is None:
        return default
    return min(default, max(GAP_BASELINE_MULTIPLE * baseline, default / 10))


class GapMeter:
    """A policy's sampler–scorer gap: the sum of |log p_sampler − log p_scorer| over scored tokens
    whose answer this policy sampled with the same weights it is scored with (answers scored
    after a weight change of the policy measure its learning, not its sampler, and are left out),
    and their count. The trainers :meth:`drain` it at every optimizer step (pooling ranks)."""

    def __init__(self, dtype: str = "float32") -> None:
        self.dtype = dtype
        """The sampler's dtype name (picks the default threshold)."""
        self.total = 0.0
        self.tokens = 0

    def measure(self, owner: Any, parameters: Iterable[torch.Tensor], completions: Sequence["Completion"],
                values: torch.Tensor, mask: torch.Tensor) -> None:
        """Add the gap of those ``completions`` that ``owner`` sampled with its current weights;
        ``values``/``mask``: the scorer's per-token log-probs ``[rows, tokens]``."""
        rows = [i for i, c in enumerate(completions) if getattr(c, "sampler", None) is not None and c.sampler.sampler == (SESSION, id(owner))]
        if not rows:
            return
        changed = max((last_change(p) for p in parameters), default=0)
        rows = [i for i in rows if completions[i].sampler.epoch >= changed]
        if not rows:
            return
        scored = values.detach()[rows].float().cpu()
        kept = mask[rows].cpu()
        sampled = torch.zeros_like(scored)
        for out, i in enumerate(rows):
            recorded = completions[i].sampler.log_probs[: scored.shape[1]]
            sampled[out, : len(recorded)] = torch.tensor(recorded, dtype=torch.float32)
        lengths = torch.tensor([min(len(completions[i].sampler.log_probs), scored.shape[1]) for i in rows])
        kept = kept & (torch.arange(scored.shape[1]).unsqueeze(0) < lengths.unsqueeze(1))
        self.total += float((scored - sampled).abs()[kept].sum())
        self.tokens += int(kept.sum())

    def drain(self) -> tuple[float, int]:
        """``(sum of |Δ|, tokens)`` since the last call (then reset)."""
        found = (self.total, self.tokens)
        self.total, self.tokens = 0.0, 0
        return found

    def take(self) -> tuple[float, int] | None:
        """``(mean |Δ| per token, tokens)`` since the last call, or None when nothing was measured."""
        total, tokens = self.drain()
        return (total / tokens, tokens) if tokens else None

    @property
    def threshold(self) -> float:
        """The default warning threshold of this sampler's dtype (:data:`DEFAULT_GAP_THRESHOLDS`)."""
        return DEFAULT_GAP_THRESHOLDS.get(self.dtype, DEFAULT_GAP_THRESHOLDS["float32"])


def sampler_record(owner: Any, log_probs: Sequence[float], weights: int | None = None) -> SamplerRecord:
    """A :class:`SamplerRecord` of an answer ``owner`` draws now; ``weights``: the version of the
    weights it was drawn with (None: ``owner``'s own parameters', it sampled with them)."""
    if weights is None and hasattr(owner, "parameters"):
        weights = weights_epoch(owner.parameters())
    return SamplerRecord((SESSION, id(owner)), epoch(), tuple(float(v) if math.isfinite(v) else -1e30 for v in log_probs), weights)


@runtime_checkable
class Policy(Protocol):
    """The protocol the learners use.

    ``sample(observations, n)`` returns, for each observation, a list of ``n`` completions.
    ``log_probs(observations, completions)`` returns a differentiable 1-D tensor with one value per
    (observation, completion) pair: the log-probability of the whole completion, i.e. the sum
    over its tokens (``reduction="sum"``) or their mean (``reduction="mean"``).
    ``parameters()`` yields the trainable parameters (none for scripted policies).
    """

    def sample(self, observations: Sequence[str], num_samples: int) -> list[list[Completion]]: ...

    def log_probs(
        self,
        observations: Sequence[str],
        completions: Sequence[Completion],
        reduction: str = "sum",
    ) -> torch.Tensor: ...

    def parameters(self) -> Iterator[torch.nn.Parameter]: ...


def take_token_entropy(policy: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The ``(entropy, mask)`` per answer token of ``policy``'s last scoring call (its
    ``last_token_entropy``: the next-token distribution's entropy at each scored token, from the
    logits of that pass), removed from it; None for a policy that does not record it."""
    found = getattr(policy, "last_token_entropy", None)
    if found is not None:
        policy.last_token_entropy = None
    return found


def token_log_probs_of(
    policy: Policy, observations: Sequence[str], completions: Sequence[Completion]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probabilities ``(values, mask)``, both of shape ``[batch, max_tokens]``.

    Policies that score several tokens per answer implement ``token_log_probs`` themselves; for
    any other policy an answer is one token whose log-probability is ``log_probs``.
    """
    own = getattr(policy, "token_log_probs", None)
    if own is not None:
        return own(observations, completions)
    values = policy.log_probs(observations, completions).unsqueeze(1)
    return values, torch.ones_like(values, dtype=torch.bool)

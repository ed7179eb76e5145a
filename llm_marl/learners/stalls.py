"""Stalled groups: measuring them and replacing them (docs/algorithms.md §3.9).

A group whose K answers earned the same return gets all-zero advantages and gives no gradient.
:func:`zero_advantage_shares` measures the share of such groups per agent (logged as
``train/<agent>/zero_advantage_groups``); :func:`replace_stalled_groups` is DAPO's dynamic
sampling, which swaps them for groups with signal rolled out again. :func:`dynamic_sampling`
and :func:`note_stalls` are the trainer's side of both, and :func:`keep_entropy_differentiable`
readies language models for the entropy bonus (``entropy_coef``), whose coefficient
:func:`entropy_coefficient` anneals (``entropy_coef_final``).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

from llm_marl.advantages import zero_advantage
from llm_marl.learners.buffer import Sample
from llm_marl.learners.tree import collect_trees, derive_seed


def _carries_signal(sample: Sample) -> bool:
    return not zero_advantage(sample.advantages)


def _trained(sample: Sample) -> bool:
    return bool(sample.completions and sample.advantages)  # (a preference learner's placeholder has neither)


def zero_advantage_shares(samples: Sequence[Sample], agents: Sequence[str]) -> dict[str, tuple[float, int]]:
    """Agent -> (share of its groups whose advantages are all zero, number of its groups), for
    the agents with at least one group in ``samples``."""
    shares = {}
    for agent in agents:
        groups = [s for s in samples if s.agent == agent and _trained(s)]
        if groups:
            shares[agent] = (sum(not _carries_signal(s) for s in groups) / len(groups), len(groups))
    return shares


def replace_stalled_groups(
    samples: list[Sample], agents: Sequence[str], resample: Callable[[list[int], int], list[Sample]], budget: int
) -> tuple[list[Sample], int]:
    """DAPO's dynamic sampling: each group of ``samples`` whose advantages are all zero is replaced,
    in place, by a group with signal of the same agent, taken in order from ``resample(items,
    attempt)`` (the samples of those items rolled out again; ``attempt`` counts from 1), at most
    ``budget`` times. The batch keeps its number of groups per agent; what is still without
    signal when the budget is spent stays. Returns (samples, number of groups replaced)."""
    dead = [i for i, s in enumerate(samples) if _trained(s) and not _carries_signal(s)]
    replaced = 0
    for attempt in range(1, budget + 1):
        if not dead:
            break
        spare: dict[str, list[Sample]] = {agent: [] for agent in agents}
        for sample in resample(sorted({samples[i].index for i in dead}), attempt):
            if _trained(sample) and _carries_signal(sample):
                spare[sample.agent].append(sample)
        still = []
        for i in dead:
            if spare[samples[i].agent]:
                samples[i] = spare[samples[i].agent].pop(0)
                replaced += 1
            else:
                still.append(i)
        dead = still
    return samples, replaced


def dynamic_sampling(trainer: Any, samples: list[Sample]) -> list[Sample]:
    """Config ``dynamic_sampling``: ``trainer``'s batch with its stalled groups replaced
    (:func:`replace_stalled_groups`, at most ``dynamic_sampling_budget`` attempts), each attempt's
    trees seeded from the run's seed, epoch and batch, so a resumed run draws the same; notes
    ``train/dynamic_sampling_replaced``."""

    def resample(items: list[int], attempt: int) -> list[Sample]:
        seed = derive_seed(trainer._rollout_seed(), "dynamic sampling", trainer.state.batch_step, attempt)
        roots = collect_trees(trainer.env, trainer.policies, items, trainer.args, seed=seed)
        return trainer._samples([root for root in roots if root.error is None])

    samples, replaced = replace_stalled_groups(samples, trainer.agent_ids, resample, trainer.args.dynamic_sampling_budget)
    trainer._note("train/dynamic_sampling_replaced", float(replaced))
    return samples


def note_stalls(trainer: Any, samples: Sequence[Sample]) -> None:
    """Note ``train/<agent>/zero_advantage_groups`` of ``trainer``'s batch; warn once per agent
    when it is above half."""
    for agent, (share, groups) in zero_advantage_shares(samples, trainer.agent_ids).items():
        trainer._note(f"train/{agent}/zero_advantage_groups", share)
        if share > 0.5:
            trainer._warn_once(
                f"zero_advantage_groups/{agent}",
                f"agent {agent!r}, dataset batch {trainer.state.batch_step}: {share:.0%} of its {groups} groups have "
                "all-zero advantages (their K answers earned the same return) and give no gradient; learning may "
                "stall. dynamic_sampling, entropy_coef or tree_return_aggregation address it (docs/algorithms.md §3.9)",
            )


def entropy_coefficient(start: float, final: float | None, batch: int, batches: int) -> float:
    """The entropy bonus's coefficient at dataset batch ``batch`` (0-based, counted over the whole
    run) of a run of ``batches`` batches: ``start`` + (``final`` - ``start``) * batch / (batches - 1),
    linear from ``start`` at the first batch to ``final`` at the last and ``final`` after it (an
    epoch's closing update); ``start`` throughout when ``final`` is None (config
    ``entropy_coef_final``)."""
    if final is None:
        return start
    if batches <= 1:
        return final
    return start + (final - start) * min(max(batch / (batches - 1), 0.0), 1.0)


def keep_entropy_differentiable(policies: Iterable[Any]) -> None:
    """``entropy_coef`` > 0: language-model policies keep their scoring pass's token entropies
    differentiable (tabular policies always do)."""
    for policy in policies:
        if hasattr(policy, "token_log_probs"):
            policy.entropy_grad = True

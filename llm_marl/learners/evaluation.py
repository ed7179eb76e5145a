"""Evaluation: a trainer's eval items played once each, and the metrics of a batch of trees.

:func:`evaluate` is :meth:`MAGRPOTrainer.evaluate <llm_marl.learners.reinforce.trainer.MAGRPOTrainer.evaluate>`;
:func:`episode_metrics` gives the per-turn reward and return means that training and
evaluation log; :func:`hook_metrics` calls the anchor library's ``eval_logger`` and
``eval_aggregator`` hooks.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
from pettingzoo import ParallelEnv

from llm_marl.learners.tree import RolloutNode, derive_seed, grow_trees, iter_nodes
from llm_marl.runs import progress
from llm_marl.runs.rng import seeded_aside

__all__ = ["episode_metrics", "evaluate", "hook_metrics"]


def evaluate(trainer: Any, num_eval_samples: int | None = None, *, seed: int | None = None) -> dict[str, float]:
    """Play ``num_eval_samples`` (default ``eval_num_samples``) eval items once each (one
    answer per agent per turn, no early termination) and return — and log —
    ``eval/turn_k/reward_mean`` and ``eval/turn_k/expected_return``, plus the eval hooks'
    metrics when both are given.

    Evaluation plays the ``eval_env`` passed to the constructor, else the eval split of a
    :class:`~llm_marl.envs.DialogueEnv`'s task — never the training items unless the training
    env is passed as ``eval_env`` on purpose. Without either (no eval split, the task's
    ``dataset("eval")`` raised or is empty, or a foreign env), it warns once why and returns
    ``{}``, logging nothing — also when called by the periodic schedule. With
    ``reward_error_policy="skip"`` an eval item whose task raised is dropped, printed and
    counted in ``eval/skipped_items``.

    Randomness: evaluation samples from generators seeded by ``seed`` (default: one derived from
    ``args.seed``) and set aside afterwards (:func:`llm_marl.runs.rng.seeded_aside`). So two runs
    with one seed evaluate alike (also before ``train()``, which seeds training), every
    evaluation of a run draws the same random numbers (before/after differ by the weights
    alone), and evaluating leaves what training draws next unchanged (``eval_interval`` does not
    change training). Pass other seeds to average over more draws.
    """
    args = trainer.args
    if num_eval_samples is None:
        num_eval_samples = args.eval_num_samples
    if isinstance(num_eval_samples, bool) or not isinstance(num_eval_samples, int) or num_eval_samples < 0:
        raise ValueError(f"num_eval_samples must be an int >= 0, got {num_eval_samples!r}")
    env = trainer.eval_env
    if env is None:
        trainer._warn_once("no-eval", f"evaluation skipped: {trainer.no_eval_reason}")
        return {}
    available = num_items(env)
    if num_eval_samples > available:
        trainer._warn_once(
            "eval-size",
            f"eval_num_samples is {num_eval_samples} but the eval data has {available} "
            f"item{'s' if available != 1 else ''}; "
            f"evaluating on all {available}",
        )
    count = min(num_eval_samples, available)
    skip = args.reward_error_policy == "skip"
    roots: list[RolloutNode] = []
    shown = progress.bar(count, "evaluating", "item", show=bool(getattr(args, "progress_bar", True)))
    if seed is None:
        seed = derive_seed(args.seed, "eval")
    with _ItemsInFlight(shown, args.num_turns * _sampling_calls(trainer.policies)) as batch, seeded_aside(seed, trainer.policies):
        for start in range(0, count, args.eval_batch_size):
            indices = list(range(start, min(start + args.eval_batch_size, count)))
            batch.begin(len(indices))
            roots += grow_trees(env, trainer.policies, indices, num_samples=1, num_turns=args.num_turns, skip_errors=skip, seed=seed,
                                per_agent_rewards=bool(getattr(args, "per_agent_rewards", False)), learner=type(trainer).__name__)
            batch.end()
    shown.close()
    failed = [root for root in roots if root.error is not None]
    for root in failed:
        print(f"[llm_marl] skipped eval item {root.index}: {root.error}")
    roots = [root for root in roots if root.error is None]
    trainer.recorder.evaluation(trainer.state.batch_step, roots, trainer.logger)
    metrics = episode_metrics(roots, args.num_turns, prefix="eval")
    metrics.update(illegal_rates(roots, "eval"))
    if skip:
        metrics["eval/skipped_items"] = float(len(failed))
    if trainer.eval_logger is not None and trainer.eval_aggregator is not None and roots:
        metrics.update(hook_metrics(trainer, env, roots))
    trainer.logger.log(metrics, trainer.state.batch_step)
    return metrics


def _sampling_calls(policies: Mapping[str, Any]) -> int:
    """How many sampling calls one tree depth makes: one per team (a LoRA team samples its agents
    together), one per other agent."""
    callers = set()
    for agent, policy in policies.items():
        team = getattr(policy, "team", None)
        callers.add(id(team) if team is not None and hasattr(team, "sample") else agent)
    return max(1, len(callers))


class _ItemsInFlight:
    """Moves an eval bar through the items of the batch being decoded: the batch's items times
    the share of its sampling calls (``calls`` per batch) and of their tokens done so far."""

    def __init__(self, shown: Any, calls: int) -> None:
        self.shown, self.calls = shown, calls
        self.done = self.size = self.started = 0

    def __enter__(self) -> "_ItemsInFlight":
        self._listening = progress.listening(self._step) if not isinstance(self.shown, progress.Quiet) else None
        if self._listening is not None:
            self._listening.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._listening is not None:
            self._listening.__exit__(*exc)

    def begin(self, size: int) -> None:
        self.size, self.started = size, 0

    def end(self) -> None:
        self.done += self.size
        self.shown.update(self.done - self.shown.n)

    def _step(self, step: int, total: int) -> None:
        if step == 1:
            self.started += 1
        share = min(1.0, (self.started - 1 + step / max(1, total)) / self.calls)
        target = self.done + int(self.size * share)
        if target > self.shown.n:
            self.shown.update(target - self.shown.n)


def hook_metrics(trainer: Any, env: ParallelEnv, roots: list[RolloutNode]) -> dict[str, float]:
    """Call the eval hooks as the anchor library does: ``eval_logger`` once with every item
    (``agent_completions_turns[agent][item][turn]``), ``eval_aggregator`` on its list."""
    data = getattr(env, "data", None)
    chains = [list(root.nodes()) for root in roots]
    completions = [  # "" at a turn where the agent did not act (turn-based envs)
        [[node.completions[a][0].text if node.acts(a) else "" for node in chain] for chain in chains] for a in trainer.agent_ids
    ]
    items = [data[root.index] if data is not None else {"index": root.index} for root in roots]
    prompts = [item.get("prompt", "") if isinstance(item, Mapping) else "" for item in items]
    try:
        per_item = trainer.eval_logger(agent_completions_turns=completions, batch_items=items, prompts=prompts)
    except Exception as exc:
        raise RuntimeError(f"eval_logger raised {type(exc).__name__}: {exc} (evaluation at batch {trainer.state.batch_step})") from exc
    try:
        aggregated = trainer.eval_aggregator(per_item, num_turns=trainer.args.num_turns)
    except Exception as exc:
        raise RuntimeError(f"eval_aggregator raised {type(exc).__name__}: {exc} (evaluation at batch {trainer.state.batch_step})") from exc
    if not isinstance(aggregated, Mapping):
        raise TypeError(f"eval_aggregator must return a dict of metrics, got {type(aggregated).__name__}")
    return {f"eval/{name}": float(value) for name, value in aggregated.items()}


def episode_metrics(roots: Sequence[RolloutNode], num_turns: int, prefix: str) -> dict[str, float]:
    """``{prefix}/turn_k/reward_mean`` and ``.../expected_return`` over the nodes at each turn.

    ``reward_mean`` averages immediate rewards; ``expected_return`` averages returns (with
    discount 1 and one answer per agent, the sum of rewards from turn k on).
    """
    rewards: list[list[float]] = [[] for _ in range(num_turns)]
    returns: list[list[float]] = [[] for _ in range(num_turns)]
    for node in iter_nodes(roots):
        rewards[node.turn].extend(node.rewards)
        returns[node.turn].extend(node.returns)
    metrics = {}
    for t in range(num_turns):
        if rewards[t]:
            metrics[f"{prefix}/turn_{t + 1}/reward_mean"] = float(np.mean(rewards[t]))
            metrics[f"{prefix}/turn_{t + 1}/expected_return"] = float(np.mean(returns[t]))
    return metrics


def illegal_rates(roots: Sequence[RolloutNode], prefix: str) -> dict[str, float]:
    """``{prefix}/<agent>/illegal_rate``: per agent, the share of its joint actions at the nodes
    where it acted whose reward details name it under ``"illegal"`` (envs that report illegal
    answers, e.g. :class:`~llm_marl.envs.openspiel.OpenSpielEnv`); {} where no env reports them."""
    counts: dict[str, list[int]] = {}
    for node in iter_nodes(roots):
        for details in node.details:
            if "illegal" not in details:
                continue
            for agent in node.agents:
                seen = counts.setdefault(agent, [0, 0])
                seen[0] += agent in details["illegal"]
                seen[1] += 1
    return {f"{prefix}/{agent}/illegal_rate": bad / total for agent, (bad, total) in counts.items() if total}


def num_items(env: ParallelEnv) -> int:
    """The number of dataset items an env plays (its ``data``'s length, else its ``num_items``)."""
    data = getattr(env, "data", None)
    return len(data) if data is not None else getattr(env, "num_items", 1)

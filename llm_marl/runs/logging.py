"""Run logs: TensorBoard scalars, a metrics.jsonl mirror, and the metric names.

Metric names (``k`` is the 1-based turn, ``A`` an agent name):

==================================  ===========================================================
``train/turn_k/reward_mean``        mean immediate reward of the rollout nodes at turn k
``train/turn_k/expected_return``    mean return of those nodes' joint actions (docs/algorithms.md §3.6)
``train/A/loss``                    policy-gradient loss of agent A (mean over its optimizer steps)
``train/A/grad_norm``               gradient norm before clipping
``train/A/advantage_mean``          mean advantage of A's samples (0 when normalized)
``train/A/advantage_std``           std of A's advantages
``train/A/logprob_mean``            mean log pi(answer) of A's sampled answers
``train/A/kl_mean``                 mean reference KL of A's answers (reference KL enabled)
``train/A/sampler_gap``             mean abs(log p_sampler - log p_scorer) per token of A's answers
``train/env_steps_per_second``      joint actions stepped per second of rollout
``train/skipped_items``             items dropped by reward_error_policy="skip" (cumulative)
``eval/turn_k/reward_mean``         mean reward at turn k over the evaluated items
``eval/turn_k/expected_return``     mean sum of rewards from turn k on
``eval/skipped_items``              eval items dropped in that run (reward_error_policy="skip")
``eval/<custom>``                   what eval_aggregator returns, keys "turn_k/..."
==================================  ===========================================================

The x-axis of every curve is the dataset batch: training metrics of batch s (0-based, counted
over all epochs) are logged at step s, and an evaluation run before batch s is logged at step s
too (after training, at the number of batches trained). On resume from a checkpoint taken after
batch s, everything logged at steps > s by the interrupted run is purged.

Weights & Biases. With a ``wandb_config`` (drop-in constructor) or with ``report_to`` naming
wandb, every metric logged here also goes to a W&B run (:func:`open_wandb`), at the same step.
The run is built from ``wandb_config``: project, entity, name (or run_name), dir (default: the
run directory), tags, config_sections and config (merged over the trainer's config), and id /
resume when given; W&B's own environment variables (WANDB_MODE=offline, WANDB_PROJECT, ...)
apply as usual. W&B is an optional extra (``pip install 'llm_marl[wandb]'``); without it a
warning says so and the run is recorded in TensorBoard and metrics.jsonl only. W&B drops a step
lower than one it has seen (a resumed run logging into the same W&B run), with its own warning.
The W&B run stays open after ``train()`` (later ``evaluate()`` calls are logged too) until the
process ends or ``trainer.wandb.finish()``.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any, Mapping, Protocol, Sequence

WANDB_INSTALL_HINT = "pip install 'llm_marl[wandb]' (or pip install wandb)"


class MetricsMirror(Protocol):
    """Somewhere else every logged metric goes (e.g. a W&B run)."""

    def log(self, metrics: Mapping[str, float], step: int) -> None: ...


class RunLogger:
    """Writes scalars to TensorBoard (``output_dir/logs``) and ``output_dir/metrics.jsonl``.

    With ``output_dir=None`` nothing is written, but ``history`` still records every call.
    ``mirrors`` get every call too (closing the logger leaves them open: their owner ends them).
    """

    def __init__(
        self,
        output_dir: str | None,
        *,
        enabled: bool = True,
        purge_step: int | None = None,
        mirrors: Sequence[MetricsMirror] = (),
    ):
        self.output_dir = output_dir if enabled else None
        self.mirrors = list(mirrors) if enabled else []
        self.history: list[tuple[int, dict[str, float]]] = []
        self._writer = None
        if self.output_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            os.makedirs(self.output_dir, exist_ok=True)
            self._writer = SummaryWriter(log_dir=os.path.join(self.output_dir, "logs"), purge_step=purge_step)
            if purge_step is not None:
                _truncate_jsonl(os.path.join(self.output_dir, "metrics.jsonl"), purge_step)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        clean = {name: float(value) for name, value in metrics.items()}
        self.history.append((step, clean))
        for mirror in self.mirrors:
            mirror.log(clean, step)
        if self._writer is None:
            return
        for name, value in clean.items():
            self._writer.add_scalar(name, value, step)
        with open(os.path.join(self.output_dir, "metrics.jsonl"), "a") as f:
            f.write(json.dumps({"step": step, **clean}) + "\n")

    def log_text(self, tag: str, text: str, step: int) -> None:
        """A markdown text summary in TensorBoard's text tab (nothing without an output_dir)."""
        if self._writer is not None:
            self._writer.add_text(tag, text, step)

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None



def _truncate_jsonl(path: str, purge_step: int) -> None:
    """Drop the lines of ``path`` logged at or after ``purge_step`` (they belong to a run that is
    being resumed from an earlier checkpoint)."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        kept = [line for line in f if line.strip() and json.loads(line)["step"] < purge_step]
    with open(path, "w") as f:
        f.writelines(kept)


class WandbMirror:
    """A W&B run that receives the logged metrics (``run.log(metrics, step=step)``)."""

    def __init__(self, run: Any):
        self.run = run

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(dict(metrics), step=step)

    def finish(self) -> None:
        self.run.finish()


def wants_wandb(report_to: Any) -> bool:
    """Whether ``report_to`` (a name, a list of names, or None) names ``"wandb"``."""
    if report_to is None:
        return False
    names = [report_to] if isinstance(report_to, str) else list(report_to)
    return any(str(name).lower() == "wandb" for name in names)


def wandb_init_kwargs(wandb_config: Mapping[str, Any] | None, run_config: Mapping[str, Any], default_dir: str | None) -> dict[str, Any]:
    """``wandb.init`` keywords from a CoMLRL-style ``wandb_config`` (see the module docstring)."""
    wandb_config = dict(wandb_config or {})
    unknown = sorted(set(wandb_config) - {"project", "entity", "name", "run_name", "dir", "tags", "config", "config_sections", "id", "resume", "mode", "group", "notes", "job_type"})
    if unknown:
        warnings.warn(f"wandb_config keys {unknown} are not used", stacklevel=3)
    config = dict(run_config)
    sections = wandb_config.get("config_sections")
    if isinstance(sections, Mapping):
        config.update(sections)
        dataset = sections.get("dataset")
        if isinstance(dataset, Mapping):  # as CoMLRL 1.4.3: the dataset section's type and name, flat
            for key in ("type", "name"):
                if dataset.get(key) is not None:
                    config.setdefault(f"dataset_{key}", dataset[key])
    if isinstance(wandb_config.get("config"), Mapping):
        config.update(wandb_config["config"])
    kwargs: dict[str, Any] = {"config": config}
    for key in ("project", "entity", "id", "resume", "mode", "group", "notes", "job_type"):
        if wandb_config.get(key) is not None:
            kwargs[key] = wandb_config[key]
    name = wandb_config.get("name") or wandb_config.get("run_name")
    if name:
        kwargs["name"] = name
    directory = wandb_config.get("dir") or default_dir
    if directory:
        # absolute: a W&B service shared with a parent process resolves relative paths from its own cwd
        directory = os.path.abspath(directory)
        os.makedirs(directory, exist_ok=True)
        kwargs["dir"] = directory
    tags = wandb_config.get("tags")
    if tags is not None:
        if isinstance(tags, str) or not all(isinstance(tag, str) for tag in tags):
            raise ValueError(f"wandb_config['tags'] must be a list of strings, got {tags!r}")
        kwargs["tags"] = list(tags)
    return kwargs


def open_wandb(wandb_config: Mapping[str, Any] | None, run_config: Mapping[str, Any], default_dir: str | None) -> WandbMirror | None:
    """Start the W&B run (see :func:`wandb_init_kwargs`); None, with a warning that says how to
    install it, when the ``wandb`` package is missing."""
    try:
        import wandb
    except ImportError:
        warnings.warn(
            f"W&B logging was asked for (wandb_config / report_to) but the wandb package is not installed: "
            f"{WANDB_INSTALL_HINT}. This run is recorded in TensorBoard and metrics.jsonl only.",
            stacklevel=3,
        )
        return None
    return WandbMirror(wandb.init(**wandb_init_kwargs(wandb_config, run_config, default_dir)))


def flush_before(pending: dict[str, list[float]], start: Mapping[str, int], logger: Any, batch_step: int) -> dict[str, list[float]]:
    """A run stopped inside a batch: log (as :func:`flush_pending` forced) what was pending when
    the batch began (``start``: each metric's count then) and return the batch's own values, to
    be logged once the batch is finished, at its index, as in a run that never stopped."""
    earlier = {name: values[: start[name]] for name, values in pending.items() if start.get(name)}
    flush_pending(earlier, logger, batch_step, 1, force=True)
    return {name: values[start.get(name, 0) :] for name, values in pending.items() if values[start.get(name, 0) :]}


def flush_pending(pending: dict[str, list[float]], logger: Any, batch_step: int, every: int, force: bool = False) -> None:
    """Log the mean of each pending metric at the index of the batch just trained (``batch_step -
    1``) and empty ``pending``, every ``every`` batches (``logging_steps``) or when ``force``."""
    if not pending or not (force or batch_step % every == 0):
        return
    import numpy as np

    metrics = {name: float(np.mean(values)) for name, values in pending.items()}
    pending.clear()
    logger.log(metrics, batch_step - 1)

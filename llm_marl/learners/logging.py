"""Run logs: TensorBoard scalars, a metrics.jsonl mirror, and the metric names.

Metric names (``k`` is the 1-based turn, ``A`` an agent name):

==================================  ===========================================================
``train/turn_k/reward_mean``        mean immediate reward of the rollout nodes at turn k
``train/turn_k/expected_return``    mean return of those nodes' joint actions (SPEC.md §3.6)
``train/A/loss``                    policy-gradient loss of agent A (mean over its optimizer steps)
``train/A/grad_norm``               gradient norm before clipping
``train/A/advantage_mean``          mean advantage of A's samples (0 when normalized)
``train/A/advantage_std``           std of A's advantages
``train/A/logprob_mean``            mean log pi(answer) of A's sampled answers
``train/A/kl_mean``                 mean reference KL of A's answers (reference KL enabled)
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
"""

from __future__ import annotations

import json
import os
from typing import Mapping


class RunLogger:
    """Writes scalars to TensorBoard (``output_dir/logs``) and ``output_dir/metrics.jsonl``.

    With ``output_dir=None`` nothing is written, but ``history`` still records every call.
    """

    def __init__(self, output_dir: str | None, *, enabled: bool = True, purge_step: int | None = None):
        self.output_dir = output_dir if enabled else None
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
        if self._writer is None:
            return
        for name, value in clean.items():
            self._writer.add_scalar(name, value, step)
        with open(os.path.join(self.output_dir, "metrics.jsonl"), "a") as f:
            f.write(json.dumps({"step": step, **clean}) + "\n")

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

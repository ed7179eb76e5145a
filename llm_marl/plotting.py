"""PNG learning curves from a run's TensorBoard logs (``llm-marl plot RUN_DIR``)."""

from __future__ import annotations

import os
from collections import defaultdict


def read_scalars(run_dir: str) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the TensorBoard event files under ``run_dir`` as name -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logs = os.path.join(run_dir, "logs") if os.path.isdir(os.path.join(run_dir, "logs")) else run_dir
    accumulator = EventAccumulator(logs, size_guidance={"scalars": 0})
    accumulator.Reload()
    tags = accumulator.Tags().get("scalars", [])
    if not tags:
        raise FileNotFoundError(f"no TensorBoard scalars under {logs}")
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in tags}


def plot_run(run_dir: str, out_dir: str | None = None) -> list[str]:
    """Write one PNG per metric group (``train/turn_1``, ``train/<agent>``, ``eval/turn_1``...)
    into ``out_dir`` (default ``RUN_DIR/plots``); returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scalars = read_scalars(run_dir)
    out_dir = out_dir or os.path.join(run_dir, "plots")
    os.makedirs(out_dir, exist_ok=True)
    groups: dict[str, list[str]] = defaultdict(list)
    for tag in sorted(scalars):
        groups[tag.rsplit("/", 1)[0]].append(tag)
    written = []
    for group, tags in sorted(groups.items()):
        fig, axes = plt.subplots(len(tags), 1, figsize=(7, 2.4 * len(tags)), squeeze=False)
        for ax, tag in zip(axes[:, 0], tags):
            steps, values = zip(*scalars[tag])
            ax.plot(steps, values, marker="." if len(steps) < 50 else None)
            ax.set_title(tag, fontsize=9)
            ax.grid(alpha=0.3)
        axes[-1, 0].set_xlabel("dataset batches trained")
        fig.tight_layout()
        path = os.path.join(out_dir, group.replace("/", "_") + ".png")
        fig.savefig(path, dpi=80)
        plt.close(fig)
        written.append(path)
    return written

"""The main job (``llm-marl train`` with no arguments) against a reward-blind control.

For each seed, the main job's settings (``llm_marl.cli.MAIN_RUN``: two SmolLM2-135M-Instruct
LoRA adapters on NameMatch) are trained twice from the same start: once as is, once with each
group's advantages shuffled at random (``tests/controls.py``: same values and spread, assigned
to the wrong answers, so the update carries no information about the reward). The eval reward
before and after, the gain of each, and the minutes are printed and written as JSON::

    python benchmarks/main_job.py --seeds 0 1 2 --out main_job.json
    python benchmarks/main_job.py --seeds 0 --runs main --set num_train_epochs=1   # shorter

The model is fetched and converted on first use (``llm_marl.policies.models``). On a shared
machine, run it with ``nice`` and note the load average it printed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import print_machine  # noqa: E402
from overrides import parse_sets  # noqa: E402


def run(seed: int, control: bool, overrides: dict, threads: int) -> dict:
    import torch

    from controls import reward_blind
    from llm_marl.cli import MAIN_RUN, build_trainer

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory(prefix="main-job-") as out:
        options = {**MAIN_RUN, "seed": seed, "output_dir": out, "progress_bar": False, "rollout_log_steps": 0,
                   "num_threads": threads, **overrides}  # exactly --threads (llm_marl.cpu would trim spinning threads under load)
        started = time.time()
        trainer = build_trainer(options)
        before = trainer.evaluate()["eval/turn_1/reward_mean"]
        if control:
            with reward_blind("shuffle", seed):
                trainer.train()
        else:
            trainer.train()
        after = trainer.evaluate()["eval/turn_1/reward_mean"]
        minutes = (time.time() - started) / 60
    return {"seed": seed, "run": "control" if control else "main", "before": before, "after": after,
            "gain": after - before, "minutes": round(minutes, 2), "load": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", nargs="+", choices=["main", "control"], default=["main", "control"], help="which runs per seed")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a MAIN_RUN option (JSON value)")
    parser.add_argument("--out", help="write the rows as JSON here")
    ns = parser.parse_args()
    print_machine()
    overrides = parse_sets(ns.set)
    rows = []
    print(f"{'seed':>4}  {'run':<8} {'before':>7} {'after':>7} {'gain':>7} {'minutes':>8} {'load':>5}", flush=True)
    for seed in ns.seeds:
        for control in [kind == "control" for kind in ns.runs]:
            row = run(seed, control, overrides, ns.threads)
            rows.append(row)
            print(f"{row['seed']:>4}  {row['run']:<8} {row['before']:>7.3f} {row['after']:>7.3f} {row['gain']:>+7.3f} {row['minutes']:>8.1f} {row['load']:>5.1f}", flush=True)
            if ns.out:
                Path(ns.out).write_text(json.dumps({"overrides": overrides, "rows": rows}, indent=2))
    for kind in ("main", "control"):
        gains = [r["gain"] for r in rows if r["run"] == kind]
        if gains:
            print(f"mean gain {kind}: {sum(gains) / len(gains):+.3f} over seeds {ns.seeds}")


if __name__ == "__main__":
    main()

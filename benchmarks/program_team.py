"""examples/program_team.py's program learns on SmolLM2-135M, against a reward-blind control.

The program ``team`` (a writer drafts a short sentence about a topic, an editor shortens it; the
program scores the edited line from 0 to 1: half for the share of the topic's words it names,
half for brevity, full up to 8 words and none from 24) is trained as ``llm-marl train --program
examples/program_team.py:team --policy lm --model smollm2-135m --learner magrpo`` builds it: two
SmolLM2-135M-Instruct LoRA adapters on one frozen base, every call going through the program's
``openai`` client and the local endpoint. For each seed the real MAGRPO learner and its
reward-blind control (``tests/controls.py``: each group's advantages shuffled, same seed, same
start, same items) are trained for ``max_steps`` optimizer steps (two passes over the module's 8
training topics). The eval return (``eval/turn_2/expected_return``: one sampled episode on each
of the module's 16 held-out ``eval_items``, the same draws for every run) is measured before and
after::

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/program_team.py --seeds 0 1 2 --keep runs/ --out program_team.json
    llm-marl view runs/seed-0                                                   # a kept MAGRPO run's trees
    python benchmarks/program_team.py --summary program_team.json               # reprint a saved run

The model is fetched and converted on first use (``llm_marl.policies.models``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import print_machine  # noqa: E402
from overrides import parse_sets  # noqa: E402

PROGRAM = "examples/program_team.py:team"
RUN = {
    "policy": "lm",
    "model": "smollm2-135m",
    "learner": "magrpo",
    "num_turns": 2,
    "lora_r": 8,
    "lora_alpha": 16.0,
    "lora_target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "num_generations": 2,
    "num_train_epochs": 2,
    "items_per_step": 2,
    "rollout_buffer_size": 2,
    "max_steps": 24,
    "max_new_tokens": 24,
    "temperature": 0.7,
    "top_p": 0.9,
    "top_k": None,
    "agent_learning_rate": 2e-3,
    "early_termination_threshold": None,
    "advantage_normalization": False,
    "reference_kl_enabled": False,
    "eval_interval": 0,
    "eval_num_samples": 16,
    "eval_batch_size": 8,
    "logging_steps": 1,
    "max_grad_norm": 1.0,
    "progress_bar": False,
}
"""The run's settings (``llm-marl train`` options); ``--set FIELD=VALUE`` overrides one."""

KEY = "eval/turn_2/expected_return"


def run(seed: int, control: bool, overrides: dict, ns: argparse.Namespace) -> dict:
    import torch

    from controls import reward_blind
    from llm_marl.cli import build_trainer
    from llm_marl.programs.loading import program_env_id

    os.chdir(ROOT)
    torch.set_num_threads(ns.threads)
    torch.manual_seed(seed)
    keep = str(Path(ns.keep) / f"seed-{seed}") if ns.keep and not control else None
    with tempfile.TemporaryDirectory(prefix="program-team-") as scratch:
        options = {**RUN, "env": program_env_id(PROGRAM), "seed": seed, "output_dir": keep or scratch, "num_threads": ns.threads, **overrides}
        started = time.time()
        trainer = build_trainer(options)
        before = trainer.evaluate()
        if control:
            with reward_blind("shuffle", seed):
                trainer.train()
        else:
            trainer.train()
        after = trainer.evaluate()
        minutes = (time.time() - started) / 60
        trainer.env.close()
    return {"seed": seed, "run": "control" if control else "magrpo", "before": before[KEY], "after": after[KEY],
            "gain": after[KEY] - before[KEY], "steps": trainer.state.global_step, "minutes": round(minutes, 2),
            "load": round(os.getloadavg()[0], 2)}


def summarize(rows: list[dict]) -> None:
    print(f"{'seed':>4}  {'run':<8} {'before':>7} {'after':>7} {'gain':>7} {'minutes':>8} {'load':>5}")
    for row in rows:
        print(f"{row['seed']:>4}  {row['run']:<8} {row['before']:>7.3f} {row['after']:>7.3f} {row['gain']:>+7.3f} {row['minutes']:>8.1f} {row['load']:>5.1f}")
    for kind in ("magrpo", "control"):
        gains = [r["gain"] for r in rows if r["run"] == kind]
        if gains:
            print(f"mean gain {kind}: {sum(gains) / len(gains):+.3f} over {len(gains)} seeds")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", nargs="+", choices=["magrpo", "control"], default=["magrpo", "control"])
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a RUN option (JSON value)")
    parser.add_argument("--keep", metavar="RUN_DIR", help="keep each MAGRPO run's folder as RUN_DIR/seed-N (for llm-marl view)")
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--summary", metavar="JSON", help="print the table of a saved --out file, run nothing")
    ns = parser.parse_args()
    if ns.summary:
        summarize(json.loads(Path(ns.summary).read_text())["rows"])
        return
    print_machine()
    overrides = parse_sets(ns.set)
    print(f"program {PROGRAM}; settings: {json.dumps({**RUN, **overrides})}", flush=True)
    rows = []
    started = time.time()
    for seed in ns.seeds:
        for kind in ns.runs:
            rows.append(run(seed, kind == "control", overrides, ns))
            row = rows[-1]
            print(f"seed {seed} {row['run']:<8} {row['steps']} steps: {row['before']:.3f} -> {row['after']:.3f} ({row['gain']:+.3f}), "
                  f"{row['minutes']:.1f} min, load {row['load']}", flush=True)
            if ns.out:
                Path(ns.out).write_text(json.dumps({"program": PROGRAM, "settings": {**RUN, **overrides}, "rows": rows}, indent=2))
    summarize(rows)
    print(f"total {(time.time() - started) / 60:.1f} min; load average now {os.getloadavg()}")


if __name__ == "__main__":
    main()

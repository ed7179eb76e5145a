"""The main job's training steps quiet and beside a competing CPU-bound process, in one run.

Issue 32: with OpenMP's default (spinning) wait policy and a fixed thread count, the main job
(``llm-marl train``: two SmolLM2-135M-Instruct LoRA adapters on NameMatch) took 2.7x its quiet
time beside one busy process and 13-16x beside four, where a fair share of the CPU predicts 2-3x.
This script measures that ratio for the policies it is given:

- every measurement is a fresh worker process (OpenMP reads ``OMP_WAIT_POLICY`` when torch loads)
  that builds the main job's trainer (``llm_marl.cli.MAIN_RUN``, or ``--model tiny``: the tiny-model
  default run), then times ``trainer.train()`` for ``--steps`` optimizer steps — model loading,
  the evaluations and checkpoints are not timed;
- "loaded": ``--busy`` single-threaded ``while True: pass`` processes run while the worker trains
  (started before it loads, killed when it ends); "quiet": none;
- policies: ``adaptive`` is what ``llm-marl`` does now: the wait policy unset (libgomp spins
  300,000 rounds before it sleeps) and the count left to the trainer, which keeps it equal to the
  CPUs other work leaves free (``llm_marl.threads``; the row shows the counts it went through).
  The others fix the count at torch's default (or ``--threads``), as num_threads: ``default`` with
  the policy unset (spinning threads, as before issue 32), ``passive`` with
  ``OMP_WAIT_POLICY=PASSIVE`` (what the command set from issue 32 until the governor), ``active``
  with ``OMP_WAIT_POLICY=ACTIVE``, ``spin:N`` with the policy unset and ``GOMP_SPINCOUNT=N`` (a
  short spin, then sleep);
- interleaved: each round runs every (policy, condition) pair once, in an order that alternates
  between rounds, so a drifting machine biases no pair; the table shows medians over rounds.

It prints the machine (CPU model and flags: ``benchmarks/machine.py``) first, then the table:
per policy the quiet and loaded seconds of training, loaded/quiet, and quiet against the
``default`` policy's quiet time (a policy's cost on a quiet machine)::

    python benchmarks/under_load.py --steps 4 --rounds 3                 # the main job (model cached)
    python benchmarks/under_load.py --steps 4 --rounds 2 --busy 4        # beside four busy processes
    python benchmarks/under_load.py --model tiny --steps 1 --rounds 1    # a check that it runs

Run it on an otherwise quiet machine: other load adds to the "quiet" runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import describe, print_machine  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POLICIES = ("adaptive", "passive", "default", "active")


def policy_name(text: str) -> str:
    """A ``--policies`` entry: one of :data:`POLICIES` or ``spin:N``."""
    if text in POLICIES or (text.startswith("spin:") and text[5:].isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(POLICIES)} or spin:N (GOMP_SPINCOUNT=N)")


def worker(spec: dict) -> dict:
    """In a fresh process: build the main job's trainer and time ``train()`` (runs with --worker)."""
    import torch  # first: the wait policy in the environment is what OpenMP gets

    from llm_marl.cli import build_trainer, default_options

    options = default_options(spec["model"])
    if spec["model"] is not None:
        options["model"] = spec["model"]
    from llm_marl import threads as governor

    # adaptive: the trainer's own choice; the others: the same fixed count for every policy
    fixed = None if spec["policy"] == "adaptive" else spec["threads"] or torch.get_num_threads()
    with tempfile.TemporaryDirectory(prefix="under-load-") as out:
        options.update(
            output_dir=out, max_steps=spec["steps"], progress_bar=False, rollout_log_steps=0, eval_interval=0,
            save_final_checkpoint=False, save_steps=0, seed=spec["seed"], num_threads=fixed,
        )
        trainer = build_trainer(options)
        wall, cpu_time = time.perf_counter(), time.process_time()
        state = trainer.train()
        wall, cpu_time = time.perf_counter() - wall, time.process_time() - cpu_time
    ruler = governor.current()
    counts = [ruler.ceiling] + [n for _, n, _ in ruler.changes] if ruler else [torch.get_num_threads()]
    policy = os.environ.get("OMP_WAIT_POLICY", "<unset>") + (f", GOMP_SPINCOUNT={os.environ['GOMP_SPINCOUNT']}" if "GOMP_SPINCOUNT" in os.environ else "")
    return {"seconds": wall, "cpu_seconds": cpu_time, "steps": state.global_step, "threads": torch.get_num_threads(),
            "thread_counts": counts, "wait_policy": policy}


def measure(policy: str, busy: int, ns: argparse.Namespace) -> dict:
    """One worker run under ``policy`` beside ``busy`` spinning processes."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT")}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env["TOKENIZERS_PARALLELISM"] = "false"
    if policy.startswith("spin:"):
        env["GOMP_SPINCOUNT"] = policy.split(":", 1)[1]
    elif policy not in ("default", "adaptive"):
        env["OMP_WAIT_POLICY"] = policy.upper()
    spec = {"policy": policy, "model": ns.model, "steps": ns.steps, "threads": ns.threads, "seed": ns.seed}
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)],
                              env=env, capture_output=True, text=True, cwd=REPO)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    if done.returncode != 0:
        raise SystemExit(f"under_load.py: the {policy} worker failed:\n{done.stderr[-3000:]}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    return {"policy": policy, "busy": busy, **row}


def table(rows: list[dict], policies: list[str], busy: int) -> str:
    def median(policy: str, n: int) -> float | None:
        values = [r["seconds"] for r in rows if r["policy"] == policy and r["busy"] == n]
        return statistics.median(values) if values else None

    base = median("default", 0)
    def counts(policy: str, n: int) -> str:  # the thread counts of its last such run
        row = [r for r in rows if r["policy"] == policy and r["busy"] == n][-1]
        return "->".join(map(str, row["thread_counts"]))

    lines = [f"| policy | quiet s | beside {busy} busy s | loaded / quiet | quiet / default's quiet | threads quiet; loaded |",
             "|---|---|---|---|---|---|"]
    for policy in policies:
        quiet, loaded = median(policy, 0), median(policy, busy)
        versus = f"{quiet / base:.3f}" if base else "-"
        lines.append(f"| {policy} | {quiet:.2f} | {loaded:.2f} | {loaded / quiet:.2f}x | {versus} | "
                     f"{counts(policy, 0)}; {counts(policy, busy)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps timed per run (default 4)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the table shows medians (default 3)")
    parser.add_argument("--busy", type=int, default=1, help="competing busy processes in the loaded runs (default 1)")
    parser.add_argument("--policies", nargs="+", type=policy_name, default=["adaptive", "default", "passive"],
                        help="adaptive, passive, default, active, spin:N (default: adaptive default passive)")
    parser.add_argument("--model", default=None, help="None: the main job (SmolLM2-135M team); 'tiny': the tiny-model default run")
    parser.add_argument("--threads", type=int, default=None, help="num_threads for every run but adaptive's (default: torch's default count)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", help="write the machine and the rows as JSON here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.worker:
        print(json.dumps(worker(json.loads(ns.worker))))
        return 0
    info = print_machine()
    pairs = [(policy, busy) for policy in ns.policies for busy in (0, ns.busy)]
    rows = []
    for round_ in range(ns.rounds):
        for policy, busy in pairs if round_ % 2 == 0 else reversed(pairs):
            row = {"round": round_, **measure(policy, busy, ns), "load_after": round(os.getloadavg()[0], 2)}
            rows.append(row)
            print(f"round {round_} {policy:>11} {'quiet' if busy == 0 else f'beside {busy} busy':>14}: "
                  f"{row['seconds']:.2f} s training ({row['steps']} steps, threads {'->'.join(map(str, row['thread_counts']))}, "
                  f"OMP_WAIT_POLICY={row['wait_policy']}, CPU {row['cpu_seconds']:.2f} s, load {row['load_after']})", flush=True)
    print()
    print(describe(info))
    print(f"{'the main job' if ns.model is None else ns.model}, {ns.steps} steps, medians of {ns.rounds} rounds:")
    print(table(rows, ns.policies, ns.busy))
    if ns.out:
        with open(ns.out, "w") as f:
            json.dump({"machine": info, "steps": ns.steps, "model": ns.model, "busy": ns.busy, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

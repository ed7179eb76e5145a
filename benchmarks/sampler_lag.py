"""Is a sampler one optimizer step behind caught on a real model? The main job, healthy and lagged.

Runs ``llm-marl train --sample_dtype bfloat16`` (the main job: two SmolLM2-135M-Instruct LoRA
adapters, MAGRPO, its defaults) twice: healthy, and with the off-by-one refresh of
``tests/test_sampler_staleness.py`` planted (the bf16 copy always holds the weights from before
the latest optimizer step), with the on-policy stop turned off so the run goes on and the gap
check has its turn. For each run it prints, per agent, ``train/<agent>/sampler_gap`` and
``train/<agent>/sampler_staleness`` at every optimizer step, and the gap warning, if any (it
needs ``GAP_PERSISTENCE`` steps in a row past the calibrated threshold, ``policies/base.py``)::

    OMP_NUM_THREADS=1 python benchmarks/sampler_lag.py --out sampler_lag/          # both runs, about 2 x 4 min quiet
    python benchmarks/sampler_lag.py --runs lagged -- --max_steps 6                # arguments after -- go to llm-marl train

The model is fetched and converted on first use (``llm_marl.policies.models``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import print_machine  # noqa: E402

RUN = r"""
import sys
sys.path.insert(0, {tests!r})
if {lagged!r}:
    from test_sampler_staleness import one_step_behind
    from llm_marl.learners import MAGRPOTrainer

    class Patch:
        def setattr(self, owner, name, value):
            setattr(owner, name, value)

    one_step_behind(Patch())
    MAGRPOTrainer.on_policy = False  # logged, not refused: the gap is the check left
from llm_marl.cli import main
sys.exit(main(["train", "--sample_dtype", "bfloat16", "--progress_bar", "false", "--output_dir", {out!r}, "--overwrite", *{extra!r}]))
"""


def run(name: str, out: Path, extra: list[str]) -> dict:
    """One run of the main job; returns its per-agent gap and staleness series and gap warnings."""
    script = RUN.format(tests=str(ROOT / "tests"), lagged=name == "lagged", out=str(out / name), extra=extra)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"{name} run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    series = {key: [row[key] for row in rows if key in row]
              for key in sorted({k for row in rows for k in row if k.endswith(("/sampler_gap", "/sampler_staleness"))})}
    warned = [line for line in done.stderr.splitlines() if "log-probs differ from the scorer's" in line]
    return {"series": series, "warnings": warned}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", choices=["healthy", "lagged"], default=["healthy", "lagged"])
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temporary folder)")
    parser.add_argument("extra", nargs="*", help="arguments for llm-marl train (after --)")
    args = parser.parse_args()
    print_machine()
    with tempfile.TemporaryDirectory() as scratch:
        out = args.out or Path(scratch)
        out.mkdir(parents=True, exist_ok=True)
        for name in args.runs:
            found = run(name, out, args.extra)
            print(f"\n{name}:")
            for key, values in found["series"].items():
                print(f"  {key}: " + " ".join(f"{v:.3g}" for v in values))
            print("  gap warning: " + (found["warnings"][0][:240] if found["warnings"] else "none"))


if __name__ == "__main__":
    main()

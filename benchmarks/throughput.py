"""Rollout + training throughput of llm_marl's MAGRPO against CoMLRL 1.4.3 on the same workload.

Workload (identical on both sides): two agents, both a tiny local GPT-2 loaded from the same
folder with ``from_pretrained`` (2 layers, 128 wide, byte-level BPE with 1,000 tokens, a short
warm start on Python's own documentation; built once by ``llm_marl.policies.tiny`` and cached in
``--model-dir``); a fixed train set of short prompts (openings of pydoc paragraphs); one epoch;
K answers per agent per node, 1-3 turns, aligned or cross joint actions; exactly
``--new-tokens`` (24) new tokens per answer (``min_new_tokens = max_new_tokens``: the eos token is
suppressed, so both sides generate and train on the same number of tokens); temperature 1.0,
top-p 1.0, no top-k; no early termination; evaluation disabled; rollout_buffer_size and
train_batch_size at both libraries' default (2); learning rate 5e-6; the reward, formatter and
external transition are the cheap pure-Python functions of this file, called through each
library's own calling conventions.

Every (configuration, side) runs in a fresh subprocess, so peak memory (``ru_maxrss``) and warm
caches never leak between runs. The CoMLRL side runs in the interpreter given by
``--comlrl-python`` (a virtual environment with ``comlrl==1.4.3``): this file is its worker too
(``--worker comlrl``), and in that mode it imports nothing from llm_marl. Both workers call
``torch.set_num_threads(--threads)`` (default 1) and ``set_num_interop_threads(1)`` and export
``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` before torch is imported.

Measured per run: seconds per trained item (wall time of ``trainer.train()`` / items; model
loading and trainer construction excluded, one untimed 2-token ``generate`` per agent warms up
both sides) and the process CPU time (a load-robust cross-check: the workers are single-threaded);
generated tokens per second (tokens actually generated during ``train()`` / its time); where the
train time goes (model forwards inside generation, sampling, the rest of generation, training
forwards, backward, optimizer steps, the rest of the update, reward, transition, and everything
else: tree, env, buffers, advantages, logging); the peak RSS of the worker (``ru_maxrss``, checked
against ``VmHWM``; the driver imports only the standard library, so no high-water mark is
inherited from it) and the peak above the RSS of the imports both libraries share (torch,
transformers' GPT-2 and generation modules, datasets), which depends on each interpreter's
environment; and the 1-minute load average before and after.

Usage::

    python benchmarks/throughput.py --quick                       # ours only, smallest grid
    python benchmarks/throughput.py --comlrl-python /work/comlrl-venv/bin/python \\
        --configs targets --repeats 3 --out results.json
    python benchmarks/throughput.py --configs K4T2-aligned,K8T1-cross --items-per-step 1 8
    python benchmarks/throughput.py --configs smol --items 2 --items-per-step 1 --lora-r 8
    python benchmarks/throughput.py --configs smol --items 16 --items-per-step 8 --device cuda   # on a GPU

``--device cuda`` puts our side's agents on the GPU (``agent_devices``) and adds the peak GPU memory
(``torch.cuda.max_memory_allocated``, ``peak_gpu_mib``) to each result; ``benchmarks/gpu_check.py``
runs it.

Configuration names: ``K{k}T{t}-{aligned|cross}``, optionally prefixed ``large-`` for the larger
model (4 layers, 256 wide) or ``smol-`` for the SmolLM2-135M shape (Llama: 30 layers, hidden 576,
intermediate 1536, 9 heads / 3 KV heads, vocab 49,152, tied embeddings; random weights, seed 0,
fp32; the tiny model's tokenizer padded with added tokens to 49,152 ids, built once into
``--model-dir``/smol, 538 MB); groups ``smol`` (smol-K4T1-aligned, the drop-in constructor's
default setting of issue 24) and ``smol-targets`` (smol-K4T1-aligned, smol-K4T2-aligned,
smol-K4T2-cross); ``quick``, ``targets``, ``grid`` (the default: every K in
{2,4,8} x T in {1,2,3}, aligned and cross, except the cross trees over 30 nodes, plus
``large-K4T2-aligned``) and ``all`` (grid + K8T2-cross, K4T3-cross and K8T3-cross: 65, 273 and
4,161 nodes per item).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

RESULT_MARKER = "THROUGHPUT_RESULT "
SMALL = {"vocab_size": 1000, "n_layer": 2, "n_embd": 128, "n_head": 2}
LARGE = {"vocab_size": 1000, "n_layer": 4, "n_embd": 256, "n_head": 4}
SMOLLM2_135M = {
    "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "max_position_embeddings": 8192,
    "rope_theta": 100000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
}
"""SmolLM2-135M(-Instruct)'s LlamaConfig fields (its config.json), for random-weight rows."""

# --------------------------------------------------------------------------- the shared workload
# Plain Python only: these run unchanged in both interpreters.


def bench_formatter(item):
    """Agent prompt = the item's prompt (the transition's text at later turns, via both libraries'
    prompt-replacement convention)."""
    return item["prompt"]


def bench_reward(completions_0, completions_1):
    """Cheap cooperative reward: word overlap of the two answers plus a length term (one float)."""
    a, b = completions_0[0], completions_1[0]
    words_a, words_b = set(a.split()), set(b.split())
    overlap = len(words_a & words_b) / (1 + len(words_a | words_b))
    return [overlap + min(len(a), len(b)) / 200.0]


def bench_reward_any(*completions):
    """The same reward for any number of agents (memory runs with 1 or 4 agents): mean word
    overlap with the first agent plus the length term."""
    first = completions[0][0]
    if len(completions) == 1:
        return [min(len(first), 200) / 200.0]
    words = [set(c[0].split()) for c in completions]
    overlap = sum(len(words[0] & w) / (1 + len(words[0] | w)) for w in words[1:]) / (len(words) - 1)
    return [overlap + min(len(c[0]) for c in completions) / 200.0]


def bench_transition(prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent):
    """Next prompt of each agent: the original prompt's opening plus the start of the partner's
    last answer (bounded length, so prompts do not grow with the turn)."""
    opening = " ".join(prompt.split()[:8])
    texts = []
    for i in range(num_agents):
        partner = " ".join(agent_completions[(i + 1) % num_agents].split()[:6])
        texts.append(f"{opening} {partner}".strip())
    return texts


def tree_nodes(k: int, turns: int, mode: str, agents: int = 2) -> int:
    """Tree nodes per item (each node: one K-answer group per agent)."""
    branching = k if mode == "aligned" else k**agents
    return sum(branching**t for t in range(turns))


# --------------------------------------------------------------------------- configurations

GRID_K = (2, 4, 8)
GRID_T = (1, 2, 3)
MAX_GRID_NODES = 30  # cross trees above this (K8T2: 65 nodes, K4T3: 273, K8T3: 4,161) only in "all"


def config_name(k: int, turns: int, mode: str, large: bool = False) -> str:
    return f"{'large-' if large else ''}K{k}T{turns}-{mode}"


MODEL_PREFIXES = {"large-": "large", "smol-": "smol"}


def parse_config(name: str) -> dict:
    prefix = next((p for p in MODEL_PREFIXES if name.startswith(p)), "")
    model = MODEL_PREFIXES.get(prefix, "small")
    large = model == "large"
    body = name[len(prefix) :]
    try:
        shape, mode = body.split("-")
        k_text, t_text = shape[1:].split("T")
        k, turns = int(k_text), int(t_text)
        if shape[0] != "K" or mode not in ("aligned", "cross") or k < 2 or turns < 1:
            raise ValueError
    except ValueError:
        raise SystemExit(
            f"bad configuration name {name!r}: expected e.g. K4T2-aligned, K8T1-cross, large-K4T2-aligned, smol-K4T1-aligned"
        )
    return {"name": name, "k": k, "turns": turns, "mode": mode, "large": large, "model": model, "nodes": tree_nodes(k, turns, mode)}


def expand_configs(text: str) -> list[dict]:
    grid = [
        config_name(k, t, m)
        for m in ("aligned", "cross")
        for k in GRID_K
        for t in GRID_T
        if m == "aligned" or tree_nodes(k, t, m) <= MAX_GRID_NODES
    ] + ["large-K4T2-aligned"]
    groups = {
        "quick": ["K2T1-aligned"],
        "targets": ["K4T2-aligned", "K4T2-cross", "large-K4T2-aligned"],
        "grid": grid,
        "all": grid + ["K8T2-cross", "K4T3-cross", "K8T3-cross"],
        "smol": ["smol-K4T1-aligned"],
        "smol-targets": ["smol-K4T1-aligned", "smol-K4T2-aligned", "smol-K4T2-cross"],
    }
    names: list[str] = []
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        for name in groups.get(part, [part]):
            if name not in names:
                names.append(name)
    return [parse_config(n) for n in names]


# --------------------------------------------------------------------------- worker (subprocess)


def _rss_mib() -> float:
    try:
        with open("/proc/self/statm") as handle:
            pages = int(handle.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        return float("nan")


def _peak_rss_mib() -> float:
    """``ru_maxrss`` of this process (KiB on Linux). Linux carries the high-water mark over
    fork and exec, so this is clean only because the driver that launches workers stays small
    (it imports nothing but the standard library; models are built in a subprocess too)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _vm_hwm_mib() -> float:
    """The kernel's RSS high-water mark of this process image (``VmHWM``; reset by exec)."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError):
        pass
    return float("nan")


class _Clock:
    """Accumulates wall time of wrapped callables by label. ``label`` may be a function of the
    labels currently open (e.g. a model forward counts as "gen_forward" inside "generate")."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.open: list[str] = []
        self.tokens = 0

    def wrap(self, label, fn, count_tokens=None):
        import functools

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            name = label(self.open) if callable(label) else label
            self.open.append(name)
            start = time.perf_counter()
            try:
                out = fn(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
                self.open.pop()
            if count_tokens is not None:
                self.tokens += count_tokens(out)
            return out

        return timed

    def instrument(self, models, optimizers):
        """Time model forwards (inside / outside generation), sampling, backward and optimizer
        steps. Module-level reward and transition functions are wrapped by the caller."""
        import torch

        def forward_label(open_labels):
            return "gen_forward" if "generate" in open_labels else "train_forward"

        for model in models:
            model.forward = self.wrap(forward_label, model.forward)
        for optimizer in optimizers:
            optimizer.step = self.wrap("optimizer", optimizer.step)
        torch.multinomial = self.wrap("sampling", torch.multinomial)
        torch.Tensor.backward = self.wrap("backward", torch.Tensor.backward)

    def breakdown(self, total: float) -> dict[str, float]:
        """Exclusive seconds per category; they add up to ``total``."""
        s = self.seconds.get
        generate, update = s("generate", 0.0), s("update", 0.0)
        parts = {
            "gen_forward": s("gen_forward", 0.0),
            "gen_sampling": s("sampling", 0.0),
            "gen_other": generate - s("gen_forward", 0.0) - s("sampling", 0.0),
            "train_forward": s("train_forward", 0.0),
            "backward": s("backward", 0.0),
            "optimizer": s("optimizer", 0.0),
            "update_other": update - s("train_forward", 0.0) - s("backward", 0.0) - s("optimizer", 0.0),
            "reward": s("reward", 0.0),
            "transition": s("transition", 0.0),
        }
        parts["rest"] = total - generate - update - parts["reward"] - parts["transition"]
        return {name: max(0.0, value) for name, value in parts.items()}


def _train_ours(spec: dict, clock: _Clock):
    from datasets import Dataset
    from transformers import AutoTokenizer

    from llm_marl import MAGRPOConfig, MAGRPOTrainer

    agents = int(spec.get("agents", 2))
    args = MAGRPOConfig(
        num_agents=agents,
        num_turns=spec["turns"],
        num_train_epochs=1,
        num_generations=spec["k"],
        max_new_tokens=spec["new_tokens"],
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        joint_mode=spec["mode"],
        early_termination_threshold=None,
        eval_interval=0,
        items_per_step=spec["items_per_step"],
        progress_bar=False,
        output_dir=None,
        seed=spec["seed"],
        lora_r=spec.get("lora_r"),
        lora_alpha=2.0 * spec["lora_r"] if spec.get("lora_r") else 16.0,
        agent_devices=spec.get("device"),
    )
    reward, transition = _timed_task_functions(clock, agents)
    trainer = MAGRPOTrainer(
        agent_model=spec["model_dir"],
        tokenizer=AutoTokenizer.from_pretrained(spec["model_dir"]),
        reward_func=reward,
        formatters=bench_formatter,
        external_transition=transition if spec["turns"] > 1 else None,
        train_dataset=Dataset.from_list([{"prompt": p} for p in spec["prompts"]]),
        args=args,
    )
    count = lambda out: sum(len(c.token_ids or ()) for row in out for c in row)  # noqa: E731
    teams = {}
    for policy in trainer.policies.values():
        if spec["force_length"]:
            policy.min_new_tokens = spec["new_tokens"]
        policy.max_batch_size = spec.get("max_batch_size")
        policy.sample_dtype = spec.get("sample_dtype")  # the opt-in bf16 sampler (scores stay exact)
        policy.model.generate(**_warmup_inputs(policy.tokenizer, policy.model.device), max_new_tokens=2, do_sample=True)
        policy.sample = clock.wrap("generate", policy.sample, count)
        policy._draw = clock.wrap("sampling", policy._draw)  # our sampler; CoMLRL's is torch.multinomial
        team = getattr(policy, "team", None)
        if team is not None:
            teams[id(team)] = team
    for team in teams.values():  # a team of adapters is sampled in one call for all its agents
        team.sample = clock.wrap("generate", team.sample, lambda out: sum(count(rows) for rows in out.values()))
    trainer._update = clock.wrap("update", trainer._update)
    models = list({id(p.model): p.model for p in trainer.policies.values()}.values())
    clock.instrument(models, list(trainer.optimizers.values()))
    return trainer, lambda: trainer.train()


def _train_comlrl(spec: dict, clock: _Clock):
    import random

    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer

    from comlrl.trainers.reinforce.magrpo import MAGRPOConfig, MAGRPOTrainer

    args = MAGRPOConfig(
        num_agents=2,
        num_turns=spec["turns"],
        num_train_epochs=1,
        num_generations=spec["k"],
        max_new_tokens=spec["new_tokens"],
        temperature=1.0,
        top_p=1.0,
        top_k=0,  # CoMLRL passes top_k only when not None; 0 disables it (else the model's default applies)
        joint_mode=spec["mode"],
        early_termination_threshold=None,
        eval_interval=0,
    )
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    reward, transition = _timed_task_functions(clock)
    trainer = MAGRPOTrainer(
        agent_model=spec["model_dir"],
        tokenizer=tokenizer,
        reward_func=reward,
        formatters=bench_formatter,
        external_transition=transition if spec["turns"] > 1 else None,
        train_dataset=Dataset.from_list([{"prompt": p} for p in spec["prompts"]]),
        args=args,
    )
    trainer.verbose = False
    for model in trainer.agents:
        model.generate(**_warmup_inputs(tokenizer), max_new_tokens=2, do_sample=True)
    trainer._generate_completions = clock.wrap(
        "generate", trainer._generate_completions, lambda out: sum(int(n) for n in out["response_lens"])
    )
    trainer._drain_ready_buffers = clock.wrap("update", trainer._drain_ready_buffers)
    clock.instrument(trainer.agents, trainer.optimizers)
    random.seed(spec["seed"])
    torch.manual_seed(spec["seed"])
    # CoMLRL's train() passes extra keywords on to every generate call.
    extra = {"min_new_tokens": spec["new_tokens"]} if spec["force_length"] else {}
    return trainer, lambda: trainer.train(**extra)


def _timed_task_functions(clock: _Clock, agents: int = 2):
    """The reward and transition, timed; functools.wraps keeps their signatures, which both
    libraries inspect. Agent counts other than 2 (memory runs, ours only) use bench_reward_any."""
    reward = bench_reward if agents == 2 else bench_reward_any
    return clock.wrap("reward", reward), clock.wrap("transition", bench_transition)


def _warmup_inputs(tokenizer, device="cpu"):
    encoded = tokenizer(["Warm up the model."], return_tensors="pt")
    return {"input_ids": encoded["input_ids"].to(device), "attention_mask": encoded["attention_mask"].to(device)}


def run_worker(side: str, spec: dict) -> dict:
    threads = int(spec["threads"])
    import torch

    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    torch.manual_seed(spec["seed"])
    import warnings

    warnings.filterwarnings("ignore")
    # The imports both libraries share; their footprint depends on the interpreter's environment
    # (e.g. transformers pulls in scipy/PIL where they are installed), so it is reported apart.
    import datasets  # noqa: F401
    import transformers.generation.utils  # noqa: F401
    import transformers.models.gpt2.modeling_gpt2  # noqa: F401

    rss_shared = _rss_mib()
    cuda = str(spec.get("device") or "cpu").startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    clock = _Clock()
    setup_start = time.perf_counter()
    trainer, train = (_train_comlrl if side == "comlrl" else _train_ours)(spec, clock)
    setup_seconds = time.perf_counter() - setup_start
    rss_before = _rss_mib()
    load_before = os.getloadavg()[0]
    profiler = None
    if spec.get("profile"):
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    cpu_start = time.process_time()
    start = time.perf_counter()
    train()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu_start
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(spec["profile"])
    items = len(spec["prompts"])
    generate = clock.seconds.get("generate", 0.0)
    update = clock.seconds.get("update", 0.0)
    agents = int(spec.get("agents", 2))
    expected_tokens = items * tree_nodes(spec["k"], spec["turns"], spec["mode"], agents) * spec["k"] * agents * spec["new_tokens"]
    return {
        "side": side,
        "config": spec["name"],
        "items_per_step": spec["items_per_step"] if side != "comlrl" else 1,
        "agents": int(spec.get("agents", 2)),
        "lora_r": spec.get("lora_r"),
        "items": items,
        "threads": threads,
        "train_seconds": seconds,
        "train_cpu_seconds": cpu_seconds,
        "seconds_per_item": seconds / items,
        "items_per_second": items / seconds,
        "generated_tokens": clock.tokens,
        "expected_tokens": expected_tokens,
        "tokens_per_second": clock.tokens / seconds,
        "generate_seconds": generate,
        "update_seconds": update,
        "other_seconds": max(0.0, seconds - generate - update),
        "breakdown_seconds": clock.breakdown(seconds),
        "setup_seconds": setup_seconds,
        "rss_before_train_mib": rss_before,
        "peak_rss_mib": _peak_rss_mib(),
        "vm_hwm_mib": _vm_hwm_mib(),
        "rss_shared_imports_mib": rss_shared,
        "peak_over_shared_imports_mib": _peak_rss_mib() - rss_shared,
        "load1_before": load_before,
        "load1_after": os.getloadavg()[0],
        "versions": _versions(side),
        "sampled_with_copy": _sampling_copies(trainer) if side != "comlrl" else [],
        "sampler_gap": _sampler_gap(trainer) if side != "comlrl" else None,
        "device": spec.get("device") or "cpu",
        "peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
    }


def _sampler_gap(trainer) -> float | None:
    """The largest ``train/<agent>/sampler_gap`` the run logged (issue 33: a bf16 copy that
    missed the updates shows here as a gap that grows with the steps)."""
    history = getattr(getattr(trainer, "logger", None), "history", [])
    found = [v for _, metrics in history for k, v in metrics.items() if k.endswith("/sampler_gap")]
    pending = getattr(trainer, "_pending", {})
    found += [v for k, values in pending.items() if k.endswith("/sampler_gap") for v in values]
    return max(found) if found else None


def _sampling_copies(trainer) -> list[str]:
    """The dtypes of the low-precision sampling copies the run built (``sample_dtype``): a check
    that a bf16-sampling side really sampled from a copy."""
    found = set()
    for policy in trainer.policies.values():
        for owner in (policy, getattr(policy, "team", None)):
            shadow = getattr(owner, "_shadow", None)
            if shadow is not None:
                found.add(str(shadow.dtype))
    return sorted(found)


def _versions(side: str) -> dict:
    import torch
    import transformers

    out = {"python": sys.version.split()[0], "executable": sys.executable, "torch": torch.__version__,
           "transformers": transformers.__version__}
    if side == "comlrl":
        from importlib.metadata import version

        out["comlrl"] = version("comlrl")
    return out


# --------------------------------------------------------------------------- driver (parent)


def run_build(spec: dict) -> dict:
    """Subprocess: build (or reuse) the tiny models and pick the prompts."""
    return {
        "models": build_models(spec["model_dir"], spec["pretrain_steps"], spec["need_large"], spec.get("need_smol", False)),
        "prompts": bench_prompts(spec["items"]),
    }


def bench_prompts(count: int) -> list[str]:
    """``count`` short prompts: the first 8 words of evenly spaced pydoc paragraphs."""
    from llm_marl.tasks.writing.corpus import pydoc_paragraphs

    paragraphs = pydoc_paragraphs()
    step = max(1, len(paragraphs) // count)
    return [" ".join(paragraphs[i * step].split()[:8]) for i in range(count)]


def build_models(model_dir: str, pretrain_steps: int, need_large: bool, need_smol: bool = False) -> dict[str, str]:
    from llm_marl.policies.tiny import build_tiny_model

    paths = {"small": str(build_tiny_model(os.path.join(model_dir, "small"), pretrain_steps=pretrain_steps, **SMALL))}
    if need_large:
        paths["large"] = str(build_tiny_model(os.path.join(model_dir, "large"), pretrain_steps=pretrain_steps, **LARGE))
    if need_smol:
        paths["smol"] = build_smol_model(os.path.join(model_dir, "smol"), paths["small"])
    return paths


def padded_tokenizer(folder: str, vocab_size: int):
    """The tokenizer in ``folder`` with added tokens ``<x{i}>`` up to ``vocab_size`` ids, so that
    every id a random-weight model of that vocabulary samples decodes (and encodes back)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.add_tokens([f"<x{i}>" for i in range(len(tokenizer), vocab_size)])
    return tokenizer


def smol_model(tokenizer, dtype: str = "float32", seed: int = 0):
    """A LlamaForCausalLM of the SmolLM2-135M shape with random weights (``seed``), its special
    token ids those of ``tokenizer``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    ids = {name: getattr(tokenizer, name) for name in ("bos_token_id", "eos_token_id", "pad_token_id")}
    ids["pad_token_id"] = ids["pad_token_id"] if ids["pad_token_id"] is not None else ids["eos_token_id"]
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M, **ids))
    return model.to(getattr(torch, dtype)).eval()


def build_smol_model(folder: str, tokenizer_folder: str) -> str:
    """``folder``: the SmolLM2-135M shape with random weights (seed 0), saved with the padded
    tokenizer; built once (into a temporary sibling renamed into place)."""
    import shutil

    marker = os.path.join(folder, "llm_marl_bench.json")
    if os.path.exists(marker):
        return folder
    tokenizer = padded_tokenizer(tokenizer_folder, SMOLLM2_135M["vocab_size"])
    model = smol_model(tokenizer)
    tmp = f"{folder}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    with open(os.path.join(tmp, "llm_marl_bench.json"), "w") as handle:
        json.dump({"shape": "SmolLM2-135M", "weights": "random, seed 0", "config": SMOLLM2_135M}, handle)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return folder


def launch(python: str, side: str, spec: dict, timeout: float) -> dict:
    """Run one worker (a side and configuration, or the model build) in a fresh subprocess;
    returns its result dict or an error."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(spec, handle)
        spec_path = handle.name
    env = dict(os.environ)
    threads = str(spec.get("threads", 1))
    env.update({"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "TOKENIZERS_PARALLELISM": "false",
                "WANDB_MODE": "disabled", "WANDB_SILENT": "true", "TRANSFORMERS_VERBOSITY": "error",
                "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    if side == "comlrl":
        env.pop("PYTHONPATH", None)  # the CoMLRL interpreter must not see llm_marl
    else:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    command = [python, os.path.abspath(__file__), "--worker", side, "--spec", spec_path]
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"side": side, "config": spec.get("name"), "error": f"timed out after {timeout:.0f} s"}
    finally:
        os.unlink(spec_path)
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_MARKER):
            return json.loads(line[len(RESULT_MARKER) :])
    tail = (done.stderr or done.stdout).strip().splitlines()[-15:]
    return {"side": side, "config": spec.get("name"), "error": f"exit {done.returncode}: " + "\n".join(tail)}


def best(results: list[dict], config: str, side: str, ips: int) -> dict | None:
    """The fastest successful run of (config, side, items_per_step): noise only ever adds time."""
    runs = [r for r in results if r["config"] == config and r["side"] == side and r.get("items_per_step") == ips and "error" not in r]
    return min(runs, key=lambda r: r["seconds_per_item"]) if runs else None


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def table(results: list[dict], configs: list[dict], ips_list: list[int], with_comlrl: bool, with_lora: bool = False,
          with_bf16s: bool = False) -> str:
    """Two markdown tables: time per item and speed-ups; tokens/s and peak memory."""
    sides = [("ours", ips, f"ours ips={ips}") for ips in ips_list]
    if with_lora:
        sides += [("ours-lora", ips, f"ours LoRA ips={ips}") for ips in ips_list]
    if with_bf16s:
        sides += [("ours-bf16s", ips, side_label("ours-bf16s", ips)) for ips in ips_list]
        if with_lora:
            sides += [("ours-lora-bf16s", ips, side_label("ours-lora-bf16s", ips)) for ips in ips_list]
    if with_comlrl:
        sides.append(("comlrl", 1, "CoMLRL"))
    head = ["config", "nodes/item", "tokens/item"] + [f"{label} s/item" for _, _, label in sides]
    if with_comlrl:
        head += [f"speed-up {label}" for _, _, label in sides[:-1]] + [f"CPU-time speed-up {label}" for _, _, label in sides[:-1]]
    time_lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    head2 = ["config"] + [f"{label} tok/s" for _, _, label in sides] + [f"{label} peak MiB" for _, _, label in sides]
    head2 += [f"{label} peak over shared imports MiB" for _, _, label in sides]
    mem_lines = ["| " + " | ".join(head2) + " |", "|" + "---|" * len(head2)]
    for cfg in configs:
        runs = [best(results, cfg["name"], side, ips) for side, ips, _ in sides]
        any_run = next((r for r in runs if r), None)
        tokens = any_run["expected_tokens"] / any_run["items"] if any_run else None
        row = [cfg["name"], str(cfg["nodes"]), _fmt(tokens, ".0f")]
        row += [_fmt(r and r["seconds_per_item"], ".3f") for r in runs]
        if with_comlrl:
            theirs = runs[-1]
            for r in runs[:-1]:
                row.append(_fmt(theirs["seconds_per_item"] / r["seconds_per_item"], ".2f", "x") if theirs and r else "-")
            for r in runs[:-1]:
                row.append(_fmt(theirs["train_cpu_seconds"] / r["train_cpu_seconds"], ".2f", "x") if theirs and r else "-")
        time_lines.append("| " + " | ".join(row) + " |")
        row2 = [cfg["name"]] + [_fmt(r and r["tokens_per_second"], ".0f") for r in runs]
        row2 += [_fmt(r and r["peak_rss_mib"], ".0f") for r in runs]
        row2 += [_fmt(r and r.get("peak_over_shared_imports_mib"), ".0f") for r in runs]
        mem_lines.append("| " + " | ".join(row2) + " |")
    return "\n".join(time_lines) + "\n\n" + "\n".join(mem_lines)


def breakdown_table(results: list[dict], configs: list[dict]) -> str:
    """Where the train time of the fastest run of each (config, side) goes, in s/item."""
    names = ["gen_forward", "gen_sampling", "gen_other", "train_forward", "backward", "optimizer",
             "update_other", "reward", "transition", "rest"]
    lines = ["| config | side | s/item | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 3)]
    for cfg in configs:
        keys = sorted({(r["side"], r.get("items_per_step", 1)) for r in results if r["config"] == cfg["name"] and "error" not in r})
        for side, ips in keys:
            r = best(results, cfg["name"], side, ips)
            parts = r.get("breakdown_seconds", {})
            label = side_label(side, ips)
            cells = [f"{parts.get(n, 0.0) / r['items']:.3f}" for n in names]
            lines.append(f"| {cfg['name']} | {label} | {r['seconds_per_item']:.3f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


SIDE_NAMES = {"ours": "ours", "ours-lora": "ours LoRA", "ours-bf16s": "ours bf16-sampling", "ours-lora-bf16s": "ours LoRA bf16-sampling"}


def side_label(side: str, ips: int) -> str:
    return "CoMLRL" if side == "comlrl" else f"{SIDE_NAMES.get(side, side)} ips={ips}"


def _median(values: list[float]) -> float:
    values = sorted(values)
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def median_table(results: list[dict], configs: list[dict]) -> str:
    """Per (config, side): s/item of every repeat, their median, CoMLRL's median over ours, and
    the range of the per-repeat ratios (each repeat's runs are interleaved, so a repeat's ratio
    compares runs made minutes apart), with the 1-minute load averages seen."""
    lines = ["| config | side | s/item per repeat | median s/item | vs CoMLRL (ratio of medians) | per-repeat ratios | median peak MiB | load |",
             "|---|---|---|---|---|---|---|---|"]
    for cfg in configs:
        ok = [r for r in results if r["config"] == cfg["name"] and "error" not in r]
        theirs = {r["repeat"]: r["seconds_per_item"] for r in ok if r["side"] == "comlrl"}
        for side, ips in sorted({(r["side"], r.get("items_per_step", 1)) for r in ok}, key=lambda key: (key[0] == "comlrl", key)):
            runs = sorted((r for r in ok if r["side"] == side and r.get("items_per_step", 1) == ips), key=lambda r: r["repeat"])
            times = [r["seconds_per_item"] for r in runs]
            median = _median(times)
            ratio = f"{_median(list(theirs.values())) / median:.2f}x" if theirs and side != "comlrl" else "-"
            per = [theirs[r["repeat"]] / r["seconds_per_item"] for r in runs if r["repeat"] in theirs] if side != "comlrl" else []
            spread = f"{min(per):.2f}-{max(per):.2f}x" if per else "-"
            loads = [x for r in runs for x in (r["load1_before"], r["load1_after"])]
            lines.append(f"| {cfg['name']} | {side_label(side, ips)} | {' / '.join(f'{t:.2f}' for t in times)} | {median:.2f} | "
                         f"{ratio} | {spread} | {_median([r['peak_rss_mib'] for r in runs]):.0f} | {min(loads):.1f}-{max(loads):.1f} |")
    return "\n".join(lines)


def memory_table(results: list[dict], configs: list[dict]) -> str:
    """Peak memory of N LoRA agents on one base against ONE full-model agent (lowest of the
    repeats): raw peak RSS, and the peak above the shared imports."""
    lines = ["| config | one full-model agent: peak MiB (over imports) | LoRA team: agents, peak MiB (over imports) | ratio of peaks | ratio over imports |",
             "|---|---|---|---|---|"]
    for cfg in configs:
        name = cfg["name"] + "-mem"
        pick = lambda side: min((r for r in results if r["config"] == name and r["side"] == side and "error" not in r),  # noqa: E731
                                key=lambda r: r["peak_rss_mib"], default=None)
        full, team = pick("ours"), pick("ours-lora")
        if full and team:
            lines.append(
                f"| {cfg['name']} | {full['peak_rss_mib']:.0f} ({full['peak_over_shared_imports_mib']:.0f}) | "
                f"{team['agents']}, {team['peak_rss_mib']:.0f} ({team['peak_over_shared_imports_mib']:.0f}) | "
                f"{team['peak_rss_mib'] / full['peak_rss_mib']:.2f}x | "
                f"{team['peak_over_shared_imports_mib'] / max(full['peak_over_shared_imports_mib'], 1e-9):.2f}x |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smallest grid: K2T1-aligned, 2 items, ours items_per_step 1")
    parser.add_argument("--configs", default=None, help="comma-separated names or groups (quick, targets, grid, all); default grid")
    parser.add_argument("--items-per-step", type=int, nargs="+", default=None, help="ours: items rolled out together (default: 1 8)")
    parser.add_argument("--items", type=int, default=None, help="train items per run (default 8; --quick: 2)")
    parser.add_argument("--comlrl-python", default=None, help="interpreter of a venv with comlrl==1.4.3: also run CoMLRL")
    parser.add_argument("--ours-python", default=sys.executable,
                        help="interpreter for llm_marl's side (default: this one), e.g. a clean venv for like-for-like memory")
    parser.add_argument("--model-dir", default=os.path.join(tempfile.gettempdir(), "llm_marl_bench_models"), help="cache of the tiny models")
    parser.add_argument("--pretrain-steps", type=int, default=60, help="warm-start steps of the tiny models (default 60)")
    parser.add_argument("--new-tokens", type=int, default=24, help="new tokens per answer (default 24)")
    parser.add_argument("--no-force-length", action="store_true", help="let answers stop at eos (default: exactly --new-tokens)")
    parser.add_argument(
        "--max-batch-size", type=int, default=None, help="ours: CausalLMPolicy.max_batch_size, rows per call (default: no cap)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads in every worker (default 1)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per (config, side); the table shows the fastest")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per run before it is abandoned")
    parser.add_argument("--profile-dir", default=None, help="write a cProfile of each run's train() here")
    parser.add_argument("--out", default=None, help="write all runs (and the table) as JSON here")
    parser.add_argument("--lora-r", type=int, default=None,
                        help="also run our side with the agents as LoRA adapters of rank R on one base (LoRATeam)")
    parser.add_argument("--memory-agents", type=int, default=None,
                        help="memory rows: N LoRA agents (rank --lora-r, default 8) against ONE full-model agent, ips=1")
    parser.add_argument("--sample-dtype", default=None, choices=("bfloat16", "float16"),
                        help="also run our sides with CausalLMPolicy.sample_dtype (a bf16 sampler, exact fp32 scores)")
    parser.add_argument("--device", default=None,
                        help="ours: the agents' device (agent_devices), e.g. cuda; results add peak_gpu_mib (torch.cuda.max_memory_allocated)")
    parser.add_argument("--worker", choices=("ours", "ours-lora", "ours-bf16s", "ours-lora-bf16s", "comlrl", "build"), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)

    if opts.worker:
        with open(opts.spec) as handle:
            spec = json.load(handle)
        result = run_build(spec) if opts.worker == "build" else run_worker(opts.worker, spec)
        sys.stdout.write(RESULT_MARKER + json.dumps(result) + "\n")
        sys.stdout.flush()
        return 0

    subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "machine.py")], check=False)
    configs = expand_configs(opts.configs or ("quick" if opts.quick else "grid"))
    ips_list = opts.items_per_step or ([1] if opts.quick else [1, 8])
    items = opts.items or (2 if opts.quick else 8)
    if opts.comlrl_python and not os.path.exists(opts.comlrl_python):
        raise SystemExit(f"--comlrl-python {opts.comlrl_python} does not exist")
    # The driver imports only the standard library (see _peak_rss_mib): build in a subprocess.
    built = launch(sys.executable, "build", {"model_dir": os.path.abspath(opts.model_dir), "items": items,
                                             "pretrain_steps": opts.pretrain_steps,
                                             "need_large": any(c["large"] for c in configs),
                                             "need_smol": any(c["model"] == "smol" for c in configs)}, opts.timeout)
    if "error" in built:
        raise SystemExit(f"building the models failed: {built['error']}")
    models, prompts = built["models"], built["prompts"]
    if opts.profile_dir:
        os.makedirs(opts.profile_dir, exist_ok=True)
    print(f"# {len(configs)} configurations, {items} items, threads={opts.threads}, "
          f"ours items_per_step={ips_list} ({opts.ours_python}), CoMLRL: {opts.comlrl_python or 'not run'}", flush=True)

    results: list[dict] = []
    for repeat in range(opts.repeats):
        for cfg in configs:
            runs = [("ours", opts.ours_python, ips, {}) for ips in ips_list]
            if opts.lora_r:
                runs += [("ours-lora", opts.ours_python, ips, {"lora_r": opts.lora_r}) for ips in ips_list]
            if opts.sample_dtype:
                runs += [("ours-bf16s", opts.ours_python, ips, {"sample_dtype": opts.sample_dtype}) for ips in ips_list]
                if opts.lora_r:
                    runs += [("ours-lora-bf16s", opts.ours_python, ips, {"lora_r": opts.lora_r, "sample_dtype": opts.sample_dtype})
                             for ips in ips_list]
            if opts.comlrl_python:
                runs.append(("comlrl", opts.comlrl_python, 1, {}))
            if opts.memory_agents:
                rank = opts.lora_r or 8
                runs += [("ours", opts.ours_python, 1, {"agents": 1, "name": cfg["name"] + "-mem"}),
                         ("ours-lora", opts.ours_python, 1,
                          {"agents": opts.memory_agents, "lora_r": rank, "name": cfg["name"] + "-mem"})]
            for side, python, ips, extra in runs:
                spec = {
                    **cfg,
                    "model_dir": models[cfg["model"]],
                    "prompts": prompts,
                    "items_per_step": ips,
                    "new_tokens": opts.new_tokens,
                    "force_length": not opts.no_force_length,
                    "max_batch_size": opts.max_batch_size,
                    "threads": opts.threads,
                    "seed": opts.seed,
                    "device": opts.device,
                    **extra,
                }
                if opts.profile_dir:
                    spec["profile"] = os.path.join(opts.profile_dir, f"{spec['name']}-{side}-ips{ips}-r{repeat}.prof")
                result = launch(python, side, spec, opts.timeout)
                result["repeat"] = repeat
                results.append(result)
                if "error" in result:
                    print(f"{spec['name']:>20} {side:>9} ips={ips}: ERROR {result['error']}", flush=True)
                else:
                    print(
                        f"{spec['name']:>20} {side:>9} ips={ips} agents={result['agents']}: {result['seconds_per_item']:.3f} s/item "
                        f"{result['tokens_per_second']:.0f} tok/s peak {result['peak_rss_mib']:.0f} MiB "
                        + (f"GPU peak {result['peak_gpu_mib']:.0f} MiB " if result.get("peak_gpu_mib") is not None else "") +
                        f"(gen {result['generate_seconds']:.2f} s, update {result['update_seconds']:.2f} s, "
                        f"other {result['other_seconds']:.2f} s; cpu {result['train_cpu_seconds']:.1f} s; "
                        f"load {result['load1_before']:.1f}->{result['load1_after']:.1f})",
                        flush=True,
                    )
    text = table(results, configs, ips_list, bool(opts.comlrl_python), bool(opts.lora_r), bool(opts.sample_dtype))
    parts = breakdown_table(results, configs)
    medians = median_table(results, configs)
    text = medians + "\n\n" + text
    print()
    print(text)
    print()
    print(parts)
    if opts.memory_agents:
        memory = memory_table(results, configs)
        text += "\n\n" + memory
        print()
        print(memory)
    if opts.out:
        with open(opts.out, "w") as handle:
            json.dump({"options": {k: v for k, v in vars(opts).items() if k not in ("worker", "spec")},
                       "prompts": prompts, "models": models, "runs": results, "table": text, "breakdown": parts}, handle, indent=2)
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())

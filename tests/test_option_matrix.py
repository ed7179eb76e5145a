"""Every combination of options, tested together (issue 33.4).

The options are declared once, in :data:`OPTIONS` (with :func:`valid` for the combinations that
do not exist); :func:`allpairs.all_pairs` turns the declaration into a pairwise covering set of
cells: every pair of values of two options meets in at least one cell. Each cell trains two
agents for three optimizer steps on a tiny GPT-2 and checks the invariants:

- the sampler is the trained policy: a bf16 sampling copy equals the trained weights cast to
  bf16 after every optimizer step, and every logged ``train/<agent>/sampler_gap`` is within the sampler
  dtype's tolerance (:data:`~llm_marl.policies.base.DEFAULT_GAP_THRESHOLDS`);
- stop and resume equals an uninterrupted run (cells with ``resume``);
- no gradient reaches another agent's parameters (the trainers' own scoring path: a team's
  agents in one forward);
- every logged value and every parameter is finite.

The cells' models go to the device the ``device`` fixture names (``LLM_MARL_TEST_DEVICE``,
default ``cpu``: tests/devices.py). CI runs the cells of :data:`FAST` (``torchrun`` and ``fsdp`` only False: a torchrun cell starts
two processes); the set over every declared value is marked ``slow``. To add an option: add its
name and values to :data:`OPTIONS` (the first value is the default), exclude impossible pairs in
:func:`valid`, and apply it in :func:`build` — the generator covers its pairs with every other
option, and the cell count grows by a few cells at most.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch

from allpairs import all_pairs, pairs_of, required_pairs
from llm_marl.envs.dialogue import DialogueEnv
from llm_marl.learners import IACConfig, IACTrainer, MADPOConfig, MADPOTrainer, MAGRPOConfig, MAGRPOTrainer
from llm_marl.learners.update import _score_batches
from llm_marl.policies import CausalLMPolicy, LoRATeam
from llm_marl.policies.base import DEFAULT_GAP_THRESHOLDS
from llm_marl.policies.tiny import build_tiny_model
from llm_marl.tasks.function_task import FunctionTask

TESTS = os.path.dirname(os.path.abspath(__file__))

OPTIONS: dict[str, tuple] = {
    "learner": ("magrpo", "iac", "madpo"),  # the REINFORCE, actor-critic and preference families
    "policy": ("full", "team"),  # full models, or LoRA adapters on one base
    "sample_dtype": (None, "bfloat16"),
    "packed_weights": (True, False),
    "gradient_checkpointing": (False, True),
    "chunking": (None, "rows", "tokens"),  # scoring in one pass, or cut by max_batch_size / max_batch_tokens
    "chat_template": (False, True),
    "per_agent_rewards": (False, True),
    "dropout": (0.0, 0.1),  # the model's dropout rates (switched off by the policies)
    "resume": (False, True),
    "torchrun": (False, True),
    "fsdp": (False, True),  # agents sharded with FSDP2 across the torchrun ranks
    "against_collapse": (False, True),  # per-agent normalization and learning rates, the annealed entropy bonus (§3.9)
}
"""The declaration: option -> its values (the first is the default)."""

FAST = {"torchrun": (False,), "fsdp": (False,)}
"""The values CI's cells take (the slow set takes every declared value)."""


def valid(cell: dict) -> bool:
    """Whether a (partial) cell can exist."""
    if cell.get("gradient_checkpointing") and cell.get("policy", "team") != "team":
        return False  # checkpointing is an adapter-team setting
    if cell.get("per_agent_rewards") and cell.get("learner", "iac") != "iac":
        return False  # the MAGRPO and preference families need one shared reward
    if cell.get("torchrun") and cell.get("learner", "magrpo") == "madpo":
        return False  # not run distributed here (its pair store is per process)
    if cell.get("fsdp") and (not cell.get("torchrun", True) or cell.get("sample_dtype") is not None or cell.get("learner", "magrpo") == "madpo"):
        return False  # fsdp: under torchrun (so not MADPO here; tests/test_fsdp.py runs it), sampled in the model's own dtype
    return True


def cells(restrict: dict | None = None) -> list[dict]:
    options = {name: (restrict or {}).get(name, values) for name, values in OPTIONS.items()}
    return all_pairs(options, valid)


def cell_id(cell: dict) -> str:
    return "-".join(f"{k}={v}" for k, v in cell.items() if v != OPTIONS[k][0]) or "defaults"


# --- building and running one cell ---------------------------------------------------------------

PROMPTS = ["The assert statement", "A", "If the module being imported is not a top level module,"]
TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}"
DROPOUT = {"resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}


def model_dirs(root) -> dict[bool, str]:
    """The tiny GPT-2 (``False``) and a copy whose tokenizer has a chat template (``True``)."""
    from transformers import AutoTokenizer

    plain = str(build_tiny_model(os.path.join(root, "m"), n_embd=64, n_head=2, pretrain_steps=10, batch_size=8))
    chat = os.path.join(root, "chat")
    if not os.path.isdir(chat):
        shutil.copytree(plain, chat)
        tokenizer = AutoTokenizer.from_pretrained(chat)
        tokenizer.chat_template = TEMPLATE
        tokenizer.save_pretrained(chat)
    return {False: plain, True: chat}


def reward(a, b):
    # per agent: a is paid for length, b for brevity; shared: their sum
    ra, rb = len(a[0]) / 10.0, -len(b[0]) / 10.0
    return [ra, rb] if PER_AGENT[0] else [ra + rb]


PER_AGENT = [False]


def build(cell: dict, dirs: dict, output_dir: str | None, device: str = "cpu", **overrides):
    """The cell's trainer, its models on ``device`` (the ``device`` fixture: tests/devices.py)."""
    PER_AGENT[0] = cell["per_agent_rewards"]
    settings = dict(max_new_tokens=12, temperature=0.9, top_p=0.95, top_k=None, sample_dtype=cell["sample_dtype"],
                    packed_weights=cell["packed_weights"], chat_template=cell["chat_template"])
    if cell["chunking"] == "rows":
        settings["max_batch_size"] = 3
    elif cell["chunking"] == "tokens":
        settings["max_batch_tokens"] = 60
    model_kwargs = DROPOUT if cell["dropout"] else {}
    source = dirs[cell["chat_template"]]
    if cell["policy"] == "team":
        team = LoRATeam.from_pretrained(source, agents=("agent_0", "agent_1"), r=4, alpha=8, model_kwargs=model_kwargs,
                                        gradient_checkpointing=cell["gradient_checkpointing"], **settings)
        team.to(device)
        policies = [team.policies["agent_0"], team.policies["agent_1"]]
    else:
        policies = [CausalLMPolicy.from_pretrained(source, model_kwargs=model_kwargs, device=device, **settings) for _ in range(2)]
    task = FunctionTask(reward, lambda item: item["prompt"], None, [{"prompt": p} for p in PROMPTS], num_agents=2, num_turns=1)
    common = dict(num_agents=2, num_turns=1, num_train_epochs=2, max_steps=3, rollout_buffer_size=1, eval_interval=0,
                  early_termination_threshold=None, agent_learning_rate=5e-2, logging_steps=1, progress_bar=False, seed=3,
                  output_dir=output_dir, save_steps=1 if output_dir else 0, max_new_tokens=12, temperature=0.9, top_p=0.95,
                  top_k=None, rollout_log_steps=0, fsdp=cell.get("fsdp", False))
    if cell["against_collapse"]:
        common.update(agent_advantage_normalization=[False, True], agent_learning_rates=[5e-2, 2e-2], entropy_coef=0.1,
                      entropy_coef_final=0.0)
    common.update(overrides)
    if cell["learner"] == "magrpo":
        trainer_class, args = MAGRPOTrainer, MAGRPOConfig(num_generations=2, **common)
    elif cell["learner"] == "iac":
        trainer_class, args = IACTrainer, IACConfig(num_generations=2, critic_learning_rate=5e-2, **common)
    else:
        trainer_class, args = MADPOTrainer, MADPOConfig(preference_num_candidates=3, preference_pairs_per_sample=2, **common)
    return trainer_class(env=DialogueEnv(task), policies=policies, args=args)


def shadow_of(policy):
    """The policy's bf16 sampling copy (a team's, for an adapter agent), or None."""
    return getattr(getattr(policy, "team", None) or policy, "_shadow", None)


def assert_sampler_is_current(trainer) -> None:
    """The copy the next sampling call uses equals the trained weights cast to its dtype."""
    for agent in trainer.agents:
        policy = trainer.policies[agent]
        if shadow_of(policy) is None:
            continue
        policy._sampling_runner()  # what a sampling call does first
        shadow = shadow_of(policy)
        twins = dict(shadow.model.named_parameters())
        stale = [n for n, p in shadow.source.named_parameters() if not torch.equal(twins[n], p.detach().to(shadow.dtype))]
        assert not stale, f"after optimizer step {trainer.state.global_step + 1}: {agent}'s sampling copy stale in {stale[:3]}"


def watch_sampler(trainer):
    """Check :func:`assert_sampler_is_current` after every optimizer step of ``trainer``."""
    step = trainer._joint_optimizer_step

    def checked(batches):
        step(batches)
        assert_sampler_is_current(trainer)

    trainer._joint_optimizer_step = checked
    return trainer


def states(trainer) -> dict[str, dict[str, torch.Tensor]]:
    """Each agent's weights (fsdp: the full tensors, gathered on every rank alike)."""
    def full(t):
        return t.full_tensor() if hasattr(t, "full_tensor") else t.detach().clone()

    return {a: {n: full(t) for n, t in trainer.policies[a].state_dict().items()} for a in trainer.agents}


def check_invariants(cell: dict, trainer) -> dict:
    """The invariants that need no second run; returns facts for the caller (and torchrun ranks)."""
    trainer._flush_metrics(force=True)
    logged = [(name, value) for _, metrics in trainer.logger.history for name, value in metrics.items()]
    bad = [(n, v) for n, v in logged if not math.isfinite(v)]
    assert not bad, f"non-finite metrics {bad[:3]}"
    for agent in trainer.agents:  # fsdp: each rank checks its shards
        assert all(torch.isfinite(getattr(p, "to_local", lambda: p)()).all() for p in trainer.policies[agent].parameters()), agent
    assert trainer.state.global_step == 3
    # the sampler is the trained policy
    tolerance = DEFAULT_GAP_THRESHOLDS["bfloat16" if cell["sample_dtype"] else "float32"]
    gaps = [v for n, v in logged if n.endswith("/sampler_gap")]
    assert gaps and max(gaps) <= tolerance, f"sampler gaps {gaps} past {tolerance}"
    torch.manual_seed(0)
    for agent in trainer.agents:
        with trainer.gathered_weights():  # fsdp: every rank gathers the full weights to sample
            trainer.policies[agent].sample(PROMPTS[:1], 2)
        assert (shadow_of(trainer.policies[agent]) is not None) == bool(cell["sample_dtype"])
    assert_sampler_is_current(trainer)
    if trainer.sharded:
        return {"gaps": gaps}  # fsdp: the leak check scores outside a gathering window (tests/test_fsdp.py checks teams' gradients)
    # no gradient reaches another agent's parameters (the trainers' scoring path)
    torch.manual_seed(1)
    batches = {}
    from llm_marl.learners.buffer import Sample

    for agent in trainer.agents:
        completions = [c for group in trainer.policies[agent].sample(PROMPTS[:2], 2) for c in group]
        batches[agent] = [Sample(agent, PROMPTS[i // 2], completions[i : i + 1], [1.0], [1.0], 0, i) for i in range(len(completions))]
    for agent in trainer.agents:
        params = {a: list(trainer.policies[a].parameters()) for a in trainer.agents}
        for ps in params.values():
            for p in ps:
                p.grad = None
        scored = _score_batches(trainer.policies, batches, "sum")
        scored[agent].sum().backward()
        assert any(p.grad is not None and p.grad.abs().max() > 0 for p in params[agent]), f"{agent}: no gradient"
        for other in trainer.agents:
            if other != agent:
                leaked = [p for p in params[other] if p.grad is not None and p.grad.abs().max() > 0]
                assert not leaked, f"{agent}'s loss reached {len(leaked)} parameters of {other}"
        for ps in params.values():
            for p in ps:
                p.grad = None
    return {"gaps": gaps}


def run_cell(cell: dict, dirs: dict, tmp: str, device: str = "cpu") -> dict:
    full = watch_sampler(build(cell, dirs, os.path.join(tmp, "full") if cell["resume"] else None, device))
    full.train()
    facts = check_invariants(cell, full)
    if cell["resume"]:
        first = build(cell, dirs, os.path.join(tmp, "split"), device, max_steps=1)
        first.train()
        assert first.state.global_step == 1
        resumed = build(cell, dirs, os.path.join(tmp, "split"), device)
        resumed.train(resume_from_checkpoint=True)
        a, b = states(full), states(resumed)
        for agent in a:
            differ = [n for n in a[agent] if not torch.equal(a[agent][n], b[agent][n])]
            assert not differ, f"resumed {agent} differs from the uninterrupted run in {differ[:3]}"
        for gaps in ("_gap_baselines", "_gaps_over"):  # the sampler-gap warning's state (update.py) resumes too
            assert getattr(resumed, gaps, {}) == getattr(full, gaps, {}), (gaps, getattr(resumed, gaps, {}), getattr(full, gaps, {}))
    return facts


RANK_SCRIPT = r"""
import json, os, sys, torch
sys.path.insert(0, {tests!r})
torch.set_num_threads(1)
import test_option_matrix as m
cell = json.loads({cell!r})
trainer = m.build(cell, {{True: {chat!r}, False: {plain!r}}}, None)
trainer.train()
m.check_invariants(cell, trainer)
rank = int(os.environ["RANK"])
torch.save({{"world_size": trainer.dist.world_size, "states": m.states(trainer)}}, os.path.join({out!r}, f"rank{{rank}}.pt"))
sys.stdout.flush(); sys.stderr.flush()
os._exit(0)
"""


def run_torchrun_cell(cell: dict, dirs: dict, tmp: str) -> None:
    """The cell under ``torchrun --nproc_per_node 2`` (gloo): both ranks pass the invariants and
    end with identical weights. (Resume under torchrun is covered by tests/test_distributed.py.)"""
    out = os.path.join(tmp, "ranks")
    os.makedirs(out, exist_ok=True)
    script = os.path.join(tmp, "rank.py")
    with open(script, "w", encoding="utf-8") as handle:
        handle.write(RANK_SCRIPT.format(tests=TESTS, cell=json.dumps(cell), chat=dirs[True], plain=dirs[False], out=out))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([os.path.dirname(TESTS), TESTS, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533", script],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [torch.load(os.path.join(out, f"rank{r}.pt"), weights_only=False) for r in range(2)]
    assert all(r["world_size"] == 2 for r in ranks)
    for agent, state in ranks[0]["states"].items():
        assert all(torch.equal(t, ranks[1]["states"][agent][n]) for n, t in state.items()), f"ranks differ for {agent}"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return model_dirs(str(tmp_path_factory.mktemp("matrix")))


# --- the generator and the declaration ----------------------------------------------------------


def test_the_cells_cover_every_allowed_pair_of_option_values():
    for restrict in (FAST, None):
        options = {name: (restrict or {}).get(name, values) for name, values in OPTIONS.items()}
        chosen = cells(restrict)
        assert all(valid(cell) for cell in chosen)
        covered = set().union(*(pairs_of(cell, list(OPTIONS)) for cell in chosen))
        assert required_pairs(options, valid) <= covered
    assert len(cells(FAST)) <= 12  # CI's budget: about two minutes


def test_all_pairs_covers_pairs_with_constraints_and_no_more_cells_than_needed():
    options = {"a": (0, 1, 2), "b": (0, 1, 2), "c": (0, 1), "d": (0, 1)}
    forbid = lambda cell: not (cell.get("a") == 2 and cell.get("c") == 1)  # noqa: E731
    chosen = all_pairs(options, forbid)
    assert all(forbid(cell) for cell in chosen)
    covered = set().union(*(pairs_of(cell, list(options)) for cell in chosen))
    assert required_pairs(options, forbid) <= covered and ("a", 2, "c", 1, ) not in {p[:4] for p in covered}
    assert 9 <= len(chosen) <= 12  # a and b alone need 9


# --- the cells -----------------------------------------------------------------------------------


@pytest.mark.device
@pytest.mark.parametrize("cell", cells(FAST), ids=cell_id)
def test_cell(cell, dirs, tmp_path, device):
    run_cell(cell, dirs, str(tmp_path), device)


SLOW_ONLY = [c for c in cells() if c not in cells(FAST)]


@pytest.mark.slow
@pytest.mark.device
@pytest.mark.parametrize("cell", SLOW_ONLY, ids=cell_id)
def test_cell_full_set(cell, dirs, tmp_path, device):
    if cell["torchrun"]:
        run_torchrun_cell(cell, dirs, str(tmp_path))  # its ranks on the CPU (gloo): two ranks cannot share one GPU
    else:
        run_cell(cell, dirs, str(tmp_path), device)

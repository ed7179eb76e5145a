"""Models off the CPU: the CPU-only paths stay off, and the policies run on the device.

The first tests need no GPU: they check each CPU-only decision (packed weights, oneDNN's bf16
fallback, the collectives' process group) for a model that is not on the CPU, with the ``meta``
device standing in for ``cuda`` (tensors with a device and a dtype but no data) or by asking the
decision function about ``cuda`` directly. The tests marked ``device`` put a tiny model on the
device ``LLM_MARL_TEST_DEVICE`` names (default ``cpu``; tests/devices.py), so that
``benchmarks/gpu_check.py`` runs them on ``cuda``.
"""

from __future__ import annotations

import socket
import warnings

import pytest
import torch
import torch.distributed as dist

from devices import VARIABLE, test_device
from llm_marl import cpu
from llm_marl.policies import CausalLMPolicy, LoRATeam
from llm_marl.policies.base import DEFAULT_GAP_THRESHOLDS
from llm_marl.policies.causal_lm import _bf16_on_cpu
from llm_marl.policies.packed_weights import PackedLinears
from llm_marl.policies.tiny import build_tiny_model, default_model_dir
from llm_marl.envs.dialogue import DialogueEnv
from llm_marl.learners import MAGRPOConfig, MAGRPOTrainer
from llm_marl.runs.distributed import launched_by_torchrun, process_group_backend
from llm_marl.runs.fsdp import is_sharded
from llm_marl.tasks.function_task import FunctionTask

PROMPTS = ["The assert statement", "A", "If the module being imported is not a top level module,"]
SETTINGS = dict(max_new_tokens=12, temperature=1.0, top_p=None, top_k=None)
NO_BF16 = cpu.Bf16Support(False, "faked: no bf16 kernels")


# --- the device the marked tests take ------------------------------------------------------------


def test_the_test_device_is_the_cpu_unless_the_variable_names_a_usable_one():
    assert test_device({}) == "cpu"
    assert test_device({VARIABLE: " CUDA:1 "}, cuda_available=lambda: True) == "cuda:1"
    with pytest.raises(ValueError, match=rf"^{VARIABLE}=cuda: this torch sees no CUDA device"):
        test_device({VARIABLE: "cuda"}, cuda_available=lambda: False)
    with pytest.raises(ValueError, match=rf"^{VARIABLE}='gpu': expected cpu, cuda or cuda:N"):
        test_device({VARIABLE: "gpu"})


# --- the CPU-only paths, for models off the CPU -----------------------------------------------------


def layers(device: str, dtype: torch.dtype) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 64)).to(device=device, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weights_are_packed_only_on_the_cpu(dtype, monkeypatch):
    # Planted bug caught: PackedLinears.layers() without its device check (MKL/oneDNN packs of a
    # CUDA weight; and a bf16 model on a GPU warned about the CPU's missing bf16 kernels).
    monkeypatch.setattr(cpu, "bf16_support", lambda: cpu.Bf16Support(True, ""))
    assert len(PackedLinears(layers("cpu", dtype)).layers()) == 2  # the control: the same layers on the CPU are packed
    monkeypatch.setattr(cpu, "bf16_support", lambda: NO_BF16)
    monkeypatch.setattr(cpu, "_WARNED", set())
    off = PackedLinears(layers("meta", dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no CPUWarning about this CPU's bf16 kernels either
        assert off.layers() == []
        with off.active(rows=4, new_tokens=24):
            pass
    assert off.packed_last == 0


def test_the_bf16_fallback_warning_is_only_for_bf16_on_the_cpu():
    # Planted bug caught: _bf16_on_cpu without its device check.
    assert _bf16_on_cpu(layers("cpu", torch.bfloat16), None)
    assert _bf16_on_cpu(layers("cpu", torch.float32), "bfloat16")
    assert not _bf16_on_cpu(layers("cpu", torch.float32), None)
    assert not _bf16_on_cpu(layers("meta", torch.bfloat16), None)
    assert not _bf16_on_cpu(layers("meta", torch.float32), "bfloat16")


def test_the_process_group_takes_cpu_tensors_beside_cuda_ones():
    # NCCL alone refuses CPU tensors, and the trainers' collectives all-reduce CPU scalars (and a
    # CPU model's gradients): with CUDA, CPU tensors go through gloo and CUDA ones through NCCL.
    # Planted bug caught: "nccl" alone (the backend before issue 46).
    assert process_group_backend(cuda_available=True) == "cpu:gloo,cuda:nccl"
    assert process_group_backend(cuda_available=False) == "gloo"


# --- on the device ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir():
    return str(build_tiny_model(default_model_dir()))  # the suite's shared tiny model, built once


def gap(policy, completions) -> float:
    """The mean |sampler log-prob - scorer log-prob| per token of ``completions``."""
    values, mask = policy.token_log_probs([p for p in PROMPTS for _ in range(2)], completions)
    sampled = torch.zeros_like(values)
    for row, completion in enumerate(completions):
        sampled[row, : len(completion.sampler.log_probs)] = torch.tensor(completion.sampler.log_probs, device=values.device)
    return float((values.detach() - sampled).abs()[mask].mean())


@pytest.mark.device
@pytest.mark.parametrize("sample_dtype", [None, "bfloat16"])
def test_a_policy_samples_and_scores_on_its_device(model_dir, device, sample_dtype):
    policy = CausalLMPolicy.from_pretrained(model_dir, device=device, sample_dtype=sample_dtype, **SETTINGS)
    torch.manual_seed(0)
    completions = [c for group in policy.sample(PROMPTS, 2) for c in group]
    assert all(c.token_ids and c.sampler is not None for c in completions)
    values, _ = policy.token_log_probs([p for p in PROMPTS for _ in range(2)], completions)
    assert values.device.type == torch.device(device).type and values.requires_grad
    assert torch.isfinite(values).all()
    assert gap(policy, completions) <= DEFAULT_GAP_THRESHOLDS[sample_dtype or "float32"]
    shadow = policy._shadow
    assert (shadow is not None) == (sample_dtype is not None)
    if shadow is not None:
        assert all(p.device.type == torch.device(device).type for p in shadow.model.parameters())


@pytest.mark.device
def test_a_team_with_a_bf16_base_trains_its_fp32_adapters_on_its_device(model_dir, device):
    team = LoRATeam.from_pretrained(model_dir, agents=("agent_0", "agent_1"), r=4, alpha=8, dtype="bfloat16", **SETTINGS).to(device)
    policy = team.policies["agent_0"]
    adapters = [p for p in policy.parameters() if p.requires_grad]
    assert adapters and all(p.dtype == torch.float32 and p.device.type == torch.device(device).type for p in adapters)
    torch.manual_seed(0)
    completions = [c for group in policy.sample(PROMPTS, 2) for c in group]
    before = [p.detach().clone() for p in adapters]
    optimizer = torch.optim.AdamW(adapters, lr=1e-2)
    loss = -policy.log_probs([p for p in PROMPTS for _ in range(2)], completions).sum()
    assert torch.isfinite(loss)
    loss.backward()
    optimizer.step()
    assert any(not torch.equal(a, b) for a, b in zip(adapters, before))
    assert all(torch.isfinite(p).all() for p in adapters)


# --- one GPU: torchrun at one rank, fsdp=True -------------------------------------------------------

TORCHRUN_ONE_RANK = {"TORCHELASTIC_RUN_ID": "test", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                     "MASTER_ADDR": "127.0.0.1"}


def test_torchrun_is_recognised_by_its_variables(monkeypatch):
    for name in (*TORCHRUN_ONE_RANK, "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert not launched_by_torchrun()
    for name, value in {**TORCHRUN_ONE_RANK, "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    assert launched_by_torchrun()


def one_rank_run(model_dir, fsdp: bool):
    task = FunctionTask(lambda a, b: [float(len(a[0]) + len(b[0]))], lambda item: item["prompt"], None,
                        [{"prompt": p} for p in PROMPTS], num_agents=2, num_turns=1)
    policies = [CausalLMPolicy.from_pretrained(model_dir, max_new_tokens=6, temperature=1.0, top_p=None, top_k=None) for _ in range(2)]
    args = MAGRPOConfig(num_agents=2, num_turns=1, num_generations=2, num_train_epochs=1, max_new_tokens=6, temperature=1.0, top_p=1.0,
                        top_k=None, items_per_step=1, rollout_buffer_size=1, max_steps=2, eval_interval=0, progress_bar=False,
                        early_termination_threshold=None, agent_learning_rate=1e-2, seed=5, fsdp=fsdp)
    trainer = MAGRPOTrainer(env=DialogueEnv(task), policies=policies, args=args)
    trainer.train()
    full = lambda t: t.full_tensor() if is_sharded(t) else t.detach()  # noqa: E731
    return trainer, {a: {n: full(t).clone() for n, t in trainer.policies[a].model.state_dict().items()} for a in trainer.agents}


def test_fsdp_at_one_torchrun_rank_shards_over_a_group_of_one_and_trains_like_no_fsdp(model_dir, monkeypatch):
    # A single GPU can run fsdp=True only at one rank (two NCCL ranks cannot share a device), so
    # under torchrun one rank joins a process group of one and FSDP2 shards over it: its gathers and
    # reductions run, and it trains as without fsdp. Fails without the fix: "needs a torchrun process
    # group of 2+ ranks". A plain process (no torchrun) is still refused (tests/test_fsdp.py).
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for name, value in {**TORCHRUN_ONE_RANK, "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(name, value)
    _, plain = one_rank_run(model_dir, fsdp=False)
    try:
        trainer, sharded = one_rank_run(model_dir, fsdp=True)
        assert dist.is_initialized() and dist.get_world_size() == 1 and not trainer.dist.enabled
        assert all(is_sharded(p) for p in trainer.policies["agent_0"].model.parameters())
        assert trainer.state.global_step == 2
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    for agent, state in plain.items():
        for name, tensor in state.items():
            assert torch.allclose(tensor, sharded[agent][name], atol=1e-5), f"{agent} {name}"
        assert any(not torch.equal(t, s) for t, s in zip(state.values(), one_rank_start(model_dir).values()))


def one_rank_start(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).state_dict()

"""Packed fp32 weights for CPU decoding (``llm_marl.policies.packed_weights``): the decode steps'
linear layers run on weights MKL packed once per sampling call, with the same fp32 results up to
summation order, never on a stale pack, and without holding trainable weights' packs.

bf16 packs run only where the CPU runs oneDNN's bf16 kernels (``llm_marl.cpu.bf16_support``); the
tests here pass on either kind of CPU, and the fallback is tested on any CPU by faking the
answer. To see what an AVX2-only CPU sees for real, run this file with ``ONEDNN_MAX_CPU_ISA=AVX2``.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from llm_marl import cpu
from llm_marl.policies import CausalLMPolicy, LoRATeam
from llm_marl.policies import packed_weights as pw
from llm_marl.policies.tiny import load_tiny

pytestmark = pytest.mark.skipif(
    not all(kernel.available for kernel in pw.KERNELS.values()), reason="this torch lacks MKL or oneDNN"
)

torch.set_num_threads(1)

PROMPTS = ["The assert statement", "If the module being imported is not a top level module,"]
SETTINGS = dict(max_new_tokens=16, temperature=1.0, top_p=None, top_k=None)


@pytest.fixture
def spy(monkeypatch):
    """Records the input shape of every linear that ran on a packed weight."""
    calls = []
    real = pw.packed_linear

    def counting(x, packed, weight, bias, rows):
        calls.append(tuple(x.shape))
        return real(x, packed, weight, bias, rows)

    monkeypatch.setattr(pw, "packed_linear", counting)
    return calls


@pytest.fixture
def fake_bf16(monkeypatch):
    """``fake_bf16(runs)``: from now on oneDNN's bf16 kernels run here (True) or not (False), and
    the once-per-process line may be said again."""

    def fake(runs: bool) -> None:
        answer = cpu.Bf16Support(runs, "" if runs else "this CPU (Faked EPYC) lacks avx512bw, avx512vl, avx512dq and avx_ne_convert")
        monkeypatch.setattr(cpu, "bf16_support", lambda: answer)
        monkeypatch.setattr(cpu, "_WARNED", set())

    return fake


def bf16_packs_run() -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", cpu.CPUWarning)
        return pw.runs_here(torch.bfloat16)


def mlp(frozen: bool, dtype=torch.float32) -> torch.nn.Sequential:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(96, 160), torch.nn.Linear(160, 96), torch.nn.Linear(96, 8)).to(dtype)
    for p in net.parameters():
        p.requires_grad_(not frozen)
    return net


def test_few_row_inputs_run_packed_and_match_f_linear_others_take_f_linear_itself(spy):
    net = mlp(frozen=True)
    packer = pw.PackedLinears(net)
    assert [tuple(m.weight.shape) for m in packer.layers()] == [(160, 96), (96, 160)]  # 96x8 is too narrow
    four, two, many = torch.randn(4, 1, 96), torch.randn(2, 96), torch.randn(300, 96)
    with torch.inference_mode():
        want = [net(x) for x in (four, two, many)]
        with packer.active(rows=4, new_tokens=pw.MIN_STEPS):
            got = [net(x) for x in (four, two, many)]
    assert packer.packed_last == 2
    assert spy == [(4, 1, 96), (4, 1, 160)]  # fp32 packs serve the call's row count only
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
    assert "forward" not in net[0].__dict__  # restored


def test_bf16_packed_results_are_bit_for_bit_those_of_f_linear(spy):
    net = mlp(frozen=True, dtype=torch.bfloat16)
    x = torch.randn(8, 1, 96, dtype=torch.bfloat16)
    with torch.inference_mode():
        want = net(x)
        with pw.PackedLinears(net).active(rows=8, new_tokens=24):
            got = net(x)
    assert len(spy) == (2 if bf16_packs_run() else 0) and torch.equal(got, want)


def test_without_bf16_kernels_bf16_layers_run_unpacked_and_one_line_says_why(spy, fake_bf16):
    fake_bf16(False)
    net = mlp(frozen=True, dtype=torch.bfloat16)
    packer = pw.PackedLinears(net)
    x = torch.randn(8, 1, 96, dtype=torch.bfloat16)
    with warnings.catch_warnings(record=True) as caught, torch.inference_mode():
        warnings.simplefilter("always")
        want = net(x)
        for _ in range(2):
            with packer.active(rows=8, new_tokens=24):
                got = net(x)
            assert torch.equal(got, want)
    assert spy == [] and packer.packed_last == 0 and "forward" not in net[0].__dict__
    lines = [str(w.message) for w in caught if issubclass(w.category, cpu.CPUWarning)]
    assert len(lines) == 1 and "\n" not in lines[0], lines  # once, one line
    assert "lacks avx512bw, avx512vl, avx512dq and avx_ne_convert" in lines[0] and "bf16 layers run unpacked" in lines[0]
    fp32 = mlp(frozen=True)
    assert len(pw.PackedLinears(fp32).layers()) == 2  # fp32 packs are not affected


def test_with_bf16_kernels_bf16_layers_are_packable_and_nothing_is_said(fake_bf16):
    fake_bf16(True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        layers = pw.PackedLinears(mlp(frozen=True, dtype=torch.bfloat16)).layers()
    assert [tuple(m.weight.shape) for m in layers] == [(160, 96), (96, 160)]


def test_a_failed_pack_leaves_the_model_as_it_was_and_its_own_error_shows(monkeypatch):
    """What an AVX2-only CPU did before the capability check: oneDNN refused the second layer's
    pack, and the cleanup then raised KeyError: 'forward', hiding that error."""
    net = mlp(frozen=True)
    own = net[0].forward
    net[0].forward = own  # an instance attribute, which must survive
    real = pw.KERNELS[torch.float32]
    packs = []

    def refusing(weight, rows):
        packs.append(tuple(weight.shape))
        if len(packs) == 2:
            raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert or avx512bw")
        return real.pack(weight, rows)

    monkeypatch.setitem(pw.KERNELS, torch.float32, real._replace(pack=refusing))
    x = torch.randn(4, 96)
    with torch.inference_mode():
        want = net(x)
        with pytest.raises(RuntimeError, match="bf16 path needs the cpu support"), pw.PackedLinears(net).active(rows=4, new_tokens=24):
            pass
        assert net[0].__dict__["forward"] is own and "forward" not in net[1].__dict__
        assert torch.equal(net(x), want)


def test_a_changed_weight_is_packed_again_never_used_stale():
    net = mlp(frozen=True)
    packer = pw.PackedLinears(net)
    x = torch.randn(4, 96)
    with torch.inference_mode():
        with packer.active(rows=4, new_tokens=24):
            net(x)
        assert packer.held_weights() == 2  # frozen: kept for the next call
        with packer.active(rows=4, new_tokens=24):
            net(x)
        assert packer.packed_last == 0  # unchanged: reused
    with torch.no_grad():
        net[1].weight.mul_(-2.0)  # an in-place update, as an optimizer step or a bf16 refresh does
    with torch.inference_mode():
        with packer.active(rows=4, new_tokens=24):
            got = net(x)
        want = net(x)
    assert packer.packed_last == 1
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert packer.held_weights() == 1  # a weight that changes between calls is not held


def test_trainable_weights_packs_are_dropped_and_grad_mode_runs_f_linear(spy, monkeypatch):
    trims = []
    monkeypatch.setattr(pw, "return_freed_memory", lambda: trims.append(1))
    net = mlp(frozen=False)
    packer = pw.PackedLinears(net)
    x = torch.randn(4, 96)
    with packer.active(rows=4, new_tokens=24):
        y = net(x)  # autograd on: the packed op has no backward, so F.linear runs
        y.sum().backward()
    assert spy == [] and net[0].weight.grad is not None
    assert packer.held_weights() == 0 and trims == [1]  # dropped, and the freed heap handed back
    frozen = pw.PackedLinears(mlp(frozen=True))
    with torch.inference_mode(), frozen.active(rows=4, new_tokens=24):
        pass
    assert frozen.held_weights() == 2 and trims == [1]  # nothing dropped: nothing to hand back


def test_forward_is_restored_after_an_error_and_an_instance_forward_survives():
    net = mlp(frozen=True)
    own = net[1].forward
    net[1].forward = own  # an instance attribute (as a timing wrapper sets)
    packer = pw.PackedLinears(net)
    with pytest.raises(RuntimeError, match="boom"), torch.inference_mode(), packer.active(rows=4, new_tokens=24):
        raise RuntimeError("boom")
    assert "forward" not in net[0].__dict__ and net[1].__dict__["forward"] is own


@pytest.mark.parametrize("rows,new_tokens", [(1, 24), (4, pw.MIN_STEPS - 1)])
def test_calls_that_would_not_repay_packing_change_nothing(rows, new_tokens, spy):
    net = mlp(frozen=True)
    packer = pw.PackedLinears(net)
    with torch.inference_mode(), packer.active(rows=rows, new_tokens=new_tokens):
        net(torch.randn(rows, 96))
    assert spy == [] and packer.packed_last == 0 and "forward" not in net[0].__dict__


def sampled(policy, seed=3, k=4):
    torch.manual_seed(seed)
    return [c.token_ids for group in policy.sample(PROMPTS, k) for c in group]


def tiny_llama():
    """A 2-layer Llama (every projection an ``nn.Linear``, as in Llama/Qwen/Mistral checkpoints)
    with the tiny model's tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    _, tokenizer = load_tiny()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id, pad_token_id=tokenizer.eos_token_id,
    )
    return LlamaForCausalLM(config).eval(), tokenizer


def test_packed_weights_must_be_a_bool():
    model, tokenizer = tiny_llama()
    with pytest.raises(ValueError, match=r"packed_weights must be True or False, got 'yes'"):
        CausalLMPolicy(model, tokenizer, packed_weights="yes")


@pytest.mark.parametrize("sample_dtype", [None, "bfloat16"])
def test_a_policy_samples_the_same_tokens_with_and_without_packing_also_after_an_update(sample_dtype, spy):
    model, tokenizer = tiny_llama()
    packed = CausalLMPolicy(model, tokenizer, sample_dtype=sample_dtype, **SETTINGS)
    plain = CausalLMPolicy(model, tokenizer, sample_dtype=sample_dtype, packed_weights=False, **SETTINGS)
    assert plain.settings()["packed_weights"] is False and packed.settings()["packed_weights"] is True
    for step in range(2):
        spy.clear()
        without = sampled(plain)
        assert spy == []
        with_packing = sampled(packed)
        sampler = packed._sampling_runner().model  # the model itself, or its bf16 copy
        layers = len(pw.packed_linears(sampler).layers())
        runs = sample_dtype is None or bf16_packs_run()
        assert layers == (2 * 7 + 1 if runs else 0)  # q k v o gate up down per layer, and the lm head
        decode_steps = max(len(ids) for ids in with_packing) - 1
        assert sum(shape[:2] == (8, 1) for shape in spy) == decode_steps * layers  # every step's linears
        assert with_packing == without
        assert pw.packed_linears(sampler).held_weights() == (0 if step or sample_dtype is None else layers)
        assert "forward" not in sampler.lm_head.__dict__
        with torch.no_grad():  # an update of every weight, as an optimizer step makes
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)


def test_a_team_keeps_its_frozen_base_packed_and_never_packs_adapters(spy):
    base, tokenizer = tiny_llama()
    team = LoRATeam.from_model(base, tokenizer, ["left", "right"], r=4, alpha=8, target_modules=["q_proj", "v_proj"], **SETTINGS)
    for name, layer in team.model.named_modules():
        if name.endswith(("lora_B.left", "lora_B.right")):
            torch.nn.init.normal_(layer.weight, std=0.2)  # adapters that change the answers
    requests = {"left": PROMPTS[:1], "right": PROMPTS[1:]}
    torch.manual_seed(5)
    packed = team.sample(requests, 4)
    packer = pw.packed_linears(team.runner.model)
    layers = packer.layers()
    assert len(layers) == 2 * 7 + 1 and packer.held_weights() == len(layers)  # frozen base: held
    assert not any(".lora_" in name for name, m in team.model.named_modules() if any(m is l for l in layers))
    assert sum(shape[:2] == (8, 1) for shape in spy) > 0
    for policy in team.policies.values():
        policy.packed_weights = False
    spy.clear()
    torch.manual_seed(5)
    plain = team.sample(requests, 4)
    assert spy == []
    tokens = lambda out: {a: [c.token_ids for g in v for c in g] for a, v in out.items()}  # noqa: E731
    assert tokens(packed) == tokens(plain)


@pytest.mark.parametrize("runs", [True, False])
def test_a_bf16_policy_says_once_when_its_cpu_has_no_bf16_kernels_and_then_samples_unpacked(runs, fake_bf16, spy):
    fake_bf16(runs)
    model, tokenizer = tiny_llama()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        packed = CausalLMPolicy(model, tokenizer, sample_dtype="bfloat16", **SETTINGS)
        plain = CausalLMPolicy(model, tokenizer, sample_dtype="bfloat16", packed_weights=False, **SETTINGS)
        if not runs:  # (where the fake says yes on a CPU that says no, sampling would meet oneDNN's refusal)
            assert sampled(packed) == sampled(plain) and spy == []
    lines = [str(w.message) for w in caught if issubclass(w.category, cpu.CPUWarning)]
    if runs:
        assert lines == []
    else:
        assert len(lines) == 1 and lines[0].startswith(f"{packed.name} runs in bfloat16 on a CPU without oneDNN's bf16 kernels")

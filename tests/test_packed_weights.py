"""Packed fp32 weights for CPU decoding (``llm_marl.policies.packed_weights``): the decode steps'
linear layers run on weights MKL packed once per sampling call, with the same fp32 results up to
summation order, never on a stale pack, and without holding trainable weights' packs."""

from __future__ import annotations

import pytest
import torch

from llm_marl.policies import CausalLMPolicy, LoRATeam
from llm_marl.policies import packed_weights as pw
from llm_marl.policies.tiny import load_tiny

pytestmark = pytest.mark.skipif(pw._mkl_ops() is None, reason="this torch has no MKL packed-GEMM ops")

torch.set_num_threads(1)

PROMPTS = ["The assert statement", "If the module being imported is not a top level module,"]
SETTINGS = dict(max_new_tokens=16, temperature=1.0, top_p=None, top_k=None)


@pytest.fixture
def spy(monkeypatch):
    """Counts the linears that ran on a packed weight."""
    calls = []
    real = pw.packed_linear

    def counting(x, packed, weight, bias, rows):
        calls.append(tuple(x.shape))
        return real(x, packed, weight, bias, rows)

    monkeypatch.setattr(pw, "packed_linear", counting)
    return calls


def mlp(frozen: bool) -> torch.nn.Sequential:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(96, 160), torch.nn.Linear(160, 96), torch.nn.Linear(96, 8))
    for p in net.parameters():
        p.requires_grad_(not frozen)
    return net


def test_packed_rows_match_f_linear_and_other_rows_take_f_linear_exactly(spy):
    net = mlp(frozen=True)
    packer = pw.PackedLinears(net)
    assert [tuple(m.weight.shape) for m in packer.layers()] == [(160, 96), (96, 160)]  # 96x8 is too narrow
    four, three = torch.randn(4, 1, 96), torch.randn(3, 96)
    with torch.inference_mode():
        want4, want3 = net(four), net(three)
        with packer.active(rows=4, new_tokens=pw.MIN_STEPS):
            got4, got3 = net(four), net(three)
    assert packer.packed_last == 2
    assert spy == [(4, 1, 96), (4, 1, 160), (3, 96), (3, 160)]  # every call reaches the op; it picks
    torch.testing.assert_close(got4, want4, rtol=1e-5, atol=1e-5)
    assert torch.equal(got3, want3)  # not the packed row count: F.linear's own result
    assert "forward" not in net[0].__dict__  # restored


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
        assert packer.packed_last == 0  # unchanged, same rows: reused
    with torch.no_grad():
        net[1].weight.mul_(-2.0)  # an in-place update, as an optimizer step does
    with torch.inference_mode():
        with packer.active(rows=4, new_tokens=24):
            got = net(x)
        want = net(x)
    assert packer.packed_last == 1
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with torch.inference_mode(), packer.active(rows=8, new_tokens=24):
        net(torch.randn(8, 96))
    assert packer.packed_last == 2  # another row count: packed for it


def test_trainable_weights_packs_are_dropped_and_grad_mode_runs_f_linear(spy):
    net = mlp(frozen=False)
    packer = pw.PackedLinears(net)
    x = torch.randn(4, 96)
    with packer.active(rows=4, new_tokens=24):
        y = net(x)  # autograd on: the packed op has no backward, so F.linear runs
        y.sum().backward()
    assert spy == [] and net[0].weight.grad is not None
    assert packer.held_weights() == 0


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


def test_a_policy_samples_the_same_tokens_with_and_without_packing(spy):
    model, tokenizer = tiny_llama()
    packed = CausalLMPolicy(model, tokenizer, **SETTINGS)
    plain = CausalLMPolicy(model, tokenizer, packed_weights=False, **SETTINGS)
    assert plain.settings()["packed_weights"] is False and packed.settings()["packed_weights"] is True
    without = sampled(plain)
    assert spy == []
    with_packing = sampled(packed)
    steps = max(len(ids) for ids in with_packing) - 1  # decode steps after the prefill
    layers = len(pw.packed_linears(model).layers())
    assert layers == 2 * 7 + 1  # q k v o gate up down per layer, and the lm head
    assert sum(shape[:2] == (8, 1) for shape in spy) == steps * layers  # every step's linears
    assert with_packing == without
    assert pw.packed_linears(model).held_weights() == 0  # trainable: nothing held after the call
    assert "forward" not in model.lm_head.__dict__


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

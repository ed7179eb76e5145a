"""The sampler is the trained policy (issue 33.1): every copy used for sampling (the bf16 shadow,
a team's adapters in it, packed weights) is current after every optimizer step, load and
broadcast, whoever made the change, including ``AdamW(fused=True)`` (the trainers' default),
which writes its parameters in place without bumping torch's ``_version`` counter."""

from __future__ import annotations

import pytest
import torch

from llm_marl.envs.dialogue import DialogueEnv
from llm_marl.learners import MAGRPOConfig, MAGRPOTrainer
from llm_marl.policies import CausalLMPolicy, LoRATeam
from llm_marl.policies.packed_weights import PackedLinears
from llm_marl.policies.weight_changes import last_change, weights_changed
from llm_marl.runs.distributed import DistributedContext
from llm_marl.tasks.function_task import FunctionTask

PROMPTS = ["The assert statement", "A", "If the module being imported is not a top level module,"]
SETTINGS = dict(max_new_tokens=12, temperature=1.0, top_p=None, top_k=None)


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir  # tests/conftest.py: built once a session


def env(items=3):
    task = FunctionTask(
        lambda a, b: [float(len(a[0]) - len(b[0]))],
        lambda item: item["prompt"],
        dataset=[{"prompt": PROMPTS[i % len(PROMPTS)]} for i in range(items)],
        num_agents=2,
        num_turns=1,
    )
    return DialogueEnv(task)


def config(**overrides):
    settings = dict(
        num_agents=2, num_turns=1, num_train_epochs=2, num_generations=4, rollout_buffer_size=1,
        eval_interval=0, early_termination_threshold=None, agent_learning_rate=0.05, progress_bar=False,
        output_dir=None, **{**SETTINGS, "top_p": 1.0},
    )
    settings.update(overrides)
    return MAGRPOConfig(**settings)


def sampled(policy, seed):
    torch.manual_seed(seed)
    return [c.token_ids for group in policy.sample(PROMPTS, 3) for c in group]


def assert_copy_is_current(shadow, model):
    """Every parameter of the sampling copy equals the trained one cast to the copy's dtype."""
    twins = dict(shadow.model.named_parameters())
    stale = [n for n, p in model.named_parameters() if not torch.equal(twins[n], p.detach().to(shadow.dtype))]
    assert not stale, f"sampling copy stale in {len(stale)} parameters, e.g. {stale[:3]}"


def test_a_default_trainer_run_samples_from_its_trained_weights_in_bf16(model_dir):
    """The real defaults: the trainer's own optimizer (fused AdamW) and bf16 sampling with packed
    weights. Fails on the old main: the copy was never refreshed (its stamps missed every step)."""
    policies = [CausalLMPolicy.from_pretrained(model_dir, sample_dtype="bfloat16", **SETTINGS) for _ in range(2)]
    trainer = MAGRPOTrainer(env=env(), policies=policies, args=config())
    assert all(o.defaults.get("fused") for o in trainer.optimizers.values())  # the default under test
    before = sampled(policies[0], 5)
    trainer.train()
    assert trainer.state.global_step >= 4
    after = sampled(policies[0], 5)
    assert after != before  # training changed what is sampled
    sampled(policies[1], 5)
    for policy in policies:  # what just sampled is the trained weights, cast to bf16
        assert_copy_is_current(policy._shadow, policy.model)
    fresh = CausalLMPolicy(policies[0].model, policies[0].tokenizer, sample_dtype="bfloat16", **SETTINGS)
    assert sampled(fresh, 5) == after  # a copy built from the trained weights samples the same


def test_a_lora_team_samples_from_its_trained_adapters_in_bf16(model_dir):
    """Fails on the old main: the copy's lora_B stayed all zeros while the adapters trained."""
    team = LoRATeam.from_pretrained(model_dir, agents=("agent_0", "agent_1"), r=4, alpha=8, sample_dtype="bfloat16", **SETTINGS)
    trainer = MAGRPOTrainer(env=env(), policies=team.policies, args=config(agent_learning_rate=0.2))
    before = sampled(team.policies["agent_0"], 3)
    trainer.train()
    assert sampled(team.policies["agent_0"], 3) != before
    assert_copy_is_current(team._shadow, team.model)
    trained_b = [p for n, p in team._shadow.model.named_parameters() if ".lora_B." in n]
    assert trained_b and all(float(p.abs().max()) > 0 for p in trained_b)


def test_resume_is_exact_with_bf16_sampling(model_dir, tmp_path):
    """Stop and resume equals an uninterrupted run. Fails on the old main: the resumed run's
    loaded weights refreshed the copy, the uninterrupted run's copy stayed stale."""

    def make(output_dir, **overrides):
        team = LoRATeam.from_pretrained(model_dir, agents=("agent_0", "agent_1"), r=4, alpha=8, sample_dtype="bfloat16", **SETTINGS)
        args = config(agent_learning_rate=0.2, output_dir=str(output_dir), save_steps=1, **overrides)
        return MAGRPOTrainer(env=env(), policies=team.policies, args=args)

    full = make(tmp_path / "full")
    full.train()
    first = make(tmp_path / "split", max_steps=3)
    first.train()
    assert 0 < first.state.global_step < full.state.global_step
    resumed = make(tmp_path / "split")
    resumed.train(resume_from_checkpoint=True)
    for agent in full.agents:
        a, b = full.policies[agent].state_dict(), resumed.policies[agent].state_dict()
        assert all(torch.equal(a[n], b[n]) for n in a), agent


def test_any_torch_optimizer_step_refreshes_the_copy(model_dir):
    """A user's own optimizer (here fused AdamW and SGD, stepped outside any trainer) is seen
    through torch's global step hook. Fails on the old main for the fused step."""
    policy = CausalLMPolicy.from_pretrained(model_dir, sample_dtype="bfloat16", **SETTINGS)
    sampled(policy, 0)
    for optimizer in (torch.optim.AdamW(policy.parameters(), lr=0.05, fused=True), torch.optim.SGD(policy.parameters(), lr=0.5)):
        for p in policy.parameters():
            p.grad = torch.ones_like(p)
        optimizer.step()
        policy._sampling_runner()
        assert policy._shadow.refreshed == len(list(policy.parameters()))
        assert_copy_is_current(policy._shadow, policy.model)


def test_a_broadcast_refreshes_the_copy(model_dir, monkeypatch):
    """``broadcast_parameters`` writes through ``p.data`` (no ``_version`` bump): on ranks other
    than 0 a copy built before ``train()`` kept the rank's own initial weights. Fails on the old main."""
    import llm_marl.runs.distributed as distributed

    policy = CausalLMPolicy.from_pretrained(model_dir, sample_dtype="bfloat16", **SETTINGS)
    sampled(policy, 0)
    monkeypatch.setattr(distributed.dist, "broadcast", lambda tensor, src: tensor.add_(0.25))  # rank 0's values
    versions = [p._version for p in policy.parameters()]
    DistributedContext(rank=1, world_size=2).broadcast_parameters(list(policy.parameters()))
    assert [p._version for p in policy.parameters()] == versions  # torch's counter saw nothing
    policy._sampling_runner()
    assert_copy_is_current(policy._shadow, policy.model)


def test_a_held_pack_is_made_again_after_a_change_notice():
    """A frozen weight written through ``.data`` (no ``_version`` bump) and announced with
    ``weights_changed`` is packed again; without the notice the old pack would be used."""
    layer = torch.nn.Linear(64, 64).to(torch.bfloat16).requires_grad_(False)
    packs = PackedLinears(layer)
    if not packs.layers():
        pytest.skip("no packed bf16 kernel in this torch build")
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    with packs.active(4, 16):
        layer(x)
    assert packs.held_weights() == 1
    layer.weight.data.copy_(torch.randn(64, 64))
    before = last_change(layer.weight)
    weights_changed([layer.weight])
    assert last_change(layer.weight) > before
    with packs.active(4, 16):
        out = layer(x)
    assert packs.packed_last == 1
    assert torch.equal(out, torch.nn.functional.linear(x, layer.weight, layer.bias))

"""bf16 sampling with exact scoring (``sample_dtype``): the decode loop runs on a bfloat16 copy of
the weights, refreshed whenever the weights changed, while the log-probs the loss uses come from
the float32 model itself, exactly as without the setting."""

from __future__ import annotations

import copy

import pytest
import torch

from llm_marl.learners import MAGRPOConfig
from llm_marl.policies import CausalLMPolicy, LoRATeam
from llm_marl.policies.lora_team import team_options
from llm_marl.policies.tiny import load_tiny

torch.set_num_threads(1)

PROMPTS = ["The assert statement", "A", "If the module being imported is not a top level module,", "x = 1"]
SETTINGS = dict(max_new_tokens=8, temperature=1.0, top_p=None, top_k=None)


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir  # tests/conftest.py: built once a session


def flat(groups):
    return [c for group in groups for c in group]


def observations(k):
    return [p for p in PROMPTS for _ in range(k)]


def bf16_params_copy(model):
    """A reference sampler: the model with its parameters (not buffers) cast to bfloat16."""
    other = copy.deepcopy(model)
    for p in other.parameters():
        p.data = p.data.to(torch.bfloat16)
    return other


def sampled(policy, seed, k=3):
    torch.manual_seed(seed)
    return [c.token_ids for c in flat(policy.sample(PROMPTS, k))]


def train_step(policy, lr=0.5):
    """One AdamW step that moves every weight (a loss on the policy's own log-probs)."""
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr)
    torch.manual_seed(1)
    completions = flat(policy.sample(PROMPTS, 2))
    loss = -policy.log_probs(observations(2), completions).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def test_bf16_sampled_answers_are_scored_exactly_by_the_fp32_model():
    # Planted bug caught: scoring through the bf16 copy (token_log_probs using _sampling_runner()).
    model, tokenizer = load_tiny()
    bf16 = CausalLMPolicy(model, tokenizer, sample_dtype="bfloat16", **SETTINGS)
    plain = CausalLMPolicy(model, tokenizer, **SETTINGS)
    torch.manual_seed(0)
    completions = flat(bf16.sample(PROMPTS, 3))
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the model itself is untouched
    values, mask = bf16.token_log_probs(observations(3), completions)
    expected, expected_mask = plain.token_log_probs(observations(3), completions)
    assert torch.equal(values, expected) and torch.equal(mask, expected_mask)
    assert values.dtype == torch.float32 and values.requires_grad
    # The copy costs half the fp32 weights (the tied lm head once).
    assert bf16._shadow.nbytes() * 2 == sum(p.numel() * p.element_size() for p in model.parameters())


def test_tokens_are_drawn_from_the_bf16_weights():
    # Planted bug caught: sample_dtype ignored (the decode loop on the fp32 runner).
    model, tokenizer = load_tiny()
    bf16 = CausalLMPolicy(model, tokenizer, sample_dtype="bfloat16", **SETTINGS)
    reference = CausalLMPolicy(bf16_params_copy(model), tokenizer, **SETTINGS)
    plain = CausalLMPolicy(model, tokenizer, **SETTINGS)
    assert sampled(bf16, 5) == sampled(reference, 5)
    assert sampled(plain, 5) != sampled(reference, 5)  # the test can tell fp32 sampling apart


def test_a_forward_wrapped_on_the_model_instance_does_not_lead_the_copy_back_to_fp32():
    # Planted bug caught: keeping instance-level forwards in the copy (deepcopy shares the
    # wrapper function, whose closure calls the fp32 model: fp32 sampling, silently).
    model, tokenizer = load_tiny()
    reference = CausalLMPolicy(bf16_params_copy(model), tokenizer, **SETTINGS)
    calls = []
    inner = model.forward
    model.forward = lambda *args, **kwargs: calls.append(1) or inner(*args, **kwargs)
    bf16 = CausalLMPolicy(model, tokenizer, sample_dtype="bfloat16", **SETTINGS)
    assert sampled(bf16, 5) == sampled(reference, 5)
    assert not calls  # the fp32 model did not run while sampling


def test_the_copy_is_refreshed_after_an_optimizer_step():
    # Planted bug caught: never refreshing (LowPrecisionShadow.current not copying changed weights).
    model, tokenizer = load_tiny()
    bf16 = CausalLMPolicy(model, tokenizer, sample_dtype="bfloat16", **SETTINGS)
    stale = CausalLMPolicy(bf16_params_copy(model), tokenizer, **SETTINGS)
    sampled(bf16, 0)  # builds the copy
    train_step(bf16)
    fresh = CausalLMPolicy(bf16_params_copy(model), tokenizer, **SETTINGS)
    assert sampled(bf16, 7) == sampled(fresh, 7)
    assert sampled(stale, 7) != sampled(fresh, 7)  # the step changed what is sampled
    twins = dict(bf16._shadow.model.named_parameters())
    assert all(torch.equal(twins[n], p.detach().to(torch.bfloat16)) for n, p in model.named_parameters())
    # A load_state_dict counts as a change too; an unchanged model copies nothing.
    bf16._sampling_runner()
    assert bf16._shadow.refreshed == 0
    model.load_state_dict(stale.model.state_dict())
    bf16._sampling_runner()
    assert bf16._shadow.refreshed > 0


def test_seeds_reproduce_with_bf16_sampling():
    # Planted bug caught: any use of the global RNG while building the copy (e.g. a torch.rand()
    # in LowPrecisionShadow._build) shifts the first call's stream and not the second's.
    model, tokenizer = load_tiny()
    first = CausalLMPolicy(model, tokenizer, sample_dtype="bfloat16", **SETTINGS)
    again = sampled(first, 11)
    assert sampled(first, 11) == again
    other = CausalLMPolicy(model, tokenizer, sample_dtype="bfloat16", **SETTINGS)
    assert sampled(other, 11) == again


def test_sample_dtype_is_checked_saved_and_a_no_op_at_the_models_dtype(tmp_path):
    model, tokenizer = load_tiny()
    with pytest.raises(ValueError, match="sample_dtype"):
        CausalLMPolicy(model, tokenizer, sample_dtype="bf16")
    with pytest.raises(ValueError, match="sample_dtype"):
        MAGRPOConfig(sample_dtype="half")
    same = CausalLMPolicy(model, tokenizer, sample_dtype="float32", **SETTINGS)
    assert same._sampling_runner() is same.runner and same._shadow is None
    policy = CausalLMPolicy(model, tokenizer, sample_dtype="bfloat16", **SETTINGS)
    policy.save_pretrained(tmp_path / "saved")
    assert CausalLMPolicy.from_pretrained(tmp_path / "saved").sample_dtype == "bfloat16"
    args = MAGRPOConfig(lora_r=4, sample_dtype="bfloat16")
    assert team_options(args)["sample_dtype"] == "bfloat16"


def perturbed_team(model_dir, **settings):
    team = LoRATeam.from_pretrained(model_dir, agents=("red", "blue"), r=4, alpha=8, **{**SETTINGS, **settings})
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in team.model.named_parameters():
            if "lora_" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=generator))
    return team


def team_sampled(team, seed):
    torch.manual_seed(seed)
    answers = team.sample({"red": PROMPTS, "blue": PROMPTS[:2]}, 2)
    return {agent: [c.token_ids for c in flat(groups)] for agent, groups in answers.items()}


def test_a_team_samples_in_bf16_scores_exactly_and_refreshes_only_the_adapters(model_dir):
    # Planted bugs caught: scoring the team through its bf16 copy; never refreshing the copy.
    team = perturbed_team(model_dir, sample_dtype="bfloat16")
    plain = perturbed_team(model_dir)
    answers = team.sample({"red": PROMPTS, "blue": PROMPTS[:2]}, 2)
    requests = {"red": (observations(2), flat(answers["red"])), "blue": (observations(2)[:4], flat(answers["blue"]))}
    got, expected = team.log_probs(requests), plain.log_probs(requests)
    assert all(torch.equal(got[a], expected[a]) for a in requests)
    shadow = team._shadow
    assert shadow is not None and all(p.dtype == torch.bfloat16 for p in shadow.model.parameters())
    assert sum(1 for n, _ in team.model.named_parameters() if "lora_" not in n) > 0
    # An optimizer step on agent red's adapter: the next sampling call copies its parameters only.
    policy = team.policies["red"]
    optimizer = torch.optim.AdamW(policy.parameters(), lr=0.5)
    (-team.log_probs({"red": requests["red"]})["red"].sum()).backward()
    optimizer.step()
    before_step = team_sampled(plain, 3)  # plain has red's old adapter
    now = team_sampled(team, 3)
    assert shadow.refreshed == len(list(policy.parameters())) and shadow.rebuilds == 1
    fresh = perturbed_team(model_dir, sample_dtype="bfloat16")
    fresh.policies["red"].load_state_dict(policy.state_dict())
    expected_now = team_sampled(fresh, 3)
    assert now == expected_now
    stale = perturbed_team(model_dir, sample_dtype="bfloat16")
    assert team_sampled(stale, 3) != expected_now  # the step changed what is sampled
    assert before_step != now


def test_the_drop_in_constructor_gives_an_adapter_team_its_bf16_sampler(model_dir):
    # Planted bug caught: team_options not passing sample_dtype (the team samples in fp32).
    from datasets import Dataset
    from transformers import AutoTokenizer

    from llm_marl.learners import MAGRPOTrainer

    args = MAGRPOConfig(
        num_agents=2, num_turns=1, num_generations=2, num_train_epochs=1, max_new_tokens=4, temperature=1.0, top_p=1.0,
        top_k=None, early_termination_threshold=None, eval_interval=0, rollout_buffer_size=2, progress_bar=False,
        output_dir=None, lora_r=4, lora_alpha=8.0, sample_dtype="bfloat16",
    )
    trainer = MAGRPOTrainer(
        agent_model=str(model_dir), tokenizer=AutoTokenizer.from_pretrained(str(model_dir)),
        reward_func=lambda a, b: [float(len(a[0]) + len(b[0]))], formatters=lambda item: item["prompt"],
        train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS[:2]]), args=args,
    )
    trainer.train()
    team = next(iter(trainer.policies.values())).team
    assert all(p.sample_dtype == "bfloat16" for p in trainer.policies.values())
    assert team._shadow is not None and team._shadow.dtype == torch.bfloat16


def test_the_drop_in_constructor_gives_full_models_their_bf16_sampler(model_dir):
    # Planted bug caught: _full_models not passing args.sample_dtype (each agent samples in fp32).
    from llm_marl.learners import MAGRPOTrainer

    args = MAGRPOConfig(
        num_agents=2, num_turns=1, num_generations=2, num_train_epochs=1, max_new_tokens=4, temperature=1.0, top_p=1.0,
        top_k=None, early_termination_threshold=None, eval_interval=0, rollout_buffer_size=2, progress_bar=False,
        sample_dtype="bfloat16",
    )
    trainer = MAGRPOTrainer(agent_model=str(model_dir), reward_func=lambda a, b: [float(len(a[0]) + len(b[0]))],
                            formatters=lambda item: item["prompt"], train_dataset=[{"prompt": p} for p in PROMPTS[:2]], args=args)
    assert [p.sample_dtype for p in trainer.policies.values()] == ["bfloat16", "bfloat16"]
    trainer.train()
    assert trainer.state.global_step >= 1


def test_the_cli_gives_full_models_their_bf16_sampler():
    # Planted bug caught: sample_dtype missing from policy_options (the flag silently ignored).
    from llm_marl.cli import build_trainer

    trainer = build_trainer({"env": "WritingCollab-v0", "policy": "lm", "model": "tiny", "num_turns": 1, "max_new_tokens": 4,
                             "progress_bar": False, "train_items": 2, "sample_dtype": "bfloat16"})
    assert [p.sample_dtype for p in trainer.policies.values()] == ["bfloat16", "bfloat16"]

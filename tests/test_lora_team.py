"""Agents as LoRA adapters on one frozen base (LoRATeam): one decode loop and one scoring
forward for the whole team, row for row what each agent gets alone; only adapters train; the
reference is the base itself; save/load and resume are exact."""

from __future__ import annotations

import pytest
import torch

from llm_marl.envs.dialogue import DialogueEnv
from llm_marl.learners import (
    MAGRPOConfig,
    MAGRPOTrainer,
    MAREINFORCETrainer,
    MARLOOTrainer,
    MAReMaxTrainer,
)
from llm_marl.advantages import k3_kl
from llm_marl.learners.tree import grow_trees
from llm_marl.policies import AdapterPolicy, CausalLMPolicy, LoRATeam, Policy
from llm_marl.tasks.function_task import FunctionTask
from resumed import uninterrupted_and_resumed

torch.set_num_threads(1)

PROMPTS = ["The assert statement", "A", "If the module being imported is not a top level module,"]
AGENTS = ("agent_0", "agent_1", "agent_2")


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir  # tests/conftest.py: built once a session


def team_of(model_dir, agents=AGENTS, **settings):
    settings.setdefault("max_new_tokens", 8)
    settings.setdefault("temperature", 1.0)
    settings.setdefault("top_p", None)
    settings.setdefault("top_k", None)
    return LoRATeam.from_pretrained(model_dir, agents=agents, r=4, alpha=8, **settings)


def assert_same_gradient(actual, expected, name):
    """Equal up to the float rounding of differently shaped batches: within ~1e-6 of the
    gradient's largest entry (a wrong route or a lost chunk is off by the entry's own size)."""
    scale = float(expected.abs().max())
    torch.testing.assert_close(actual, expected, atol=1e-5 + 2e-6 * scale, rtol=1e-4, msg=name)


def perturb(team, scale=0.3, seed=0):
    """Give every adapter different non-zero weights (peft starts lora_B at 0: all agents equal)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in team.model.named_parameters():
            if "lora_" in name:
                p.copy_(scale * torch.randn(p.shape, generator=generator))


def flat(groups):
    return [c for group in groups for c in group]


def base_state(team):
    return {n: p.detach().clone() for n, p in team.model.named_parameters() if "lora_" not in n}


def adapter_state(policy):
    return {n: p.detach().clone() for n, p in policy.named_parameters()}


def test_a_team_is_adapters_on_one_frozen_base(model_dir):
    team = team_of(model_dir)
    assert set(team.policies) == set(AGENTS)
    seen = set()
    for agent, policy in team.policies.items():
        assert isinstance(policy, Policy) and isinstance(policy, AdapterPolicy) and policy.model is team.model
        names = [n for n, _ in policy.named_parameters()]
        assert len(names) == 4 and all(f".lora_A.{agent}." in n or f".lora_B.{agent}." in n for n in names)  # 2 layers x A, B
        assert all(p.requires_grad for p in policy.parameters())
        ids = {id(p) for p in policy.parameters()}
        assert not ids & seen
        seen |= ids
    assert all(not p.requires_grad for n, p in team.model.named_parameters() if "lora_" not in n)
    assert team.policies["agent_1"].max_new_tokens == 8  # the CausalLMPolicy settings reach every agent
    with pytest.raises(ValueError, match="lora_r"):
        LoRATeam.from_pretrained(model_dir, agents=("x0", "x1"), r=0)
    with pytest.raises(ValueError, match="distinct"):
        LoRATeam.from_pretrained(model_dir, agents=("x0", "x0"))


def test_team_sampling_is_one_decode_loop_with_each_agents_own_distribution(model_dir, monkeypatch, tmp_path):
    """Every step of the team's loop (agents' rows side by side, heterogeneous prompts) sees, row
    by row and token by token, the distribution its agent alone gives the same tokens (scored
    by a plain peft model loaded from the saved adapter: independent of the team's routing)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    team = team_of(model_dir, max_new_tokens=6, temperature=0.8, top_k=30, top_p=0.95)
    perturb(team)
    team.save_pretrained(tmp_path / "team")
    lead = team.policies[AGENTS[0]]
    seen, forwards = [], []
    original = lead._draw

    def recording(logits, ban_eos=False):
        seen.append(torch.log_softmax(logits.float() / lead.temperature, dim=-1))
        return original(logits, ban_eos)

    monkeypatch.setattr(lead, "_draw", recording)
    hook = team.model.get_base_model().transformer.register_forward_hook(lambda *a: forwards.append(1))
    requests = {"agent_0": PROMPTS, "agent_1": PROMPTS[::-1], "agent_2": PROMPTS[:1]}
    torch.manual_seed(4)
    answers = team.sample(requests, 3)
    hook.remove()
    assert len(forwards) <= 6  # one loop for the whole team: a prefill and at most 5 more steps
    row = 0
    for agent, observations in requests.items():
        groups = answers[agent]
        assert len(groups) == len(observations) and all(len(g) == 3 for g in groups)
        alone = CausalLMPolicy(
            PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), tmp_path / "team" / agent),
            team.tokenizer,
            temperature=0.8,
        )
        completions = flat(groups)
        with torch.no_grad():
            values, mask = alone.token_log_probs([o for o in observations for _ in range(3)], completions)
        for r, c in enumerate(completions):
            for t, token in enumerate(c.token_ids):
                assert mask[r, t]
                assert values[r, t].item() == pytest.approx(seen[t][row + r, token].item(), abs=1e-4), (agent, r, t)
        row += len(completions)
    # the agents really differ: a routing mix-up could not pass the check above
    assert not torch.allclose(seen[0][0], seen[0][18], atol=1e-3)  # agent_0 and agent_2 on PROMPTS[0]


def test_the_tree_asks_a_team_once_per_depth(model_dir, monkeypatch):
    team = team_of(model_dir, agents=AGENTS[:2], max_new_tokens=4)
    calls = []
    original = team.sample
    monkeypatch.setattr(team, "sample", lambda requests, n: calls.append(sorted(requests)) or original(requests, n))
    for policy in team.policies.values():
        monkeypatch.setattr(policy, "sample", lambda *a, **k: pytest.fail("a team member was asked alone"))
    roots = grow_trees(multi_turn_env(), team.policies, [0, 1], num_samples=2, num_turns=2)
    assert calls == [list(AGENTS[:2])] * 2  # depth 0 and depth 1
    assert all(len(root.completions["agent_1"]) == 2 for root in roots)


def test_one_forward_scoring_equals_per_agent_scoring_with_gradients(model_dir):
    team = team_of(model_dir, max_new_tokens=8)
    perturb(team, seed=1)
    torch.manual_seed(2)
    requests = {}
    for i, agent in enumerate(AGENTS):
        observations = PROMPTS[i:] + PROMPTS[:i]
        completions = flat(team.policies[agent].sample(observations, 2))
        requests[agent] = ([o for o in observations for _ in range(2)], completions)

    def weighted(values):
        return (values * torch.linspace(-1, 1, values.numel()).view_as(values)).sum()

    team.model.zero_grad()
    together = team.token_log_probs(requests)
    sum(weighted(v) for v, _ in together.values()).backward()
    joint = {a: {n: p.grad.clone() for n, p in team.policies[a].named_parameters()} for a in AGENTS}
    assert all(p.grad is None for n, p in team.model.named_parameters() if "lora_" not in n)
    for agent in AGENTS:
        team.model.zero_grad()
        values, mask = team.policies[agent].token_log_probs(*requests[agent])
        weighted(values).backward()
        torch.testing.assert_close(together[agent][0].detach(), values.detach(), atol=1e-5, rtol=0)
        assert torch.equal(together[agent][1], mask)
        for name, p in team.policies[agent].named_parameters():
            assert_same_gradient(joint[agent][name], p.grad, name)
        others = [q.grad for a in AGENTS if a != agent for q in team.policies[a].parameters()]
        assert all(g is None or not g.any() for g in others)  # an agent's loss reaches only its adapter
    sums = team.log_probs(requests)
    torch.testing.assert_close(sums["agent_1"], together["agent_1"][0].sum(-1))


def test_env_agents_are_routed_to_their_policys_adapter_whatever_the_names(model_dir):
    """The team is asked by adapter, not by env agent name: adapters named otherwise than the
    env's agents, or handed to the agents in another order, sample and score each agent's rows
    through that agent's own adapter (as the policy alone does); one adapter for two agents raises."""
    from llm_marl.learners.buffer import Sample
    from llm_marl.learners.reinforce.trainer import _score_batches
    from llm_marl.learners.tree import sample_agents

    team = team_of(model_dir, agents=("writer", "editor"), max_new_tokens=5)
    perturb(team, seed=5)
    policies = {"agent_0": team.policies["editor"], "agent_1": team.policies["writer"]}
    observations = {"agent_0": PROMPTS[:2], "agent_1": PROMPTS[1:]}
    asked = []
    original = team.sample
    team.sample = lambda requests, n: asked.append({k: list(v) for k, v in requests.items()}) or original(requests, n)
    torch.manual_seed(0)
    answers = sample_agents(policies, observations, 2, {a: [None] * len(o) for a, o in observations.items()})
    assert asked == [{"editor": PROMPTS[:2], "writer": PROMPTS[1:]}]
    batches = {
        agent: [Sample(agent=agent, index=i, turn=1, observation=o, completions=group, returns=[0.0, 0.0], advantages=[1.0, -1.0])
                for i, (o, group) in enumerate(zip(observations[agent], answers[agent]))]
        for agent in policies
    }
    with torch.no_grad():
        together = _score_batches(policies, batches, "sum")
        for agent, policy in policies.items():
            alone = policy.log_probs([s.observation for s in batches[agent] for _ in s.completions],
                                     [c for s in batches[agent] for c in s.completions])
            torch.testing.assert_close(together[agent], alone, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="same team member 'editor'"):
        sample_agents({"agent_0": team.policies["editor"], "agent_1": team.policies["editor"]}, observations, 1,
                      {a: [None] * len(o) for a, o in observations.items()})


def test_reference_is_the_base_and_an_untrained_adapter_has_kl_exactly_zero(model_dir):
    team = team_of(model_dir, agents=AGENTS[:2])
    trainer = MAGRPOTrainer(env=multi_turn_env(), policies=team.policies, args=config(reference_kl_enabled=True))
    for agent, reference in trainer.reference_policies.items():
        assert reference.model is team.model and list(reference.parameters()) == []  # no frozen copy
    torch.manual_seed(0)
    completions = flat(team.policies["agent_0"].sample(PROMPTS, 3))
    observations = [p for p in PROMPTS for _ in range(3)]
    assert trainer._kl_penalty("agent_0", observations, completions) == [0.0] * len(completions)
    # the reference scores like the plain base model
    plain = CausalLMPolicy.from_pretrained(model_dir, temperature=1.0)
    with torch.no_grad():
        torch.testing.assert_close(
            trainer.reference_policies["agent_0"].log_probs(observations, completions),
            plain.log_probs(observations, completions),
            atol=1e-4,
            rtol=0,
        )
    perturb(team, scale=0.05)
    kl = trainer._kl_penalty("agent_0", observations, completions)
    assert all(value > 0 for value in kl)
    with torch.no_grad():
        mine, mask = team.policies["agent_0"].token_log_probs(observations, completions)
        base, _ = plain.token_log_probs(observations, completions)
    torch.testing.assert_close(torch.tensor(kl), k3_kl(mine, base, mask), atol=1e-4, rtol=1e-4)


# --- training through the learners ---------------------------------------------------------------


def reward(*answers):
    return [float(sum(len(a[0]) for a in answers)) / 40.0]


def transition(prompt, agent_completions, **kwargs):
    return [prompt + " " + text[:20] for text in agent_completions]


def multi_turn_env(num_agents=2, num_turns=2):
    task = FunctionTask(
        reward,
        lambda item: item["prompt"],
        transition,
        [{"prompt": p} for p in PROMPTS],
        num_agents=num_agents,
        num_turns=num_turns,
    )
    return DialogueEnv(task)


def config(**overrides):
    settings = dict(
        num_agents=2, num_turns=2, num_generations=2, num_train_epochs=1, agent_learning_rate=1e-2,
        max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=None, early_termination_threshold=None,
        eval_interval=0, logging_steps=1, rollout_buffer_size=2, progress_bar=False, seed=3,
    )
    settings.update(overrides)
    return MAGRPOConfig(**settings)


@pytest.mark.parametrize("trainer_class", [MAGRPOTrainer, MAREINFORCETrainer, MARLOOTrainer, MAReMaxTrainer])
@pytest.mark.parametrize("joint_mode,num_turns", [("aligned", 1), ("cross", 2)])
def test_a_team_trains_through_every_learner_and_only_adapters_change(model_dir, trainer_class, joint_mode, num_turns):
    team = team_of(model_dir, agents=AGENTS[:2], max_new_tokens=4)
    args = trainer_class.config_class(**{**config(num_turns=num_turns, joint_mode=joint_mode).to_dict(), "advantage_mode": trainer_class.config_class.advantage_mode})
    trainer = trainer_class(env=multi_turn_env(num_turns=num_turns), policies=team.policies, args=args)
    base_before = base_state(team)
    adapters_before = {a: adapter_state(p) for a, p in team.policies.items()}
    scored = []
    original = team.log_probs
    team.log_probs = lambda requests, reduction="sum": scored.append(sorted(requests)) or original(requests, reduction)
    trainer.train()
    assert trainer.state.global_step >= 2
    assert scored and all(agents == list(AGENTS[:2]) for agents in scored)  # one forward for both agents
    assert all(torch.equal(base_before[n], p) for n, p in team.model.named_parameters() if "lora_" not in n)
    history = dict(trainer.logger.history)
    for agent, policy in team.policies.items():
        after = adapter_state(policy)
        assert all(not torch.equal(adapters_before[agent][n], after[n]) for n in after), agent  # A and B moved
        losses = [row[f"train/{agent}/loss"] for row in history.values() if f"train/{agent}/loss" in row]
        assert losses and all(torch.isfinite(torch.tensor(losses)))


@pytest.mark.parametrize("learner", ["iac", "maac"])
def test_a_team_trains_through_the_actor_critic_learners(model_dir, learner):
    """Actor-critic learners (their own loss: agents scored one by one) sample the team once per
    depth, train every adapter and leave the base untouched."""
    from llm_marl.learners import IACConfig, IACTrainer, MAACConfig, MAACTrainer
    from llm_marl.policies import TabularCritic

    team = team_of(model_dir, agents=AGENTS[:2], max_new_tokens=4)
    config_class, trainer_class = (IACConfig, IACTrainer) if learner == "iac" else (MAACConfig, MAACTrainer)
    args = config_class(**{**config().to_dict(), "critic_learning_rate": 0.1})
    critics = [TabularCritic(), TabularCritic()] if learner == "iac" else TabularCritic(num_outputs=2)
    trainer = trainer_class(env=multi_turn_env(), policies=team.policies, critics=critics, args=args)
    base_before = base_state(team)
    adapters_before = {a: adapter_state(p) for a, p in team.policies.items()}
    calls = []
    original = team.sample
    team.sample = lambda requests, n: calls.append(sorted(requests)) or original(requests, n)
    trainer.train()
    assert trainer.state.global_step >= 1 and calls and all(c == list(AGENTS[:2]) for c in calls)
    assert all(torch.equal(base_before[n], p) for n, p in team.model.named_parameters() if "lora_" not in n)
    for agent, policy in team.policies.items():
        after = adapter_state(policy)
        assert any(not torch.equal(adapters_before[agent][n], after[n]) for n in after), agent


def test_save_load_gives_identical_samples_under_a_seed(model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    team = team_of(model_dir, agents=AGENTS[:2])
    perturb(team, seed=5)
    path = team.save_pretrained(tmp_path / "team")
    assert sorted(p.name for p in path.iterdir() if p.is_dir()) == list(AGENTS[:2])
    assert (path / "agent_1" / "adapter_config.json").is_file()
    requests = {"agent_0": PROMPTS, "agent_1": PROMPTS[1:]}
    torch.manual_seed(9)
    before = team.sample(requests, 2)
    loaded = LoRATeam.from_pretrained(model_dir, agents=AGENTS[:2], adapters=path)
    assert loaded.policies["agent_0"].max_new_tokens == 8  # the saved settings come back
    torch.manual_seed(9)
    assert loaded.sample(requests, 2) == before
    # peft's own loader reads an agent's folder; as a plain policy it samples what the agent samples
    plain = CausalLMPolicy(
        PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), path / "agent_1"),
        team.tokenizer, max_new_tokens=8, temperature=1.0, top_p=None, top_k=None,
    )
    torch.manual_seed(9)
    mine = team.policies["agent_1"].sample(PROMPTS, 2)
    torch.manual_seed(9)
    assert plain.sample(PROMPTS, 2) == mine
    with pytest.raises(FileNotFoundError, match="agent_7"):
        LoRATeam.from_pretrained(model_dir, agents=("agent_0", "agent_7"), adapters=path)


def test_resume_is_exact_for_adapters_and_their_optimizers(model_dir, tmp_path):
    def make(output_dir, **overrides):
        team = team_of(model_dir, agents=AGENTS[:2], max_new_tokens=4)
        args = config(output_dir=str(output_dir), save_steps=1, num_train_epochs=2, reference_kl_enabled=True, **overrides)
        return MAGRPOTrainer(env=multi_turn_env(), policies=team.policies, args=args)

    full, resumed = uninterrupted_and_resumed(make, tmp_path, max_steps=2)
    for agent in AGENTS[:2]:
        a, b = full.policies[agent].state_dict(), resumed.policies[agent].state_dict()
        assert set(a) == set(b) and all(torch.equal(a[n], b[n]) for n in a), agent
        sa, sb = full.optimizers[agent].state_dict()["state"], resumed.optimizers[agent].state_dict()["state"]
        assert all(torch.equal(sa[k]["exp_avg"], sb[k]["exp_avg"]) for k in sa)


# --- memory options --------------------------------------------------------------------------------


def saved_bytes(fn):
    """Bytes of the tensors autograd keeps for the backward pass while ``fn`` runs."""
    total = []

    def pack(tensor):
        total.append(tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(total)


def test_gradient_checkpointing_gives_the_same_scores_and_gradients_with_less_saved(model_dir):
    def run(checkpointing):
        team = team_of(model_dir, agents=AGENTS[:2], gradient_checkpointing=checkpointing)
        perturb(team, seed=2)
        torch.manual_seed(1)
        requests = {a: ([p for p in PROMPTS for _ in range(2)], flat(team.policies[a].sample(PROMPTS, 2))) for a in AGENTS[:2]}
        values = team.log_probs(requests)
        sum(v.sum() for v in values.values()).backward()
        grads = {n: p.grad.clone() for n, p in team.model.named_parameters() if p.grad is not None}
        # what the layers keep for the backward pass (logits aside): 4 rows of 48 tokens
        ids = torch.randint(1, 1000, (4, 48), generator=torch.Generator().manual_seed(0))
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "logits_to_keep": 1}
        _, saved = saved_bytes(lambda: team.runner.forward(inputs, ["agent_0"] * 2 + ["agent_1"] * 2))
        return values, saved, grads

    plain, plain_saved, plain_grads = run(False)
    ckpt, ckpt_saved, ckpt_grads = run(True)
    for agent in plain:
        torch.testing.assert_close(ckpt[agent].detach(), plain[agent].detach(), atol=1e-5, rtol=0)
    assert set(ckpt_grads) == set(plain_grads) and len(plain_grads) == 8
    for name in plain_grads:
        assert_same_gradient(ckpt_grads[name], plain_grads[name], name)
    assert ckpt_saved < plain_saved / 2


@pytest.mark.parametrize("chunking", [{"max_batch_size": 4}, {"max_batch_size": 5}, {"max_batch_tokens": 120}],
                         ids=["equal-chunks", "unequal-chunks", "token-chunks"])
def test_gradient_checkpointing_with_chunked_scoring_gives_the_gradients_of_one_pass(model_dir, chunking):
    """Issue 22.2: when scoring splits a team's rows into several forwards, each chunk's backward
    recompute runs its own rows through their own adapters (before the fix it used the last
    chunk's routing: unequal chunks crashed, equal ones gave wrong adapter gradients)."""
    sampler = team_of(model_dir)
    perturb(sampler, seed=3)
    torch.manual_seed(4)
    requests = {a: ([p for p in PROMPTS for _ in range(2)], flat(sampler.policies[a].sample(PROMPTS, 2))) for a in AGENTS}

    def gradients(checkpointing, **settings):
        team = team_of(model_dir, gradient_checkpointing=checkpointing, **settings)
        perturb(team, seed=3)
        values = team.log_probs(requests)
        sum(v.sum() * (i + 1) for i, v in enumerate(values.values())).backward()
        return {n: p.grad.clone() for n, p in team.model.named_parameters() if p.grad is not None}

    reference = gradients(False)
    chunked = gradients(True, **chunking)
    assert set(chunked) == set(reference) and len(reference) == 12  # 3 adapters x 2 layers x A, B
    for name in reference:
        assert_same_gradient(chunked[name], reference[name], name)


def test_bfloat16_base_keeps_float32_adapters_and_close_scores(model_dir):
    plain = team_of(model_dir, agents=AGENTS[:2])
    half = team_of(model_dir, agents=AGENTS[:2], dtype="bfloat16")
    weights = {n: p.dtype for n, p in half.model.named_parameters()}
    assert all(d == torch.bfloat16 for n, d in weights.items() if "lora_" not in n)
    assert all(d == torch.float32 for n, d in weights.items() if "lora_" in n)
    torch.manual_seed(1)
    completions = flat(plain.policies["agent_0"].sample(PROMPTS, 2))
    observations = [p for p in PROMPTS for _ in range(2)]
    values, mask = half.policies["agent_0"].token_log_probs(observations, completions)
    reference, _ = plain.policies["agent_0"].token_log_probs(observations, completions)
    assert values.dtype == torch.float32
    assert (values - reference).abs()[mask].mean() < 0.1  # bfloat16 rounding, not a different model
    values.sum().backward()
    assert all(p.grad is not None for p in half.policies["agent_0"].parameters())
    with pytest.raises(ValueError, match="dtype"):
        team_of(model_dir, dtype="bfloat17")


# --- drop-in constructor, config and CLI ----------------------------------------------------------


def test_config_fields_build_a_team_in_the_drop_in_constructor_and_the_cli(model_dir):
    from llm_marl.cli import _run_options, build_trainer, parser

    args = config(lora_r=4, lora_alpha=8.0, lora_target_modules="c_attn", num_turns=1)
    assert args.lora_target_modules == ["c_attn"]
    trainer = MAGRPOTrainer(
        agent_model=str(model_dir),
        reward_func=lambda a, b: [float(len(a[0]))],
        formatters=lambda item: item["prompt"],
        train_dataset=[{"prompt": p} for p in PROMPTS],
        args=args,
    )
    policies = list(trainer.policies.values())
    assert all(isinstance(p, AdapterPolicy) for p in policies) and policies[0].team is policies[1].team
    assert policies[0].max_new_tokens == 4 and policies[0].team.model.peft_config["agent_0"].r == 4
    with pytest.raises(ValueError, match="agent_model"):
        MAGRPOTrainer(agents=[str(model_dir)] * 2, reward_func=lambda a, b: [0.0], train_dataset=[{"prompt": "x"}], args=args)
    with pytest.raises(ValueError, match="lora_r"):
        MAGRPOConfig(lora_r=0)
    with pytest.raises(ValueError, match="model_dtype"):
        MAGRPOConfig(model_dtype="int3")

    options, _ = _run_options(parser().parse_args(["train", "--lora_r", "8", "--lora-target-modules", "c_attn,c_fc"]), True)
    assert options["lora_r"] == 8 and MAGRPOConfig(lora_target_modules=options["lora_target_modules"]).lora_target_modules == ["c_attn", "c_fc"]
    built = build_trainer(
        {"env": "WritingCollab-v0", "policy": "lm", "model": str(model_dir), "lora_r": 2, "num_turns": 1,
         "max_new_tokens": 4, "progress_bar": False, "train_items": 2}
    )
    team = next(iter(built.policies.values())).team
    assert set(team.agents) == set(built.agents) and team.model.peft_config[built.agents[0]].r == 2


def test_a_team_runs_final_folder_continues_as_a_team_from_the_cli(model_dir, tmp_path, capsys):
    """``--model run/final`` of a team run (``final/agent_i`` are adapters): the next run is the
    same team on the same base, its adapters as saved and trainable, with or without --lora_r."""
    from llm_marl.cli import build_trainer

    options = {"env": "WritingCollab-v0", "policy": "lm", "model": str(model_dir), "lora_r": 2, "num_turns": 1,
               "max_new_tokens": 4, "progress_bar": False, "train_items": 2, "agent_learning_rate": 0.05}
    first = build_trainer({**options, "num_train_epochs": 1})  # a step moves the adapters: not MAGRPO's default 20 epochs
    first.train()
    first.save_model(str(tmp_path / "final"))
    trained = {a: adapter_state(p) for a, p in first.policies.items()}
    assert all(any(v.abs().max() > 0 for n, v in state.items() if "lora_B" in n) for state in trained.values())  # trained: B left zero
    for lora_r in (None, 8):
        again = build_trainer({**options, "model": str(tmp_path / "final"), "lora_r": lora_r})
        assert "training continues them" in capsys.readouterr().out
        team = next(iter(again.policies.values())).team
        assert set(team.agents) == set(again.agents) and team.model.peft_config[again.agents[0]].r == 2  # as saved
        for agent, policy in again.policies.items():
            state = adapter_state(policy)
            assert state and all(torch.equal(state[n], trained[agent][n]) for n in state), agent
            assert all(p.requires_grad for p in policy.parameters())


@pytest.fixture(scope="module")
def qwen2_dir(model_dir, tmp_path_factory):
    """A tiny random Qwen2 (grouped-query attention, no fused c_attn, Linear layers: peft's
    default targets q_proj and v_proj) with the tiny GPT-2's tokenizer."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.eos_token_id)
    folder = tmp_path_factory.mktemp("qwen2") / "m"
    Qwen2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_a_team_on_a_qwen2_shaped_base_samples_scores_and_trains(qwen2_dir):
    team = LoRATeam.from_pretrained(qwen2_dir, agents=AGENTS[:2], r=4, alpha=8, target_modules=None, max_new_tokens=4,
                                    temperature=1.0, top_p=None, top_k=None)
    assert set(team.model.peft_config["agent_0"].target_modules) == {"q_proj", "v_proj"}
    assert team.model.peft_config["agent_0"].fan_in_fan_out is False
    perturb(team, seed=2)
    torch.manual_seed(1)
    answers = team.sample({"agent_0": PROMPTS[:2], "agent_1": PROMPTS[2:]}, 2)
    requests = {"agent_0": ([PROMPTS[0]] * 2, answers["agent_0"][0]), "agent_1": ([PROMPTS[2]] * 2, answers["agent_1"][0])}
    together = team.token_log_probs(requests)
    for agent in requests:
        alone = team.policies[agent].token_log_probs(*requests[agent])
        torch.testing.assert_close(together[agent][0], alone[0], atol=1e-5, rtol=0)
    base_before = base_state(team)
    adapters_before = {a: adapter_state(p) for a, p in team.policies.items()}
    trainer = MAGRPOTrainer(env=multi_turn_env(num_turns=1), policies=team.policies, args=config(num_turns=1))
    trainer.train()
    assert trainer.state.global_step >= 1
    assert all(torch.equal(base_before[n], p) for n, p in team.model.named_parameters() if "lora_" not in n)
    for agent, policy in team.policies.items():
        after = adapter_state(policy)
        assert any(not torch.equal(adapters_before[agent][n], after[n]) for n in after), agent

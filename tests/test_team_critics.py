"""Critics of a LoRA team (issue 22.1): each critic reads its own agent's adapter or a value
adapter of its own on the team's one base — never peft's active adapter (agent 0's), never a
copy of the base — and its value gradient lands only in its own parameters. Also: gradient
checkpointing, chunked scoring, exact resume and the CLI's ``--learner iac --lora_r``."""

from __future__ import annotations

import pytest
import torch

from llm_marl.envs.dialogue import DialogueEnv
from llm_marl.learners import IACConfig, IACTrainer, MAACConfig, MAACTrainer
from llm_marl.policies import LoRATeam
from llm_marl.policies.adapter_critic import AdapterCritic
from llm_marl.policies.lora_team import adapter_parameters
from llm_marl.tasks.function_task import FunctionTask
from resumed import uninterrupted_and_resumed

torch.set_num_threads(1)

PROMPTS = ["The assert statement", "A", "If the module being imported is not a top level module,"]
AGENTS = ("agent_0", "agent_1")


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir  # tests/conftest.py: built once a session


def team_of(model_dir, agents=AGENTS, **settings):
    return LoRATeam.from_pretrained(model_dir, agents=agents, r=4, alpha=8, max_new_tokens=4, temperature=1.0,
                                    top_p=None, top_k=None, **settings)


def shift(team, adapter, seed, scale=0.3):
    """Give ``adapter`` new random weights."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in adapter_parameters(team.model, adapter):
            p.copy_(scale * torch.randn(p.shape, generator=generator))


def reward(a, b):
    return [float(len(a[0]) - len(b[0])) / 10.0]


def env(num_turns=1):
    task = FunctionTask(reward, lambda item: item["prompt"], lambda prompt, agent_completions, **_: [prompt + " " + t[:12] for t in agent_completions],
                        [{"prompt": p} for p in PROMPTS], num_agents=2, num_turns=num_turns)
    return DialogueEnv(task)


def ac_config(config_class=IACConfig, **overrides):
    settings = dict(num_agents=2, num_turns=1, num_generations=2, num_train_epochs=1, agent_learning_rate=1e-2,
                    critic_learning_rate=1e-2, max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=None,
                    early_termination_threshold=None, eval_interval=0, rollout_buffer_size=2, progress_bar=False, seed=3)
    settings.update(overrides)
    return config_class(**settings)


def values(critic):
    with torch.no_grad():
        return critic.values(PROMPTS).clone()


def grads_after(critic, team):
    """``{parameter name: |grad|}`` over the whole team model and the critic's head, after one
    backward of the critic's values."""
    for p in list(team.model.parameters()) + list(critic.head.parameters()):
        p.grad = None
    critic.values(PROMPTS).sum().backward()
    found = {n: float(p.grad.abs().sum()) for n, p in team.model.named_parameters() if p.grad is not None}
    found.update({f"head.{n}": float(p.grad.abs().sum()) for n, p in critic.head.named_parameters() if p.grad is not None})
    return {n: g for n, g in found.items() if g > 0}


def test_a_shared_critic_reads_and_trains_only_its_own_agents_adapter(model_dir):
    team = team_of(model_dir)
    for i, agent in enumerate(AGENTS):
        shift(team, agent, seed=i)
    trainer = IACTrainer(env=env(), policies=team.policies, args=ac_config(use_separate_critic=False))
    critics = trainer.critics
    assert all(isinstance(c, AdapterCritic) and c.shared and c.adapter == a for a, c in critics.items())
    before = {a: values(c) for a, c in critics.items()}

    shift(team, "agent_0", seed=10)  # agent 0's adapter changes: only agent 0's critic moves
    assert not torch.allclose(values(critics["agent_0"]), before["agent_0"])
    torch.testing.assert_close(values(critics["agent_1"]), before["agent_1"], atol=0, rtol=0)
    moved = values(critics["agent_0"])
    shift(team, "agent_1", seed=11)  # and the other way round
    assert not torch.allclose(values(critics["agent_1"]), before["agent_1"])
    torch.testing.assert_close(values(critics["agent_0"]), moved, atol=0, rtol=0)

    for agent, critic in critics.items():
        touched = grads_after(critic, team)
        own = {n for n, _ in adapter_parameters(team.model, agent)}
        assert touched and set(touched) <= own | {n for n in touched if n.startswith("head.")}, agent
        assert own & set(touched) and any(n.startswith("head.") for n in touched), agent
        # the head trains with the agent's own optimizer, beside its adapter
        held = {id(p) for group in trainer.optimizers[agent].param_groups for p in group["params"]}
        assert {id(p) for p in critic.head.parameters()} <= held
        assert not {id(p) for other in AGENTS if other != agent for p in critics[other].head.parameters()} & held


@pytest.mark.parametrize("learner", ["iac", "maac"])
def test_separate_critics_are_value_adapters_on_the_same_base(model_dir, learner):
    team = team_of(model_dir)
    for i, agent in enumerate(AGENTS):
        shift(team, agent, seed=i)
    storage = {p.untyped_storage().data_ptr() for n, p in team.model.named_parameters() if "lora_" not in n}
    trainer_class, config_class = (IACTrainer, IACConfig) if learner == "iac" else (MAACTrainer, MAACConfig)
    trainer = trainer_class(env=env(), policies=team.policies, args=ac_config(config_class))
    base_ids = {id(p) for p in team.model.parameters()}
    names = {"iac": {"agent_0": "agent_0_critic", "agent_1": "agent_1_critic"}, "maac": {"critic": "critic"}}[learner]
    assert {n: c.adapter for n, c in trainer.critics.items()} == names
    for name, critic in trainer.critics.items():
        assert isinstance(critic, AdapterCritic) and not critic.shared and critic.model is team.model
        own = list(critic.parameters())
        head = {id(p) for p in critic.head.parameters()}
        # no second base: every parameter the critic trains is the team model's (its adapter) or its head's
        assert all(id(p) in base_ids or id(p) in head for p in own)
        assert {id(p) for p in trainer.critic_params[name]} == {id(p) for p in own}
        assert critic.owned_parameters() == sum(p.numel() for _, p in adapter_parameters(team.model, critic.adapter)) + sum(p.numel() for p in critic.head.parameters())
        assert critic.owned_parameters() < sum(p.numel() for p in team.model.parameters()) / 10
    assert {p.untyped_storage().data_ptr() for n, p in team.model.named_parameters() if "lora_" not in n} == storage  # the same base
    assert sum(p.numel() for n, p in team.model.named_parameters() if "lora_" not in n) == sum(
        p.numel() for n, p in team_of(model_dir).model.named_parameters() if "lora_" not in n)

    critic = next(iter(trainer.critics.values()))
    # the value adapter starts as a copy of its agent's (IAC: its own agent; MAAC: the first agent)
    for (_, a), (_, c) in zip(adapter_parameters(team.model, "agent_0"), adapter_parameters(team.model, critic.adapter)):
        assert torch.equal(a, c)
    before = values(critic)
    for agent in AGENTS:  # the agents' adapters move: the critic's values do not
        shift(team, agent, seed=20)
    torch.testing.assert_close(values(critic), before, atol=0, rtol=0)
    shift(team, critic.adapter, seed=21)
    assert not torch.allclose(values(critic), before)
    touched = grads_after(critic, team)
    own = {n for n, _ in adapter_parameters(team.model, critic.adapter)}
    assert own <= set(touched) and set(touched) - own == {n for n in touched if n.startswith("head.")}


CASES = [
    ("iac-shared", IACTrainer, IACConfig, {"use_separate_critic": False}),
    ("iac-separate-q", IACTrainer, IACConfig, {"critic_type": "q"}),
    ("maac", MAACTrainer, MAACConfig, {}),
]


@pytest.mark.parametrize("case, trainer_class, config_class, placement", CASES, ids=[c[0] for c in CASES])
def test_team_critics_train_with_gradient_checkpointing_and_chunked_scoring(model_dir, case, trainer_class, config_class, placement):
    team = team_of(model_dir, gradient_checkpointing=True, max_batch_size=3)
    args = ac_config(config_class, num_turns=2, **placement)
    trainer = trainer_class(env=env(num_turns=2), policies=team.policies, args=args)
    base = {n: p.detach().clone() for n, p in team.model.named_parameters() if "lora_" not in n}
    adapters = {a: {n: p.detach().clone() for n, p in adapter_parameters(team.model, a)} for a in team.trainable_adapters}
    heads = {n: [p.detach().clone() for p in c.head.parameters()] for n, c in trainer.critics.items()}
    trainer.train()
    assert trainer.state.global_step >= 1
    assert all(torch.equal(base[n], p) for n, p in team.model.named_parameters() if "lora_" not in n)
    for adapter, before in adapters.items():  # every agent's and every value adapter's B moved
        after = dict(adapter_parameters(team.model, adapter))
        assert any(not torch.equal(before[n], after[n]) for n in before if ".lora_B." in n), adapter
    for name, critic in trainer.critics.items():
        assert any(not torch.equal(b, p) for b, p in zip(heads[name], critic.head.parameters())), name
    history = {k: v for _, m in trainer.logger.history for k, v in m.items()}
    assert all(torch.isfinite(torch.tensor(history[f"train/{a}/value_loss"])) for a in AGENTS)


@pytest.mark.parametrize("trainer_class, config_class, team_settings", [
    (IACTrainer, IACConfig, {}),
    (MAACTrainer, MAACConfig, {"gradient_checkpointing": True, "max_batch_size": 3}),
], ids=["iac", "maac-checkpointed-chunked"])
def test_team_critics_resume_exactly(model_dir, tmp_path, trainer_class, config_class, team_settings):
    def make(output_dir, **overrides):
        team = team_of(model_dir, **team_settings)
        args = ac_config(config_class, output_dir=str(output_dir), save_steps=1, num_train_epochs=2, **overrides)
        return trainer_class(env=env(), policies=team.policies, args=args)

    full, resumed = uninterrupted_and_resumed(make, tmp_path, max_steps=2)
    for name in full.critics:
        a, b = full.critics[name].state_dict(), resumed.critics[name].state_dict()
        assert set(a["adapter"]) == set(b["adapter"]) and all(torch.equal(a["adapter"][n], b["adapter"][n]) for n in a["adapter"]), name
        assert all(torch.equal(a["head"][n], b["head"][n]) for n in a["head"]), name
    for agent in AGENTS:
        a, b = full.policies[agent].state_dict(), resumed.policies[agent].state_dict()
        assert all(torch.equal(a[n], b[n]) for n in a), agent


def test_a_team_critic_saves_its_value_adapter_for_peft(model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    team = team_of(model_dir)
    trainer = IACTrainer(env=env(), policies=team.policies, args=ac_config())
    critic = trainer.critics["agent_1"]
    shift(team, critic.adapter, seed=5)
    trainer.save_model(str(tmp_path / "out"))
    folder = tmp_path / "out" / "agent_1" / "critic"
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), str(folder))
    saved = {n.replace(".default", ""): p for n, p in loaded.named_parameters() if "lora_" in n}
    mine = {n.replace(f".{critic.adapter}", ""): p for n, p in adapter_parameters(team.model, critic.adapter)}
    assert set(saved) == set(mine) and all(torch.equal(saved[n], mine[n]) for n in mine)
    assert (folder / "value_head.pt").is_file()
    with pytest.raises(ValueError, match="already has an adapter named 'agent_0_critic'.*earlier trainer"):
        IACTrainer(env=env(), policies=team.policies, args=ac_config())


def test_the_cli_trains_an_adapter_team_with_iac(model_dir):
    from llm_marl.cli import build_trainer

    trainer = build_trainer({"env": "WritingCollab-v0", "policy": "lm", "model": str(model_dir), "lora_r": 2, "num_turns": 1,
                             "max_new_tokens": 4, "progress_bar": False, "train_items": 2, "learner": "iac",
                             "gradient_checkpointing": True, "num_train_epochs": 1})  # one batch: not IAC's default 40 epochs
    team = next(iter(trainer.policies.values())).team
    assert all(isinstance(c, AdapterCritic) and c.team is team for c in trainer.critics.values())
    assert sorted(team.trainable_adapters) == sorted(list(trainer.agents) + [f"{a}_critic" for a in trainer.agents])
    trainer.train()
    assert trainer.state.global_step >= 1


def test_a_plain_critic_for_a_team_agent_is_refused_instead_of_copying_the_team(model_dir):
    from llm_marl.policies.lm_critic import CausalLMCritic

    team = team_of(model_dir)
    with pytest.raises(TypeError, match="agent of a LoRA team: build its critic with AdapterCritic.for_agent"):
        CausalLMCritic.for_policy(team.policies["agent_0"], shared=False)
    critic = AdapterCritic.for_agent(team.policies["agent_0"], shared=False, seed=1)
    assert critic.adapter == "agent_0_critic" and "agent_0_critic" in team.trainable_adapters

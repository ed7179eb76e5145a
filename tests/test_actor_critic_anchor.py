"""IAC and MAAC through the anchor library's keyword constructor, the CLI, reference KL and
several items per step.

``IACTrainer(agent_model=..., critic_model=..., reward_func=..., formatters=...,
external_transition=..., train_dataset=..., metrics_callback=..., args=IACConfig(...))`` builds
the same env, policies and critics as the env-native constructor; ``save_model`` writes the
critics beside the agents.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

torch.set_num_threads(1)

from transformers import AutoModelForCausalLM  # noqa: E402

from llm_marl import IACConfig, IACTrainer, MAACConfig, MAACTrainer  # noqa: E402
from llm_marl.cli import main  # noqa: E402
from llm_marl.envs.dialogue import DialogueEnv  # noqa: E402
from llm_marl.advantages import k3_kl  # noqa: E402
from llm_marl.policies.base import token_log_probs_of  # noqa: E402
from llm_marl.policies.lm_critic import CausalLMCritic  # noqa: E402
from llm_marl.policies.tabular import TabularPolicy  # noqa: E402
from toy_tasks import MENU, ColourMatch  # noqa: E402

TRAIN = [{"prompt": "The assert statement"}, {"prompt": "The import statement"}]


@pytest.fixture(scope="module")
def model_path(tiny_model_dir):
    return str(tiny_model_dir)  # tests/conftest.py: built once a session


def reward(a, b):
    return [float(len(a[0]) - len(b[0]))]


def transition(prompt, agent_completions, num_agents, **_):
    return [f"{prompt} {text}"[-60:] for text in agent_completions]


def small(config_class, **overrides):
    settings = dict(num_turns=2, num_generations=1, num_train_epochs=1, max_new_tokens=4, temperature=1.0, top_p=1.0,
                    rollout_buffer_size=2, agent_learning_rate=1e-3, critic_learning_rate=1e-3, eval_interval=0,
                    progress_bar=False)
    settings.update(overrides)
    return config_class(**settings)


def test_iac_anchor_keywords_with_one_critic_model_object_give_each_agent_its_own_critic(model_path, tmp_path):
    from llm_marl.comlrl.trainers.actor_critic import RolloutSample

    seen, received = [], []
    critic_model = AutoModelForCausalLM.from_pretrained(model_path)
    trainer = IACTrainer(agent_model=model_path, critic_model=critic_model, reward_func=reward,
                         formatters=lambda item: item["prompt"], external_transition=transition, train_dataset=TRAIN,
                         metrics_callback=lambda samples: seen.append(len(samples)) or received.extend(samples) or {"n": len(samples)},
                         args=small(IACConfig))
    first, second = trainer.critics.values()
    assert isinstance(first, CausalLMCritic) and first.model is not second.model  # one object, copied (Q17)
    assert first.model is not trainer.policies["agent_0"].model
    trainer.train()
    assert seen and trainer.state.global_step >= 1
    assert received and all(isinstance(r, RolloutSample) for r in received)  # CoMLRL's objects, not groups
    assert {r.agent_idx for r in received} == {0, 1} and {r.metadata["turn_idx"] for r in received} == {0, 1}
    for r in received:
        assert isinstance(r.completion, str) and r.prompt and r.response_len >= 1
        assert r.advantage.item() == pytest.approx(r.metadata["target"] - r.old_value.item())  # raw y - V
    trainer.save_model(str(tmp_path / "out"))
    for i in range(2):
        loaded = CausalLMCritic.from_pretrained(tmp_path / "out" / f"agent_{i}" / "critic")
        assert loaded.num_outputs == 1
        assert (tmp_path / "out" / f"agent_{i}" / "config.json").exists()


def test_maac_anchor_keywords_take_one_critic_source_loaded_from_a_path(model_path, tmp_path):
    trainer = MAACTrainer(agent_model=model_path, critics=[model_path], reward_func=reward,
                          formatters=[lambda item: item["prompt"], lambda item: "Partner: " + item["prompt"]],
                          external_transition=transition, train_dataset=TRAIN, args=small(MAACConfig))
    [critic] = trainer.critics.values()
    assert critic.num_outputs == 2 and critic.use_token_ids is False
    trainer.train()
    trainer.save_model(str(tmp_path / "out"))
    assert (tmp_path / "out" / "critic" / "value_head.pt").exists()
    with pytest.raises(ValueError, match=r"critics: expected 1 \(one central critic\), got 2"):
        MAACTrainer(agent_model=model_path, critics=[model_path, model_path], reward_func=reward,
                    external_transition=transition, train_dataset=TRAIN, args=small(MAACConfig))


def test_a_central_critic_model_object_tokenizes_with_its_own_tokenizer_not_agent_0s(model_path):
    """Q16: CoMLRL's central critic tokenizes with agent 0's tokenizer. Here a critic model object
    takes the tokenizer saved with it; without one, agents with different tokenizers need
    model_config['critic_tokenizer']."""
    from transformers import AutoTokenizer

    other = AutoTokenizer.from_pretrained(model_path)
    other.add_special_tokens({"additional_special_tokens": ["<partner>"]})  # agent 1's tokenizer differs
    tokenizers = [AutoTokenizer.from_pretrained(model_path), other]

    def build(critic_model, **model_config):
        return MAACTrainer(agent_model=model_path, tokenizer=tokenizers, critic_model=critic_model, reward_func=reward,
                           external_transition=transition, train_dataset=TRAIN, args=small(MAACConfig),
                           model_config=model_config or None)

    [critic] = build(AutoModelForCausalLM.from_pretrained(model_path)).critics.values()
    assert critic.tokenizer is not tokenizers[0] and critic.tokenizer.name_or_path == model_path
    assert "<partner>" not in critic.tokenizer.get_vocab()
    anonymous = AutoModelForCausalLM.from_pretrained(model_path)
    anonymous.config._name_or_path = ""
    with pytest.raises(ValueError, match=r"different tokenizers .* model_config\['critic_tokenizer'\]"):
        build(anonymous)
    [critic] = build(anonymous, critic_tokenizer=model_path).critics.values()
    assert critic.tokenizer.name_or_path == model_path


def test_shared_placement_rejects_critic_sources(model_path):
    with pytest.raises(ValueError, match="use_separate_critic=False puts the value head on each agent's own model"):
        IACTrainer(agent_model=model_path, critic_model=model_path, reward_func=reward, external_transition=transition,
                   train_dataset=TRAIN, args=small(IACConfig, use_separate_critic=False))
    trainer = IACTrainer(agent_model=model_path, reward_func=reward, external_transition=transition,
                         train_dataset=TRAIN, args=small(IACConfig, use_separate_critic=False))
    assert all(c.shared and c.model is trainer.policies[a].model for a, c in trainer.critics.items())


def test_reference_kl_shapes_the_rewards_of_the_samples():
    """r = R - beta * KL, with KL recomputed here from the policies and the frozen references."""
    env = DialogueEnv(ColourMatch(num_items=2, num_turns=1))
    policies = [TabularPolicy(MENU), TabularPolicy(MENU)]
    trainer = IACTrainer(env=env, policies=policies, args=IACConfig(num_turns=1, num_generations=3, reference_kl_enabled=True,
                                                                    reference_kl_coef=0.5, progress_bar=False, eval_interval=0))
    with torch.no_grad():
        for policy in policies:
            policy.add_observations([f"item 0: {a}, name a colour" for a in ("left", "right")])
            policy.logits.add_(torch.randn_like(policy.logits))
    from llm_marl.learners.tree import collect_trees

    roots = collect_trees(env, trainer.policies, [0], trainer.args, seed=0)
    samples = trainer._samples(roots)
    for sample in samples:
        policy, reference = trainer.policies[sample.agent], trainer.reference_policies[sample.agent]
        observations = [sample.observation] * len(sample.completions)
        mine, mask = token_log_probs_of(policy, observations, sample.completions)
        theirs, _ = token_log_probs_of(reference, observations, sample.completions)
        kl = k3_kl(mine.detach(), theirs, mask).tolist()
        assert all(k > 0 for k in kl)
        assert sample.rewards == pytest.approx([r - 0.5 * k for r, k in zip(roots[0].rewards, kl)])
        assert sample.targets == pytest.approx(sample.rewards)  # one turn: no bootstrap


def test_several_items_per_step_are_rolled_out_together():
    env = DialogueEnv(ColourMatch(num_items=4, num_turns=2))
    trainer = MAACTrainer(env=env, policies=[TabularPolicy(MENU), TabularPolicy(MENU)],
                          args=MAACConfig(num_turns=2, items_per_step=4, rollout_buffer_size=8, num_train_epochs=1,
                                          progress_bar=False, eval_interval=0, agent_learning_rate=0.1))
    trainer.train()
    assert trainer.state.batch_step == 1 and trainer.state.global_step == 1  # 4 items x 2 turns = 8 samples: one step


def test_cli_trains_with_iac_and_maac(tmp_path, capsys):
    for learner in ("iac", "maac"):
        out = tmp_path / learner
        args = ["train", "--env", "PenaltyGame-v0", "--policy", "tabular", "--learner", learner, "--num_turns", "1",
                "--num_generations", "8", "--agent_learning_rate", "0.3", "--critic_learning_rate", "0.3",
                "--value_clip_range", "none", "--num_train_epochs", "20", "--eval_interval", "0",
                "--progress_bar", "false", "--output_dir", str(out)]
        assert main(args) == 0
        summary = json.load(open(out / "summary.json"))
        assert summary["optimizer_steps"] == 20
        assert summary["eval_after"]["eval/turn_1/reward_mean"] in (2.0, 10.0)  # a coordinated cell
        final = out / "final"
        critic_files = ["critic/critic.pt"] if learner == "maac" else ["row/critic/critic.pt", "column/critic/critic.pt"]
        assert all((final / f).exists() for f in critic_files)
        assert any(name.startswith("critic_0") for name in os.listdir(out / "checkpoint-20"))
    main(["list"])
    listed = capsys.readouterr().out
    assert "IACTrainer / IACConfig" in listed and "MAACTrainer / MAACConfig" in listed

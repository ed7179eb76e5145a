"""IAC and MAAC trainers with tabular policies and critics: targets from real rollouts, the
update's losses against hand computation, placements of the critic, resume, errors, config.

Hand values used below (uniform 3-action tabular policy: log pi = log(1/3) = -1.0986123):
    one sample, A = 0.75, V_old = V = 0.25, y = 1, c_v = 0.6:
    L_pi = -log(1/3) * 0.75 = 0.8239592;  L_V = 0.6 * (1 - 0.25)^2 = 0.3375.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

torch.set_num_threads(1)

from llm_marl.envs.dialogue import DialogueEnv  # noqa: E402
from llm_marl.learners import IACConfig, IACTrainer, MAACConfig, MAACTrainer  # noqa: E402
from llm_marl.learners.actor_critic.trainer import ACSample  # noqa: E402
from llm_marl.learners.tree import collect_trees  # noqa: E402
from llm_marl.policies.base import Completion  # noqa: E402
from llm_marl.policies.critic import joint_observation  # noqa: E402
from llm_marl.policies.tabular import TabularPolicy  # noqa: E402
from llm_marl.policies.tabular_critic import TabularCritic  # noqa: E402
from toy_tasks import MENU, ColourMatch, Scheduled  # noqa: E402
from resumed import uninterrupted_and_resumed  # noqa: E402

LOG_THIRD = math.log(1 / 3)


def preset(critic, values):
    """Give ``critic`` the rows ``values`` (key -> list of outputs)."""
    critic.add_observations(list(values))
    with torch.no_grad():
        for key, value in values.items():
            critic.table[critic.rows[key]] = torch.tensor(value)
    return critic


def settings(**overrides):
    base = dict(
        num_turns=1,
        num_generations=1,
        num_train_epochs=1,
        agent_learning_rate=0.1,
        critic_learning_rate=0.1,
        rollout_buffer_size=1,
        eval_interval=0,
        logging_steps=1,
        progress_bar=False,
        seed=3,
    )
    base.update(overrides)
    return base


def rollout_samples(trainer):
    roots = collect_trees(trainer.env, trainer.policies, [0], trainer.args, seed=0)
    return trainer._samples(roots)


# --- targets and advantages from real rollouts (SPEC §7 T3, T4, T7) ---------------------------


def test_t3_targets_and_advantages_from_a_three_turn_rollout():
    env = DialogueEnv(Scheduled([-1.0, -2.0, 0.5]))
    values = {"turn 0": [0.5], "turn 1": [0.6], "turn 2": [0.4]}
    critics = {agent: preset(TabularCritic(), values) for agent in ("a", "b")}
    args = IACConfig(**settings(num_turns=3, discount=0.9))
    trainer = IACTrainer(env=env, policies=[TabularPolicy(MENU), TabularPolicy(MENU)], critics=critics, args=args)
    samples = rollout_samples(trainer)
    for agent in ("a", "b"):
        mine = [s for s in samples if s.agent == agent]
        assert [s.turn for s in mine] == [0, 1, 2]
        assert [s.targets[0] for s in mine] == pytest.approx([-0.46, -1.64, 0.5])
        assert [s.advantages[0] for s in mine] == pytest.approx([-0.96, -2.24, 0.10])
        assert [s.values[0] for s in mine] == pytest.approx([0.5, 0.6, 0.4])


@pytest.mark.parametrize("threshold, turns", [(-0.9, 1), (-0.7, 2), (None, 2)])
def test_t4_an_early_stop_is_not_bootstrapped(threshold, turns):
    env = DialogueEnv(Scheduled([-0.75, 1.0]))
    critics = {agent: preset(TabularCritic(), {"turn 0": [0.5], "turn 1": [5.0]}) for agent in ("a", "b")}
    args = IACConfig(**settings(num_turns=2, early_termination_threshold=threshold))
    trainer = IACTrainer(env=env, policies=[TabularPolicy(MENU), TabularPolicy(MENU)], critics=critics, args=args)
    samples = [s for s in rollout_samples(trainer) if s.agent == "a"]
    assert len(samples) == turns
    # stopped: y = r (nothing bootstraps it, not even V(turn 0) = 0.5); continued: y = r + V_old(turn 1) = -0.75 + 5
    assert samples[0].targets == pytest.approx([-0.75] if turns == 1 else [4.25])
    assert samples[0].advantages == pytest.approx([-1.25] if turns == 1 else [3.75])


def test_t7_maac_bootstraps_each_agent_from_its_own_output_of_the_joint_value():
    env = DialogueEnv(Scheduled([1.0, 0.5]))
    first = joint_observation({"a": "turn 0", "b": "turn 0"}, ["a", "b"])
    second = joint_observation({"a": "turn 1", "b": "turn 1"}, ["a", "b"])
    assert first == "[Agent 0] turn 0\n\n[Agent 1] turn 0"
    critic = preset(TabularCritic(2), {first: [0.2, -0.3], second: [0.1, 0.7]})
    args = MAACConfig(**settings(num_turns=2))
    trainer = MAACTrainer(env=env, policies=[TabularPolicy(MENU), TabularPolicy(MENU)], critics=critic, args=args)
    samples = rollout_samples(trainer)
    by_agent = {agent: [s for s in samples if s.agent == agent] for agent in ("a", "b")}
    # agent a (output 0): y = [1 + 0.1, 0.5], A = y - [0.2, 0.1]
    assert [s.targets[0] for s in by_agent["a"]] == pytest.approx([1.1, 0.5])
    assert [s.advantages[0] for s in by_agent["a"]] == pytest.approx([0.9, 0.4])
    # agent b (output 1): y = [1 + 0.7, 0.5], A = y - [-0.3, 0.7]
    assert [s.targets[0] for s in by_agent["b"]] == pytest.approx([1.7, 0.5])
    assert [s.advantages[0] for s in by_agent["b"]] == pytest.approx([2.0, -0.2])
    assert by_agent["a"][0].critic_observation == first


def test_q_critic_advantage_is_action_value_minus_state_value():
    env = DialogueEnv(Scheduled([1.0]))
    critic = TabularCritic()
    key_v = "turn 0"
    answers = {TabularCritic.key("turn 0", Completion(word)): [q] for word, q in zip(MENU, (2.0, -1.0, 0.5))}
    preset(critic, {key_v: [0.25], **answers})
    args = IACConfig(**settings(critic_type="q", num_generations=3))
    trainer = IACTrainer(env=env, policies=[TabularPolicy(MENU), TabularPolicy(MENU)], critics=[critic, TabularCritic()], args=args)
    [sample, _] = rollout_samples(trainer)
    q = {"red": 2.0, "green": -1.0, "blue": 0.5}
    assert sample.action_values == [q[c.text] for c in sample.completions]
    assert sample.advantages == pytest.approx([q[c.text] - 0.25 for c in sample.completions])
    assert sample.targets == [1.0, 1.0, 1.0]  # y never uses the action value


# --- one update against hand computation ------------------------------------------------------


def controlled_trainer(trainer_class, config_class, **overrides):
    env = DialogueEnv(Scheduled([1.0]))
    trainer = trainer_class(env=env, policies=[TabularPolicy(MENU), TabularPolicy(MENU)],
                            args=config_class(**settings(**overrides)))
    for name, critic in trainer.critics.items():
        preset(critic, {trainer._critic_observation_key(): [0.25] * critic.num_outputs})
    return trainer


def hand_sample(trainer, agent, advantage=0.75, old_value=0.25, target=1.0):
    name, _ = trainer.critic_of(agent)
    observation = "turn 0"
    critic_observation = joint_observation({"a": observation, "b": observation}, ["a", "b"]) if trainer.central else observation
    return ACSample(agent, observation, [Completion("red", action=0)], [target], [advantage], 0, 0,
                    rewards=[target], values=[old_value], targets=[target], critic_observation=critic_observation)


def logged(trainer):
    trainer._flush_metrics(force=True)
    return trainer.logger.history[-1][1]


IACTrainer._critic_observation_key = lambda self: "turn 0"
MAACTrainer._critic_observation_key = lambda self: joint_observation({"a": "turn 0", "b": "turn 0"}, ["a", "b"])


def test_separate_critic_takes_its_own_step_on_the_value_loss():
    trainer = controlled_trainer(IACTrainer, IACConfig)
    trainer.buffers["a"].append(hand_sample(trainer, "a"))
    before = trainer.critics["a"].table.detach().clone()
    trainer._update()
    metrics = logged(trainer)
    assert metrics["train/a/loss"] == pytest.approx(-LOG_THIRD * 0.75)
    assert metrics["train/a/critic/loss"] == pytest.approx(0.6 * 0.75**2)
    assert trainer.critic_optimizers["a"].param_groups[0]["lr"] == 0.1
    moved = (trainer.critics["a"].table.detach() - before).abs().sum(dim=-1).nonzero().flatten().tolist()
    assert moved == [trainer.critics["a"].rows["turn 0"]]  # one AdamW step moved exactly that row
    assert "train/b/critic/loss" not in metrics


def test_shared_placement_takes_one_step_on_the_sum_at_the_actor_rate():
    trainer = controlled_trainer(IACTrainer, IACConfig, use_separate_critic=False, critic_learning_rate=0.5)
    assert trainer.critic_optimizers == {}
    held = {id(p) for group in trainer.optimizers["a"].param_groups for p in group["params"]}
    assert id(trainer.critics["a"].table) in held and id(trainer.critics["b"].table) not in held
    trainer.buffers["a"].append(hand_sample(trainer, "a"))
    trainer._update()
    metrics = logged(trainer)
    assert metrics["train/a/loss"] == pytest.approx(-LOG_THIRD * 0.75 + 0.6 * 0.75**2)
    assert metrics["train/a/value_loss"] == pytest.approx(0.3375)
    assert "train/a/critic/loss" not in metrics


def test_value_clipping_applies_to_a_separate_critic():
    # V has moved to 0.9 since the rollout (V_old 0.5), y = 1, eps = 0.2: e = max(0.01, 0.09)
    for clip, expected in ((0.2, 0.6 * 0.09), (None, 0.6 * 0.01)):
        trainer = controlled_trainer(IACTrainer, IACConfig, value_clip_range=clip)
        preset(trainer.critics["a"], {"turn 0": [0.9]})
        loss = trainer._value_loss_sum("a", [hand_sample(trainer, "a", old_value=0.5)])
        assert loss.item() == pytest.approx(expected)


def test_central_critic_takes_one_step_per_joint_minibatch_on_every_agents_output():
    trainer = controlled_trainer(MAACTrainer, MAACConfig)
    key = trainer._critic_observation_key()
    preset(trainer.critics["critic"], {key: [0.25, 0.5]})
    trainer.buffers["a"].append(hand_sample(trainer, "a", old_value=0.25, target=1.0))
    trainer.buffers["b"].append(hand_sample(trainer, "b", old_value=0.5, target=0.0))
    trainer._update()
    metrics = logged(trainer)
    # mean over the two agents' errors: ((1 - 0.25)^2 + (0 - 0.5)^2) / 2, times c_v
    assert metrics["train/critic/loss"] == pytest.approx(0.6 * (0.5625 + 0.25) / 2)
    [param] = trainer.critic_params["critic"]
    assert int(trainer.critic_optimizers["critic"].state[param]["step"]) == 1
    after = trainer.critics["critic"].table.detach()[trainer.critics["critic"].rows[key]]
    assert after[0] > 0.25 and after[1] < 0.5  # output a moved up to 1, output b down to 0


def test_advantages_are_whitened_per_agent_across_turns():
    trainer = controlled_trainer(IACTrainer, IACConfig, train_batch_size=4)
    for turn, advantage in enumerate([1.0, 3.0, 0.0, 4.0]):
        sample = hand_sample(trainer, "a", advantage=advantage)
        sample.turn = turn
        trainer.buffers["a"].append(sample)
    [first, second] = trainer._minibatches("a", 2)
    s = math.sqrt(2.5)
    assert [a for x in first + second for a in x.advantages] == pytest.approx([-1 / s, 1 / s, -2 / s, 2 / s])
    assert [x.advantages[0] for x in trainer.buffers["a"].samples] == [1.0, 3.0, 0.0, 4.0]  # kept, raw, until trained on


# --- training end to end: metrics, resume, errors ---------------------------------------------


def colour_trainer(trainer_class=IACTrainer, output_dir=None, **overrides):
    config_class = trainer_class.config_class
    base = settings(num_turns=2, num_generations=1, num_train_epochs=3, rollout_buffer_size=3, train_batch_size=2,
                    save_steps=2, save_total_limit=None, eval_interval=2, eval_num_samples=2,
                    output_dir=None if output_dir is None else str(output_dir), seed=7)
    base.update(overrides)
    return trainer_class(env=DialogueEnv(ColourMatch()), policies=[TabularPolicy(MENU), TabularPolicy(MENU)],
                         args=config_class(**base))


def state_of(trainer):
    out = {f"policy/{a}": p.logits.detach().clone() for a, p in trainer.policies.items()}
    out.update({f"critic/{n}": c.table.detach().clone() for n, c in trainer.critics.items()})
    for n, opt in trainer.critic_optimizers.items():
        for i, st in enumerate(opt.state.values()):
            out[f"critic_opt/{n}/{i}"] = st["exp_avg"].clone()
    return out


@pytest.mark.parametrize("trainer_class", [IACTrainer, MAACTrainer])
def test_stop_resume_equals_uninterrupted_with_critics_and_their_optimizers(tmp_path, trainer_class):
    def critic_optimizers_saved(stopped):
        assert any(name.startswith("critic_0_optimizer") for name in os.listdir(stopped.state.last_checkpoint))

    full, resumed = uninterrupted_and_resumed(lambda out, **kw: colour_trainer(trainer_class, out, **kw), tmp_path, max_steps=3,
                                              on_stopped=critic_optimizers_saved)
    a, b = state_of(full), state_of(resumed)
    assert a.keys() == b.keys() and any(k.startswith("critic_opt") for k in a)
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_metrics_are_per_agent_and_written_to_tensorboard_and_jsonl(tmp_path):
    trainer = colour_trainer(MAACTrainer, tmp_path)
    trainer.train()
    import json

    lines = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    names = set().union(*lines)
    for agent in ("left", "right"):
        for metric in ("loss", "value_loss", "value_mean", "target_mean", "advantage_mean", "grad_norm"):
            assert f"train/{agent}/{metric}" in names
    assert "train/critic/loss" in names and "eval/turn_1/reward_mean" in names
    assert any(p.name.startswith("events") for p in (tmp_path / "logs").iterdir())


def test_a_non_finite_critic_value_names_the_critic_item_and_turn():
    trainer = colour_trainer(IACTrainer)
    trainer.critics["left"].initial_value = float("nan")
    with pytest.raises(FloatingPointError, match=r"critic 'left': V value is not finite for item 0, turn 0"):
        trainer.train()


def test_a_non_finite_value_loss_names_the_critic_and_the_step():
    trainer = colour_trainer(IACTrainer)
    sample = hand_sample(trainer, "left")
    sample.critic_observation = "left obs"
    sample.targets = [float("inf")]
    trainer.buffers["left"].append(sample)
    before = state_of(trainer)
    with pytest.raises(FloatingPointError, match=r"critic of agent 'left', optimizer step 1, items \[0\]: loss is"):
        trainer._update()
    # all or nothing: the actor whose gradient was fine did not step either; the sample is kept
    after = state_of(trainer)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert trainer.buffers["left"].samples == [sample] and trainer.state.global_step == 0


def test_metrics_callback_values_are_logged_and_non_numbers_dropped():
    seen = []

    def callback(samples):
        seen.append(len(samples))
        return {"custom/answers": float(len(samples)), "note": "text"}

    trainer = IACTrainer(env=DialogueEnv(ColourMatch(num_items=2)), policies=[TabularPolicy(MENU), TabularPolicy(MENU)],
                         args=IACConfig(**settings(num_turns=2)), metrics_callback=callback)
    trainer.train()
    names = set().union(*(m for _, m in trainer.logger.history))
    assert "train/custom/answers" in names and "train/note" not in names
    assert seen == [4, 4]  # 2 turns x 2 agents per item


# --- construction and configuration -----------------------------------------------------------


def test_anchor_defaults_and_fixed_quirk_defaults():
    iac, maac = IACConfig(), MAACConfig()
    for config in (iac, maac):
        assert (config.agent_learning_rate, config.critic_learning_rate, config.rollout_buffer_size) == (5e-6, 5e-6, 8)
        assert config.resolved_train_batch_size == 8 and config.value_loss_coef == 0.6 and config.advantage_normalization
        assert (config.max_new_tokens, config.temperature, config.top_p, config.top_k) == (256, 0.6, 0.6, None)
        assert (config.num_train_epochs, config.num_agents, config.num_turns, config.num_generations) == (40, 2, 2, 1)
        assert (config.eval_interval, config.eval_num_samples, config.eval_batch_size, config.logging_steps) == (16, 4, 1, 1)
        assert config.critic_type == "v" and config.discount == 1.0 and config.reference_kl_coef == 0.1
        assert config.early_termination_threshold is None  # the anchor's -0.2 ends every episode after turn 1 (Q2)
    assert iac.value_clip_range == 0.2 and iac.use_separate_critic and maac.value_clip_range is None


@pytest.mark.parametrize(
    "config_class, kwargs, message",
    [
        (IACConfig, {"critic_type": "x"}, "critic_type"),
        (IACConfig, {"value_clip_range": 0.0}, "value_clip_range"),
        (IACConfig, {"value_loss_coef": -1.0}, "value_loss_coef"),
        (IACConfig, {"critic_learning_rate": 0.0}, "critic_learning_rate"),
        (IACConfig, {"joint_mode": "cross"}, "joint_mode"),
        (IACConfig, {"advantage_mode": "max"}, "advantage_mode"),
        (IACConfig, {"num_generations": 0}, "num_generations"),
        (IACConfig, {"critic_devices": ["cpu"] * 3}, "critic_devices"),
        (MAACConfig, {"use_separate_critic": False}, "use_separate_critic"),
        (IACConfig, {"value_head_hidden_dim": 0}, "value_head_hidden_dim"),
    ],
)
def test_invalid_actor_critic_config_names_the_field(config_class, kwargs, message):
    with pytest.raises(ValueError, match=message):
        config_class(**kwargs)


def test_constructor_errors_name_the_problem():
    env, policies = DialogueEnv(ColourMatch()), [TabularPolicy(MENU), TabularPolicy(MENU)]
    with pytest.raises(ValueError, match="exactly one central critic, got 2"):
        MAACTrainer(env=env, policies=policies, critics=[TabularCritic(2), TabularCritic(2)], args=MAACConfig())
    with pytest.raises(ValueError, match="critic 'critic' has 1 outputs; MAACTrainer needs 2"):
        MAACTrainer(env=env, policies=policies, critics=TabularCritic(1), args=MAACConfig())
    with pytest.raises(ValueError, match=r"critics: expected 2 \(one per agent"):
        IACTrainer(env=env, policies=policies, critics=[TabularCritic()], args=IACConfig())
    with pytest.raises(TypeError, match="Critic protocol"):
        IACTrainer(env=env, policies=policies, critics=[object(), object()], args=IACConfig())
    with pytest.raises(TypeError, match="args must be a MAACConfig"):
        MAACTrainer(env=env, policies=policies, args=IACConfig())


def test_default_critics_are_tabular_for_tabular_policies_with_the_right_outputs():
    env, policies = DialogueEnv(ColourMatch()), [TabularPolicy(MENU), TabularPolicy(MENU)]
    iac = IACTrainer(env=env, policies=policies, args=IACConfig())
    assert set(iac.critics) == {"left", "right"} and all(c.num_outputs == 1 for c in iac.critics.values())
    assert iac.critics["left"] is not iac.critics["right"]
    maac = MAACTrainer(env=env, policies=policies, args=MAACConfig())
    assert list(maac.critics) == ["critic"] and maac.critics["critic"].num_outputs == 2
    assert maac.critic_of("right") == ("critic", 1) and iac.critic_of("right") == ("right", 0)

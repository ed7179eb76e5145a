"""What a trainer checks before it trains (issue 13, items 2, 4 and 7): the config's horizon
against the env's, one set of weights per agent, the Policy protocol, and the config itself —
also when it was changed after construction."""

from __future__ import annotations

import dataclasses

import datasets
import pytest
import torch

torch.set_num_threads(1)

from llm_marl.envs import DialogueEnv, make  # noqa: E402
from llm_marl.learners.config import MAGRPOConfig  # noqa: E402
from llm_marl.learners.reinforce.trainer import MAGRPOTrainer  # noqa: E402
from llm_marl.learners.tree import iter_nodes  # noqa: E402
from llm_marl.policies.scripted import ScriptedPolicy  # noqa: E402
from llm_marl.policies.tabular import TabularPolicy  # noqa: E402
from llm_marl.tasks import CooperativeTask  # noqa: E402

FAST = dict(eval_interval=0, progress_bar=False, early_termination_threshold=None)


class Steps(CooperativeTask):
    """Agents a, b answer "x" or "y"; reward 1 if they agree. ``num_turns`` is the horizon."""

    agents = ("a", "b")

    def __init__(self, num_turns=3, items=4):
        self.num_turns = num_turns
        self.items = items

    def dataset(self, split):
        return datasets.Dataset.from_list([{"n": n} for n in range(self.items)])

    def initial_observations(self, item):
        return {agent: f"{agent} n={item['n']}" for agent in self.agents}

    def reward(self, item, actions, history):
        return float(actions["a"] == actions["b"])

    def transition(self, item, actions, history):
        return {agent: f"{agent} n={item['n']} t={len(history)}" for agent in self.agents}


def tables():
    return {"a": TabularPolicy(["x", "y"]), "b": TabularPolicy(["x", "y"])}


# --- item 2: horizon ------------------------------------------------------------------------------


def test_a_three_turn_task_with_the_default_two_turns_fails_naming_both_numbers():
    with pytest.raises(ValueError, match=r"num_turns is 2 in the config but env \(task Steps\) plays 3 turns"):
        MAGRPOTrainer(env=DialogueEnv(Steps(num_turns=3)), policies=tables(), args=MAGRPOConfig(**FAST))


def test_an_eval_env_with_another_horizon_fails_too():
    args = MAGRPOConfig(num_turns=3, **FAST)
    with pytest.raises(ValueError, match=r"num_turns is 3 in the config but eval_env \(task Steps\) plays 2 turns"):
        MAGRPOTrainer(env=DialogueEnv(Steps(3)), policies=tables(), args=args, eval_env=DialogueEnv(Steps(2)))


def test_a_task_without_a_horizon_plays_the_configs_turns():
    task = Steps()
    task.num_turns = None  # declares no horizon: only is_done (never here) would end it
    args = MAGRPOConfig(num_turns=3, num_generations=2, num_train_epochs=1, **FAST)
    trainer = MAGRPOTrainer(env=DialogueEnv(task), policies=tables(), args=args)
    roots = []
    collect = trainer._train_batch

    def recording(indices):
        from llm_marl.learners import tree

        roots.extend(tree.collect_trees(trainer.env, trainer.policies, indices, args))
        collect(indices)

    trainer._train_batch = recording
    trainer.train()
    assert sorted({node.turn for node in iter_nodes(roots)}) == [0, 1, 2]


def test_a_default_config_takes_the_envs_horizon_and_agents():
    trainer = MAGRPOTrainer(env=make("ClimbingGame-v0"), policies=[TabularPolicy(["alpha"]) for _ in range(2)])
    assert trainer.args.num_turns == 1 and trainer.args.num_agents == 2


# --- item 4: one set of weights per agent, and the Policy protocol --------------------------------


def test_the_same_policy_object_for_two_agents_raises_naming_them():
    shared = TabularPolicy(["x", "y"])
    with pytest.raises(ValueError, match=r"agents 'a' and 'b' were given the same policy object"):
        MAGRPOTrainer(env=DialogueEnv(Steps(1)), policies=[shared, shared], args=MAGRPOConfig(num_turns=1, **FAST))


class View:
    """A policy object of its own that scores with another policy's table (shares its weights)."""

    def __init__(self, inner):
        self.inner = inner

    def sample(self, observations, num_samples):
        return self.inner.sample(observations, num_samples)

    def log_probs(self, observations, completions, reduction="sum"):
        return self.inner.log_probs(observations, completions, reduction)

    def parameters(self):
        return self.inner.parameters()


def test_two_policies_sharing_trainable_weights_raise():
    table = TabularPolicy(["x", "y"])
    args = MAGRPOConfig(num_turns=1, **FAST)
    with pytest.raises(ValueError, match=r"agents 'a' and 'b' were given policies sharing trainable weights"):
        MAGRPOTrainer(env=DialogueEnv(Steps(1)), policies=[View(table), View(table)], args=args)


def test_one_scripted_partner_may_serve_several_agents():
    partner = ScriptedPolicy(lambda observation, n: ["x"] * n)  # no weights to share
    args = MAGRPOConfig(num_turns=1, num_train_epochs=1, **FAST)
    MAGRPOTrainer(env=DialogueEnv(Steps(1)), policies=[partner, partner], args=args).train()


class FakeHFModel(torch.nn.Module):
    """What a raw Hugging Face causal LM offers the trainer: generate() and parameters()."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(2))

    def generate(self, *args, **kwargs):
        raise AssertionError("never called")


def test_a_raw_model_as_policy_is_refused_naming_the_agent():
    args = MAGRPOConfig(num_turns=1, **FAST)
    with pytest.raises(TypeError, match=r"policy of agent 'b' is a FakeHFModel.*missing sample, log_probs.*CausalLMPolicy"):
        MAGRPOTrainer(env=DialogueEnv(Steps(1)), policies=[TabularPolicy(["x", "y"]), FakeHFModel()], args=args)


def test_a_real_hugging_face_model_as_policy_is_refused():
    from llm_marl.policies.tiny import load_tiny

    model, _ = load_tiny()
    args = MAGRPOConfig(num_turns=1, **FAST)
    with pytest.raises(TypeError, match=rf"policy of agent 'a' is a {type(model).__name__}.*CausalLMPolicy"):
        MAGRPOTrainer(env=DialogueEnv(Steps(1)), policies={"a": model, "b": TabularPolicy(["x", "y"])}, args=args)


def test_drop_in_agents_with_one_model_object_twice_raise():
    from llm_marl.policies.tiny import load_tiny

    model, tokenizer = load_tiny()
    with pytest.raises(ValueError, match=r"agents\[0\] and agents\[1\] \(agent_0 and agent_1\) are the same model object"):
        MAGRPOTrainer(
            agents=[model, model],
            tokenizer=tokenizer,
            reward_func=lambda a, b: [1.0],
            train_dataset=[{"prompt": "hi"}],
            args=MAGRPOConfig(num_turns=1, **FAST),
        )


# --- item 7: config validation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "field_name, value",
    [
        ("early_termination_threshold", float("nan")),
        ("early_termination_threshold", float("inf")),
        ("reference_kl_coef", float("nan")),
        ("weight_decay", float("nan")),
        ("max_grad_norm", float("nan")),
    ],
)
def test_non_finite_values_are_rejected_naming_the_field(field_name, value):
    with pytest.raises(ValueError, match=rf"{field_name} must be a finite number"):
        MAGRPOConfig(**{field_name: value})


def count_steps(trainer):
    counts = {agent: 0 for agent in trainer.optimizers}
    for agent, optimizer in trainer.optimizers.items():
        optimizer.register_step_post_hook(lambda *_, agent=agent: counts.__setitem__(agent, counts[agent] + 1))
    return counts


def test_train_batch_size_none_follows_a_replaced_buffer_size():
    base = MAGRPOConfig(num_turns=1, num_generations=2, num_train_epochs=1, **FAST)
    assert base.train_batch_size is None
    args = dataclasses.replace(base, rollout_buffer_size=8)
    assert args.resolved_train_batch_size == 8
    # 8 items x 1 node = 8 samples per agent: one full buffer, one optimizer step of 8 samples
    trainer = MAGRPOTrainer(env=DialogueEnv(Steps(1, items=8)), policies=tables(), args=args)
    counts = count_steps(trainer)
    trainer.train()
    assert counts == {"a": 1, "b": 1}  # a stale batch size of 2 would take 4 steps


@pytest.mark.parametrize(
    "field_name, value",
    [("num_generations", 1), ("joint_mode", "diagonal"), ("early_termination_threshold", float("nan"))],
)
def test_a_config_changed_after_construction_is_validated_by_the_trainer(field_name, value):
    args = MAGRPOConfig(num_turns=1, **FAST)
    setattr(args, field_name, value)
    with pytest.raises(ValueError, match=field_name):
        MAGRPOTrainer(env=DialogueEnv(Steps(1)), policies=tables(), args=args)


def test_validate_normalizes_values_set_after_construction():
    args = MAGRPOConfig(num_turns=1, **FAST)
    args.joint_mode = "crossed"
    args.agent_devices = "cpu"
    args.validate()
    assert args.joint_mode == "cross" and args.agent_devices == ["cpu", "cpu"]

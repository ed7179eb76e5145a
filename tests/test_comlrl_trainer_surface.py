"""The trainers of ``llm_marl.comlrl`` expose CoMLRL 1.4.3's public attributes with CoMLRL's types,
each the object llm_marl trains (issue 42.3; llm_marl/comlrl/trainer_surface.py); llm_marl's own
trainers keep agents by name.

CoMLRL's types, observed on its trainers built with the same keywords (comlrl==1.4.3 in a
separate virtualenv): ``agents``, ``optimizers``, ``tokenizers``, ``formatters``,
``reference_models``, ``agent_devices`` (and IAC's ``critics``, ``agent_optimizers``) are lists by
agent position, ``num_agents`` and ``env_step`` ints, ``model_name`` the ``agent_model`` string,
``device`` a ``torch.device``. ``env_step`` counts rewarded joint actions: one aligned item with
num_generations=2 adds 2 per turn.
"""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(1)

from llm_marl.comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer  # noqa: E402
from llm_marl.comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer, MARLOOConfig, MARLOOTrainer  # noqa: E402
from llm_marl.learners import IACConfig as NativeIACConfig  # noqa: E402
from llm_marl.learners import IACTrainer as NativeIACTrainer  # noqa: E402
from llm_marl.learners import MAGRPOConfig as NativeMAGRPOConfig  # noqa: E402
from llm_marl.learners import MAGRPOTrainer as NativeMAGRPOTrainer  # noqa: E402
from llm_marl.policies.tiny import build_tiny_model  # noqa: E402

ROWS = [{"prompt": "say"}]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", pretrain_steps=0))


def reward(first, second):
    return [float(len(a) % 2) for a in first]


def first_formatter(item):
    return item["prompt"] + " one"


def second_formatter(item):
    return item["prompt"] + " two"


def settings(tmp_path, **overrides):
    values = dict(num_turns=1, num_train_epochs=1, num_generations=2, max_new_tokens=2, eval_interval=0,
                  progress_bar=False, agent_learning_rate=1e-4, output_dir=str(tmp_path / "run"), seed=0)
    values.update(overrides)
    return values


def parameter_ids(optimizer):
    return {id(p) for group in optimizer.param_groups for p in group["params"]}


def test_magrpo_exposes_comlrl_attributes_backed_by_the_trained_objects(model_path, tmp_path):
    trainer = MAGRPOTrainer(agent_model=model_path, num_agents=2, reward_func=reward, train_dataset=ROWS,
                            formatters=[first_formatter, second_formatter],
                            args=MAGRPOConfig(**settings(tmp_path, reference_kl_enabled=True)))
    names = trainer.agent_ids
    assert names == ["agent_0", "agent_1"]
    assert type(trainer.agents) is list and len(trainer.agents) == 2
    for i, name in enumerate(names):
        model = trainer.agents[i]
        assert model is trainer.policies[name].model and isinstance(model, torch.nn.Module)
        optimizer = trainer.optimizers[i]
        assert optimizer is trainer.optimizer_by_agent[name]  # the optimizer that steps agent i
        assert parameter_ids(optimizer) == {id(p) for p in model.parameters() if p.requires_grad}
        assert trainer.reference_models[i] is trainer.reference_policies[name].model
        assert trainer.reference_models[i] is not model
        assert trainer.tokenizers[i] is trainer.policies[name].tokenizer
    assert type(trainer.optimizers) is list and type(trainer.reference_models) is list and type(trainer.tokenizers) is list
    assert trainer.tokenizer is trainer.tokenizers[0]
    assert type(trainer.num_agents) is int and trainer.num_agents == 2
    assert trainer.model_name == model_path
    assert trainer.reward_func is reward
    assert trainer.formatters == [first_formatter, second_formatter]
    assert trainer.reward_processor(3.5) == 3.5  # none given: identity
    assert trainer.train_dataset is ROWS and trainer.eval_dataset is None
    assert trainer.model_config == {} and trainer.external_transition is None and trainer.wandb_config is None
    assert trainer.agent_devices == [torch.device("cpu")] * 2 and trainer.device == torch.device("cpu")
    assert trainer.parallel_training == "none" and trainer.advantage_mode == "mean"
    assert type(trainer.env_step) is int and trainer.env_step == 0

    before = [p.detach().clone() for p in trainer.agents[0].parameters()]
    trainer.train()
    assert trainer.env_step == 2  # one item, G = 2 aligned joint actions, one turn
    assert trainer.optimizers[0].state  # the listed optimizer is the one that stepped agent 0
    assert any(not torch.equal(b, p) for b, p in zip(before, trainer.agents[0].parameters()))


def test_assigning_a_list_of_optimizers_replaces_them_by_agent_position(model_path, tmp_path):
    trainer = MARLOOTrainer(agent_model=model_path, num_agents=2, reward_func=reward, train_dataset=ROWS,
                            args=MARLOOConfig(**settings(tmp_path)))
    assert trainer.reference_models == []  # no reference KL: CoMLRL's empty list
    replacement = [torch.optim.SGD(model.parameters(), lr=0.1) for model in trainer.agents]
    trainer.optimizers = replacement
    assert trainer.optimizers == replacement
    assert trainer.optimizer_by_agent == {"agent_0": replacement[0], "agent_1": replacement[1]}
    with pytest.raises(ValueError, match="one optimizer per agent"):
        trainer.optimizers = replacement[:1]


def test_iac_critics_and_agent_optimizers_are_lists_by_agent_position(model_path, tmp_path):
    trainer = IACTrainer(agent_model=model_path, num_agents=2, reward_func=reward, train_dataset=ROWS,
                         args=IACConfig(**settings(tmp_path, num_generations=1, critic_learning_rate=1e-4)))
    assert type(trainer.critics) is list and len(trainer.critics) == 2
    for i, name in enumerate(trainer.agent_ids):
        assert trainer.critics[i] is trainer.critic_by_agent[name]
        assert parameter_ids(trainer.critic_optimizers[name]) == {id(p) for p in trainer.critics[i].parameters() if p.requires_grad}
    assert trainer.agent_optimizers == trainer.optimizers and trainer.agent_optimizers[1] is trainer.optimizer_by_agent["agent_1"]
    assert trainer.critic_type == "v"

    shared = IACTrainer(agent_model=model_path, num_agents=2, reward_func=reward, train_dataset=ROWS,
                        args=IACConfig(**settings(tmp_path, num_generations=1, use_separate_critic=False)))
    assert shared.critics == []  # value heads on the agents' own models: CoMLRL lists no critic


def test_maac_lists_its_one_central_critic(model_path, tmp_path):
    trainer = MAACTrainer(agent_model=model_path, num_agents=2, reward_func=reward, train_dataset=ROWS,
                          args=MAACConfig(**settings(tmp_path, num_generations=1, critic_learning_rate=1e-4)))
    assert len(trainer.critics) == 1 and trainer.critics[0] is trainer.critic_by_agent["critic"]
    assert len(trainer.agents) == trainer.num_agents == 2


def test_llm_marl_trainers_keep_agents_by_name(model_path, tmp_path):
    trainer = NativeMAGRPOTrainer(agent_model=model_path, num_agents=2, reward_func=reward, train_dataset=ROWS,
                                  args=NativeMAGRPOConfig(**settings(tmp_path)))
    assert trainer.agents == ["agent_0", "agent_1"]
    assert set(trainer.optimizers) == {"agent_0", "agent_1"} and trainer.optimizers is trainer.optimizer_by_agent
    critic_trainer = NativeIACTrainer(agent_model=model_path, num_agents=2, reward_func=reward, train_dataset=ROWS,
                                      args=NativeIACConfig(**settings(tmp_path, num_generations=1)))
    assert set(critic_trainer.critics) == {"agent_0", "agent_1"} and critic_trainer.critics is critic_trainer.critic_by_agent

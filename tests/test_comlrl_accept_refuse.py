"""The configs and trainers of ``llm_marl.comlrl`` accept what CoMLRL 1.4.3 accepts and refuse what
it refuses, with the same exception type (issue 42.4; docs/migrating.md, *Accepted and refused as
CoMLRL*).

Each expectation below is data: what CoMLRL 1.4.3 itself did with the same arguments, observed by
running them against the ``comlrl==1.4.3`` package from PyPI in a separate virtualenv (torch 2.13
CPU), not by importing it here. "accept" means the constructor returned; an exception class means it
raised that class (``pytest.raises`` also passes for a subclass). Where llm_marl deliberately
differs, docs/migrating.md lists the difference and the case is not here.
"""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(1)

from llm_marl.comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig  # noqa: E402
from llm_marl.comlrl.trainers.preference import MADPOConfig, MADPOIterConfig, MARLHFConfig, MARLHFIterConfig  # noqa: E402
from llm_marl.comlrl.trainers.reinforce import (  # noqa: E402
    MAGRPOConfig,
    MAGRPOTrainer,
    MAREINFORCEConfig,
    MARLOOConfig,
    MAReMaxConfig,
)
from llm_marl.comlrl.trainers.reinforce.centralized_magrpo import CentralizedMAGRPOConfig  # noqa: E402
from llm_marl.policies.tiny import build_tiny_model  # noqa: E402

REINFORCE = (MAGRPOConfig, MAREINFORCEConfig, MARLOOConfig, MAReMaxConfig)
PREFERENCE = (MADPOConfig, MARLHFConfig, MADPOIterConfig, MARLHFIterConfig, CentralizedMAGRPOConfig)
ACTOR_CRITIC = (IACConfig, MAACConfig)

# (config class, keywords, what CoMLRL 1.4.3 did)
CONFIG_CASES = [
    # joint_mode: any case, "align", and any value at all with one agent
    *[(cls, {"joint_mode": mode}, "accept") for cls in REINFORCE for mode in ("align", "aligned", "Aligned", "ALIGNED", "CROSS", "Cross", "crossed")],
    *[(cls, {"joint_mode": mode, "num_agents": 1}, "accept") for cls in REINFORCE for mode in ("bogus", "", "CROSS")],
    *[(cls, {"joint_mode": mode}, "accept") for cls in (MADPOConfig, MARLHFConfig, CentralizedMAGRPOConfig) for mode in ("align", "Aligned")],
    # advantage_mode in any case
    (MAGRPOConfig, {"advantage_mode": "MEAN"}, "accept"),
    (MARLOOConfig, {"advantage_mode": "Rloo"}, "accept"),
    (MAReMaxConfig, {"advantage_mode": "MAX"}, "accept"),
    (MAREINFORCEConfig, {"advantage_mode": "Raw"}, "accept"),
    # num_train_epochs: at least 1, except for the actor-critic configs
    *[(cls, {"num_train_epochs": 0}, ValueError) for cls in REINFORCE + PREFERENCE],
    *[(cls, {"num_train_epochs": 1}, "accept") for cls in REINFORCE + PREFERENCE],
    *[(cls, {"num_train_epochs": 0}, "accept") for cls in ACTOR_CRITIC],
    # parallel_training: None and "" mean "none"; "mp" needs the devices of every model it places
    *[(cls, {"parallel_training": value}, "accept") for cls in REINFORCE + ACTOR_CRITIC for value in (None, "", "NULL", "None")],
    *[(cls, {"parallel_training": "mp", "agent_devices": "cpu"}, ValueError) for cls in ACTOR_CRITIC],
    *[(cls, {"parallel_training": "mp", "agent_devices": "cpu", "critic_devices": "cpu"}, "accept") for cls in ACTOR_CRITIC],
    (IACConfig, {"parallel_training": "mp", "agent_devices": "cpu", "use_separate_critic": False}, "accept"),
    (MAGRPOConfig, {"parallel_training": "mp", "agent_devices": "cpu"}, "accept"),
    # actor-critic: several turns take one generation; critic_type in any case, None or "" for "v"
    *[(cls, {"num_turns": 2, "num_generations": 2}, ValueError) for cls in ACTOR_CRITIC],
    *[(cls, {"num_generations": 2}, ValueError) for cls in ACTOR_CRITIC],  # CoMLRL's default num_turns is 2
    *[(cls, {"num_turns": 1, "num_generations": 2}, "accept") for cls in ACTOR_CRITIC],
    *[(cls, {"critic_type": value}, "accept") for cls in ACTOR_CRITIC for value in ("Q", "V", None, "")],
    # MARLHF's actor-critic fields
    *[(cls, {name: value}, ValueError) for cls in (MARLHFConfig, MARLHFIterConfig)
      for name, value in (("critic_learning_rate", 0), ("critic_learning_rate", -1), ("value_loss_coef", 0.0),
                          ("value_clip_range", 0.0), ("critic_type", "x"))],
    *[(cls, {"critic_type": "Q"}, "accept") for cls in (MARLHFConfig, MARLHFIterConfig)],
    # a value of the wrong type: CoMLRL's comparison raises TypeError
    *[(cls, {"train_batch_size": "x"}, TypeError) for cls in REINFORCE + ACTOR_CRITIC],
]


def _case_id(case):
    cls, options, expected = case
    return f"{cls.__name__}({options})->{getattr(expected, '__name__', expected)}"


@pytest.mark.parametrize("case", CONFIG_CASES, ids=[_case_id(case) for case in CONFIG_CASES])
def test_config_accepts_and_refuses_as_comlrl(case):
    cls, options, expected = case
    if expected == "accept":
        cls(**options)
    else:
        with pytest.raises(expected):
            cls(**options)


def test_comlrl_spellings_are_read_as_their_canonical_values():
    assert MAGRPOConfig(joint_mode="align").joint_mode == "aligned"
    assert MAGRPOConfig(joint_mode="CROSS").joint_mode == "cross"
    assert MAGRPOConfig(joint_mode="bogus", num_agents=1).joint_mode == "aligned"  # one agent: no joint choice
    assert MARLOOConfig(advantage_mode="RLOO").advantage_mode == "rloo"
    assert IACConfig(critic_type=None).critic_type == "v" and IACConfig(critic_type="Q").critic_type == "q"
    assert MAGRPOConfig(parallel_training=None).parallel_training == "none"
    # CoMLRL fills train_batch_size from rollout_buffer_size when it is None
    assert MAGRPOConfig(rollout_buffer_size=3).train_batch_size == 3
    assert IACConfig(rollout_buffer_size=5, train_batch_size=2).train_batch_size == 2


def test_refusals_name_the_field():
    with pytest.raises(ValueError, match="num_train_epochs"):
        MAGRPOConfig(num_train_epochs=0)
    with pytest.raises(ValueError, match="critic_devices"):
        MAACConfig(parallel_training="mp", agent_devices="cpu")
    with pytest.raises(ValueError, match="num_generations"):
        IACConfig(num_turns=2, num_generations=2)


@pytest.mark.parametrize("cls", (MAGRPOConfig, IACConfig, MAACConfig))
def test_refusal_messages_carry_comlrl_wording(cls):
    """Scripts (and CoMLRL's own tests) match these phrases of CoMLRL's messages."""
    options = {"num_generations": 2} if cls is MAGRPOConfig else {}
    with pytest.raises(ValueError, match=r"reference_devices length is 3"):
        cls(num_agents=2, reference_kl_enabled=True, reference_devices=["cpu"] * 3, **options)
    with pytest.raises(ValueError, match="centralized collaboration"):
        CentralizedMAGRPOConfig(collaboration_mode="decentralized")
    with pytest.raises(ValueError, match="num_turns=1"):
        CentralizedMAGRPOConfig(num_turns=2)


def test_centralized_iterative_config_refuses_another_actor_index():
    with pytest.raises(ValueError, match="comparator_centralized_agent_index must be actor index 0"):
        MADPOIterConfig(collaboration_mode="centralized", comparator_centralized_agent_index=1)
    assert MADPOIterConfig(comparator_centralized_agent_index=1).comparator_centralized_agent_index == 1  # decentralized: unused


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", pretrain_steps=0))


def _reward(first, second):
    return [0.0] * len(first)


def _args(tmp_path, **options):
    return MAGRPOConfig(num_turns=1, output_dir=str(tmp_path / "run"), progress_bar=False, **options)


def test_trainer_without_any_dataset_is_built_and_refuses_to_train(model_path, tmp_path):
    # CoMLRL 1.4.3 builds it; its train() raises ValueError (no train_dataset), evaluate() returns {}
    trainer = MAGRPOTrainer(agent_model=model_path, num_agents=2, reward_func=_reward, args=_args(tmp_path))
    with pytest.raises(ValueError, match="train_dataset"):
        trainer.train()
    with pytest.warns(UserWarning, match="evaluation skipped"):
        assert trainer.evaluate() == {}
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())  # nothing written


def test_agent_model_with_matching_agent_names_is_accepted(model_path, tmp_path):
    # CoMLRL 1.4.3: accepted; each agent is loaded from its own entry
    trainer = MAGRPOTrainer(agent_model=model_path, agents=[model_path, model_path], num_agents=2,
                            reward_func=_reward, train_dataset=[{"prompt": "a"}], args=_args(tmp_path))
    first, second = (trainer.policies[a].model for a in ("agent_0", "agent_1"))
    assert first is not second
    assert all(torch.equal(p, q) for p, q in zip(first.parameters(), second.parameters()))


@pytest.mark.parametrize(
    "agents, match",
    [("other", "conflict"), ("one", "agents length")],
    ids=["names_conflict", "length_mismatch"],
)
def test_agent_model_with_inconsistent_agents_is_refused(model_path, tmp_path, agents, match):
    # CoMLRL 1.4.3: ValueError ("... conflict", "agents length (1) must match ...")
    names = [model_path, str(tmp_path / "other")] if agents == "other" else [model_path]
    with pytest.raises(ValueError, match=match):
        MAGRPOTrainer(agent_model=model_path, agents=names, num_agents=2, reward_func=_reward,
                      train_dataset=[{"prompt": "a"}], args=_args(tmp_path))


def test_neither_agent_model_nor_agents_is_refused(tmp_path):
    with pytest.raises(ValueError, match="Either agent_model or agents"):
        MAGRPOTrainer(reward_func=_reward, train_dataset=[{"prompt": "a"}], args=_args(tmp_path))


@pytest.mark.parametrize("mode", ["align", "Aligned", "CROSS", "bogus"])
def test_one_agent_trainer_accepts_any_joint_mode(model_path, tmp_path, mode):
    trainer = MAGRPOTrainer(agent_model=model_path, num_agents=1, reward_func=lambda a: [0.0] * len(a),
                            train_dataset=[{"prompt": "a"}], args=_args(tmp_path, num_agents=1, joint_mode=mode))
    assert trainer.args.joint_mode == "aligned"


def test_iac_trainer_mp_without_critic_devices_is_refused(model_path, tmp_path):
    with pytest.raises(ValueError, match="critic_devices"):
        IACTrainer(agent_model=model_path, num_agents=2, reward_func=_reward, train_dataset=[{"prompt": "a"}],
                   args=IACConfig(num_turns=1, parallel_training="mp", agent_devices="cpu", output_dir=str(tmp_path)))

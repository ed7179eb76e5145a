"""Centralized MAGRPO (docs/preference.md §4): one policy writes every role's answer; the
adapter builds its prompt and splits its answer for the env's reward and for evaluation."""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(1)

from llm_marl.envs import make  # noqa: E402
from llm_marl.learners.reinforce.centralized import (  # noqa: E402
    CentralizedEnv,
    CentralizedMAGRPOConfig,
    CentralizedMAGRPOTrainer,
    TaggedCentralizedComparatorAdapter,
)
from llm_marl.policies.tabular import TabularPolicy  # noqa: E402
from llm_marl.tasks.matrix import CLIMBING  # noqa: E402

MENU = ("alpha", "beta", "gamma")
JOINT = [f"<agent_0>{a}</agent_0><agent_1>{b}</agent_1>" for a in MENU for b in MENU]


def test_the_joint_answer_is_split_per_role_for_the_shared_reward():
    env = CentralizedEnv(make("ClimbingGame-v0"))
    observations, _ = env.reset(options={"index": 0})
    assert env.possible_agents == ["actor"] and list(observations) == ["actor"]
    prompt = observations["actor"]
    assert "Agent 0 original prompt:\nClimbingGame: you are row." in prompt and "Agent 1 original prompt:\nClimbingGame: you are column." in prompt
    rewards = {}
    for text in ("<agent_0>alpha</agent_0> <AGENT_1> beta </agent_1>", "<agent_1>alpha</agent_1>", "no tags at all"):
        twin = env.fork()
        _, reward, terminated, _, infos = twin.step({"actor": text})
        rewards[text] = (reward["actor"], infos["actor"]["role_answers"])
        assert terminated == {"actor": True}
    assert rewards["<agent_0>alpha</agent_0> <AGENT_1> beta </agent_1>"] == (CLIMBING[0][1], {"row": "alpha", "column": "beta"})
    assert rewards["<agent_1>alpha</agent_1>"] == (-30.0, {"row": "", "column": "alpha"})  # a missing role: invalid answer
    assert rewards["no tags at all"] == (-30.0, {"row": "", "column": ""})


def test_one_joint_policy_finds_the_climbing_optimum():
    found = 0
    for seed in range(3):
        policy = TabularPolicy(JOINT)
        args = CentralizedMAGRPOConfig(num_train_epochs=30, agent_learning_rate=0.3, num_generations=4, rollout_buffer_size=1,
                                       eval_interval=0, progress_bar=False, seed=seed)
        trainer = CentralizedMAGRPOTrainer(env=make("ClimbingGame-v0"), policy=policy, args=args)
        trainer.train()
        assert trainer.args.num_agents == 1 and trainer.role_args.num_agents == 2
        observations, _ = trainer.env.reset(options={"index": 0})
        found += policy.probabilities(observations["actor"])[0].item() > 0.9  # (alpha, alpha) = 11
    assert found >= 2


def test_evaluation_splits_the_joint_answer_too():
    env = make("ClimbingGame-v0")
    trainer = CentralizedMAGRPOTrainer(env=env, policy=TabularPolicy(JOINT[:1]), eval_env=make("ClimbingGame-v0"),
                                       args=CentralizedMAGRPOConfig(num_train_epochs=1, eval_interval=0, progress_bar=False))
    assert trainer.evaluate(1)["eval/turn_1/reward_mean"] == 11.0


def test_errors_name_the_problem():
    env = make("ClimbingGame-v0")
    with pytest.raises(ValueError, match="ONE policy for every role; got 2"):
        CentralizedMAGRPOTrainer(env=env, policies=[TabularPolicy(JOINT), TabularPolicy(JOINT)], args=CentralizedMAGRPOConfig())
    with pytest.raises(ValueError, match="num_agents is 3 \\(the roles\\) but the env has 2 roles"):
        CentralizedMAGRPOTrainer(env=env, policy=TabularPolicy(JOINT), args=CentralizedMAGRPOConfig(num_agents=3))
    with pytest.raises(TypeError, match="centralized_adapter.build_prompt must be callable \\(got object\\)"):
        CentralizedMAGRPOTrainer(env=env, policy=TabularPolicy(JOINT), centralized_adapter=object())
    with pytest.raises(ValueError, match="num_turns must be 1"):
        CentralizedMAGRPOConfig(num_turns=2)
    with pytest.raises(ValueError, match="collaboration_mode must be 'centralized'"):
        CentralizedMAGRPOConfig(collaboration_mode="decentralized")

    class Short(TaggedCentralizedComparatorAdapter):
        def parse_completion(self, completion, batch_item, num_agents):
            return ["one"]

    bad = CentralizedEnv(make("ClimbingGame-v0"), Short())
    bad.reset(options={"index": 0})
    with pytest.raises(ValueError, match="must return 2 strings \\(one per role \\['row', 'column'\\]\\)"):
        bad.step({"actor": "x"})


# --- centralized MADPO and MARLHF -------------------------------------------------------------


def test_centralized_madpo_trains_one_joint_policy_on_joint_pairs():
    from llm_marl.learners.preference.madpo import MADPOConfig, MADPOTrainer

    rewards = []  # measured: E[reward] 10.10 / 8.91 / 9.91 (uniform -3.44; the best joint action but (alpha, alpha) earns 7)
    for seed in range(3):
        policy = TabularPolicy(JOINT)
        args = MADPOConfig(collaboration_mode="centralized", num_train_epochs=15, agent_learning_rate=0.3, preference_num_candidates=8,
                           preference_pairs_per_sample=8, dpo_beta=0.5, rollout_buffer_size=1, eval_interval=0, progress_bar=False, seed=seed)
        trainer = MADPOTrainer(env=make("ClimbingGame-v0"), policies=[policy], args=args)
        assert trainer.agents == ["actor"] and trainer.roles == ["row", "column"] and trainer.role_args.num_agents == 2
        trainer.train()
        observations, _ = trainer.env.reset(options={"index": 0})
        p = policy.probabilities(observations["actor"]).tolist()
        rewards.append(sum(p[3 * i + j] * CLIMBING[i][j] for i in range(3) for j in range(3)))
    assert all(r > 8.0 for r in rewards), rewards
    with pytest.raises(ValueError, match="MADPOTrainer trains ONE policy for every role; got 2"):
        MADPOTrainer(env=make("ClimbingGame-v0"), policies=[TabularPolicy(JOINT), TabularPolicy(JOINT)],
                     args=MADPOConfig(collaboration_mode="centralized"))


def test_centralized_marlhf_scores_the_joint_text():
    from llm_marl.learners.preference.reward_model import MARLHFConfig, MARLHFTrainer

    args = MARLHFConfig(collaboration_mode="centralized", num_train_epochs=2, preference_num_candidates=6, preference_pairs_per_sample=None,
                        pair_selection="all", reward_learning_rate=0.05, reward_num_train_epochs=5, num_generations=2, eval_interval=0,
                        progress_bar=False, seed=0)
    trainer = MARLHFTrainer(env=make("ClimbingGame-v0"), policies={"actor": TabularPolicy(JOINT)}, args=args)
    trainer.train()
    assert trainer.reward_phase.done and trainer.state.global_step >= 1
    winner, _ = trainer.reward_pairs[0]
    assert "[Agent 0] You are a centralized coordinator" in winner and "<agent_0>" in winner

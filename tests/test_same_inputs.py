"""One input for every model of an agent (issue 34): the actor, its frozen reference, its critic
and MARLHF's reward model read the same token ids for the same observation — the chat template
and system prompt included — and Q(h, a) and the reward model read the actor's answer tokens.

On the main before issue 34 the LM critic tokenized ``str(observation)`` (no template, no system
prompt; item 5) and the reward model re-tokenized the raw observation text.
"""

from __future__ import annotations

import copy

import datasets
import pytest
import torch

torch.set_num_threads(1)

from llm_marl.envs.dialogue import DialogueEnv  # noqa: E402
from llm_marl.learners import IACConfig, IACTrainer, MAGRPOConfig, MAGRPOTrainer  # noqa: E402
from llm_marl.learners.preference.reward_model import MARLHFConfig, MARLHFTrainer  # noqa: E402
from llm_marl.learners.tree import collect_trees  # noqa: E402
from llm_marl.policies import scoring  # noqa: E402
from llm_marl.policies.causal_lm import CausalLMPolicy  # noqa: E402
from llm_marl.tasks.base import CooperativeTask  # noqa: E402
from tiny_chat_model import chat_tokenizer, tiny_llama  # noqa: E402

SYSTEM = "Answer briefly."


class Ask(CooperativeTask):
    agents = ("left", "right")
    num_turns = 1

    def dataset(self, split):
        return datasets.Dataset.from_list([{"id": 0}])

    def initial_observations(self, item):
        return {"left": "Write one sentence about the sea.", "right": "Write one sentence about the weather."}

    def reward(self, item, actions, history):
        return float(len(actions["left"]))


@pytest.fixture(scope="module")
def team():
    tokenizer = chat_tokenizer()
    model = tiny_llama(tokenizer)
    return model, tokenizer


def policies(team):
    model, tokenizer = team
    return [CausalLMPolicy(copy.deepcopy(model), tokenizer, max_new_tokens=4, temperature=1.0, top_p=None, top_k=None, system_prompt=SYSTEM)
            for _ in range(2)]


def scored_prompts(policy, observation, completion, monkeypatch):
    """The prompt ids the policy's scoring pass really runs for ``observation``."""
    seen = []
    score = scoring.token_log_probs

    def spy(runner, prompts, answers, **kw):
        seen.extend(list(p) for p in prompts)
        return score(runner, prompts, answers, **kw)

    monkeypatch.setattr(scoring, "token_log_probs", spy)
    with torch.no_grad():
        policy.log_probs([observation], [completion])
    monkeypatch.setattr(scoring, "token_log_probs", score)
    return seen[0]


def templated(tokenizer, observation):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": observation}]
    return list(tokenizer(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False), add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("use_separate_critic", [True, False])
def test_actor_reference_and_critic_read_the_same_prompt_ids(team, monkeypatch, use_separate_critic):
    model, tokenizer = team
    env = DialogueEnv(Ask())
    args = IACConfig(num_turns=1, num_generations=2, critic_type="q", use_separate_critic=use_separate_critic, reference_kl_enabled=True,
                     num_train_epochs=1, eval_interval=0, progress_bar=False, seed=0)
    trainer = IACTrainer(env=env, policies=policies(team), args=args)
    [node] = collect_trees(env, trainer.policies, [0], trainer.args, seed=1)
    for agent in trainer.agents:
        observation, completion = node.observations[agent], node.completions[agent][0]
        expected = templated(tokenizer, observation)
        assert SYSTEM in tokenizer.decode(expected) and "assistant" in tokenizer.decode(expected)
        assert scored_prompts(trainer.policies[agent], observation, completion, monkeypatch) == expected
        assert scored_prompts(trainer.reference_policies[agent], observation, completion, monkeypatch) == expected
        critic = trainer.critics[agent]
        assert critic.input_ids(observation) == expected  # main: 19 raw tokens, no template (item 5)
        assert critic.input_ids(observation, completion) == expected + list(completion.token_ids)


def test_magrpo_reference_reads_the_actors_prompt_ids(team, monkeypatch):
    model, tokenizer = team
    env = DialogueEnv(Ask())
    trainer = MAGRPOTrainer(env=env, policies=policies(team), args=MAGRPOConfig(num_turns=1, num_generations=2, reference_kl_enabled=True, num_train_epochs=1,
                                                                                 eval_interval=0, progress_bar=False))
    [node] = collect_trees(env, trainer.policies, [0], trainer.args, seed=1)
    for agent in trainer.agents:
        observation, completion = node.observations[agent], node.completions[agent][0]
        assert scored_prompts(trainer.reference_policies[agent], observation, completion, monkeypatch) == \
            scored_prompts(trainer.policies[agent], observation, completion, monkeypatch) == templated(tokenizer, observation)


def test_the_reward_model_reads_each_actors_prompt_and_answer_ids(team, monkeypatch):
    model, tokenizer = team
    env = DialogueEnv(Ask())
    trainer = MARLHFTrainer(env=env, policies=policies(team), args=MARLHFConfig(num_generations=2, preference_num_candidates=2, num_train_epochs=1,
                                                                                eval_interval=0, progress_bar=False))
    [node] = collect_trees(env, trainer.policies, [0], trainer.args, seed=1)
    text = trainer._joint_text(node, 0)
    prompts = [ids for role, _, ids in text.pieces if role == "prompt"]
    answers = [ids for role, _, ids in text.pieces if role == "answer"]
    [row] = trainer.reward_model.encode([text])
    for k, agent in enumerate(trainer.agents):
        observation, completion = node.observations[agent], node.completions[agent][node.joint[0][k]]
        expected = scored_prompts(trainer.policies[agent], observation, completion, monkeypatch)
        assert list(prompts[k]) == expected == templated(tokenizer, observation)
        assert list(answers[k]) == list(completion.token_ids)
        for ids in (expected, list(completion.token_ids)):  # both appear whole in what the model reads
            assert any(row[i : i + len(ids)] == ids for i in range(len(row)))

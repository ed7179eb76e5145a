"""MARLHF's reward model reads what it scores, and only that (issue 34, items 1-4 and 8).

Each test fails on the main before issue 34:
1. a joint text scored next to a longer one scored differently (left padding, no positions);
2. ``reward_max_length`` cut the answers off (two different joint answers, one score), and
   without it a joint text longer than the model's 256 positions raised IndexError;
3. a bf16 agent's default reward model was a bf16 copy (it barely trains at lr 1e-5);
4. MARLHF with rl_algorithm "iac"/"maac" averaged per-agent rewards without a word;
8. the reward model was in train mode until its first fit (dropout changed its scores).
"""

from __future__ import annotations

import copy

import datasets
import pytest
import torch

torch.set_num_threads(1)

from llm_marl.envs.dialogue import DialogueEnv  # noqa: E402
from llm_marl.learners.preference.reward_model import JointRewardModel, JointText, MARLHFConfig, MARLHFTrainer, fit_pieces  # noqa: E402
from llm_marl.learners.tree import collect_trees  # noqa: E402
from llm_marl.policies.causal_lm import CausalLMPolicy  # noqa: E402
from llm_marl.policies.tabular import TabularPolicy  # noqa: E402
from llm_marl.policies.tiny import load_tiny  # noqa: E402
from llm_marl.tasks.base import CooperativeTask  # noqa: E402
from tiny_chat_model import chat_tokenizer, tiny_llama  # noqa: E402

TEXTS = ["a short one", "the sea is wide and the ship is small, " * 3, "x", "write one sentence about the weather today please"]


class Talk(CooperativeTask):
    """Two agents answer a prompt (``words`` phrases, two more per item); the reward counts the first agent's words."""

    agents = ("left", "right")
    num_turns = 1

    def __init__(self, words: int = 5, num_items: int = 2):
        self.words, self.num_items = words, num_items

    def dataset(self, split):
        return datasets.Dataset.from_list([{"id": i} for i in range(self.num_items)])

    def initial_observations(self, item):
        return {a: f"item {item['id']} for {a}: " + " ".join(["tell me about the sea"] * (self.words + 2 * item["id"])) for a in self.agents}

    def reward(self, item, actions, history):
        return float(len(actions["left"].split()))


@pytest.fixture(scope="module")
def gpt2():
    return load_tiny()


@pytest.fixture(scope="module")
def llama():
    tokenizer = chat_tokenizer()
    return tiny_llama(tokenizer), tokenizer


def policies(gpt2, **settings):
    model, tokenizer = gpt2
    options = dict(max_new_tokens=5, temperature=1.0, top_p=None, top_k=None)
    options.update(settings)
    return [CausalLMPolicy(copy.deepcopy(model), tokenizer, **options) for _ in range(2)]


def marlhf(gpt2, task=None, **overrides):
    settings = dict(num_train_epochs=1, preference_num_candidates=2, preference_pairs_per_sample=1, num_generations=2,
                    reward_num_train_epochs=1, eval_interval=0, progress_bar=False, seed=0)
    settings.update(overrides)
    return MARLHFTrainer(env=DialogueEnv(task or Talk()), policies=policies(gpt2), args=MARLHFConfig(**settings))


def alone_and_batched(model, texts):
    with torch.no_grad():
        batched = model.scores(texts).tolist()
        alone = [model.scores([t]).item() for t in texts]
    return alone, batched


@pytest.mark.parametrize("which", ["gpt2", "llama"])
def test_a_text_scores_the_same_alone_and_next_to_longer_ones(which, gpt2, llama):
    """Item 1: tiny GPT-2 (absolute positions, left-padding tokenizer) and tiny Llama (rotary,
    right-padding tokenizer)."""
    model, tokenizer = gpt2 if which == "gpt2" else llama
    reward_model = JointRewardModel(model, tokenizer=tokenizer, seed=0)
    alone, batched = alone_and_batched(reward_model, TEXTS)
    assert batched == pytest.approx(alone, abs=1e-5)
    assert len(set(round(s, 4) for s in alone)) == len(TEXTS)  # the texts do score differently


def test_reward_max_length_keeps_the_answers(gpt2):
    """Item 2: with 16 tokens, prompts are cut (from their left) before any answer token."""
    trainer = marlhf(gpt2, reward_max_length=16)
    [node] = collect_trees(trainer.env, trainer.policies, [0], trainer.args, seed=1)
    texts = [trainer._joint_text(node, j) for j in range(len(node.joint))]
    assert len({tuple(node.completions[a][node.joint[j][p]].token_ids for p, a in enumerate(trainer.agent_ids)) for j in range(len(texts))}) > 1
    rows = trainer.reward_model.encode(texts)
    for j, ids in enumerate(rows):
        first, second = (list(node.completions[a][node.joint[j][p]].token_ids) for p, a in enumerate(trainer.agent_ids))
        assert len(ids) <= 16 and ids[-len(second) :] == second
        assert any(ids[i : i + len(first)] == first for i in range(len(ids)))
    scores = trainer.reward_model_scores([node])[0]
    assert len(set(scores)) == len({tuple(r) for r in rows}) > 1


def test_a_joint_text_longer_than_the_model_is_cut_to_fit_and_keeps_its_answers(gpt2):
    """Item 2: `llm-marl train --model tiny --learner marlhf` crashed with IndexError (269-token
    joint texts for a 256-position model)."""
    trainer = marlhf(gpt2, task=Talk(words=40))
    [node] = collect_trees(trainer.env, trainer.policies, [0], trainer.args, seed=1)
    scores = trainer.reward_model_scores([node])[0]  # main: IndexError: index out of range in self
    assert len(scores) == len(node.joint)
    text = trainer._joint_text(node, 0)
    full = sum(len(ids) if ids is not None else 0 for _, _, ids in text.pieces)
    assert full > 256
    [ids] = trainer.reward_model.encode([text])
    assert len(ids) <= 256
    answer = list(node.completions["right"][node.joint[0][1]].token_ids)
    assert ids[-len(answer) :] == answer


def test_fit_pieces_cuts_prompts_from_the_left_then_frames_never_answers():
    pieces = [("frame", [1, 2]), ("prompt", list(range(10, 20))), ("frame", [3]), ("prompt", [30, 31, 32]), ("frame", [4]),
              ("answer", [7, 8]), ("frame", [5]), ("answer", [9])]
    assert fit_pieces(pieces, None) == fit_pieces(pieces, 21) == [t for _, ids in pieces for t in ids]
    assert fit_pieces(pieces, 14) == [1, 2, 17, 18, 19, 3, 30, 31, 32, 4, 7, 8, 5, 9]
    assert fit_pieces(pieces, 5) == [7, 8, 9]
    with pytest.raises(ValueError, match="answers take 3 tokens, over its limit of 2"):
        fit_pieces(pieces, 2)


def test_joint_text_is_a_string_that_pickles_with_its_pieces():
    import pickle

    text = JointText([("frame", "[Agent 0] ", None), ("prompt", "hi", [5, 6]), ("answer", " yes", None)])
    assert text == "[Agent 0] hi yes" and isinstance(text, str)
    again = pickle.loads(pickle.dumps(text))
    assert again == text and again.pieces == text.pieces


def test_comlrl_path_interleaves_each_prompt_with_its_answer(gpt2):
    """CoMLRL's reward-model text: "Agent k prompt:" then "Agent k response:", agent by agent."""
    from llm_marl.comlrl.trainers import MARLHFConfig as CoMLRLConfig, MARLHFTrainer as CoMLRLTrainer

    args = CoMLRLConfig(num_train_epochs=1, preference_num_candidates=2, num_generations=2, eval_interval=0, progress_bar=False, seed=0)
    trainer = CoMLRLTrainer(env=DialogueEnv(Talk()), policies=policies(gpt2), args=args)
    [node] = collect_trees(trainer.env, trainer.policies, [0], trainer.args, seed=1)
    text = trainer._joint_text(node, 0)
    answers = [node.completions[a][node.joint[0][p]].text for p, a in enumerate(trainer.agent_ids)]
    prompts = [node.observations[a] for a in trainer.agent_ids]
    assert text == (f"Joint multi-agent response\n\nAgent 1 prompt:\n{prompts[0]}\n\nAgent 1 response:\n{answers[0]}"
                    f"\n\nAgent 2 prompt:\n{prompts[1]}\n\nAgent 2 response:\n{answers[1]}")
    assert trainer.reward_model.truncation_side == "right"


def test_a_bf16_agents_default_reward_model_trains_in_float32(gpt2):
    """Item 3: main copied the bf16 model (12.6% of its weights moved at lr 1e-5)."""
    model, tokenizer = load_tiny()
    model = model.to(torch.bfloat16)
    trainer = MARLHFTrainer(env=DialogueEnv(Talk()), policies=[CausalLMPolicy(copy.deepcopy(model), tokenizer, max_new_tokens=3) for _ in range(2)],
                            args=MARLHFConfig(num_train_epochs=1, preference_num_candidates=2, num_generations=2, eval_interval=0, progress_bar=False))
    assert {p.dtype for p in trainer.reward_model.parameters()} == {torch.float32}
    assert {next(trainer.policies[a].model.parameters()).dtype for a in trainer.agent_ids} == {torch.bfloat16}  # the agents' models are untouched


def test_marlhf_with_an_actor_critic_rl_phase_refuses_per_agent_rewards():
    """Item 4: main averaged the agents' rewards without a word."""

    class Split(Talk):
        def reward(self, item, actions, history):
            return {"left": 1.0, "right": float(len(actions["right"]))}

    for algorithm in ("iac", "maac"):
        args = MARLHFConfig(rl_algorithm=algorithm, num_train_epochs=1, preference_num_candidates=2, num_generations=2, eval_interval=0,
                            progress_bar=False)
        trainer = MARLHFTrainer(env=DialogueEnv(Split()), policies=[TabularPolicy(("a", "bb", "ccc")), TabularPolicy(("a", "bb", "ccc"))], args=args)
        with pytest.raises(ValueError, match=f"agents got different rewards .*MARLHF{algorithm.upper()}Trainer uses one shared reward") as info:
            trainer.train()
        assert "\n" not in str(info.value) and "MARLHF, whatever their rl_algorithm" in str(info.value)


def test_the_reward_model_is_in_eval_mode_except_while_it_is_fit(gpt2):
    """Item 8: a backbone with dropout scored at random before the first fit (and on resume)."""
    from transformers import AutoModelForCausalLM

    model, tokenizer = gpt2
    dropout = AutoModelForCausalLM.from_config(model.config.__class__(**{**model.config.to_dict(), "resid_pdrop": 0.5, "embd_pdrop": 0.5}))
    reward_model = JointRewardModel(dropout, tokenizer=tokenizer, seed=0)
    assert not reward_model.training and not any(m.training for m in reward_model.modules())
    first, second = (reward_model.scores(TEXTS[:2]).tolist() for _ in range(2))
    assert first == second
    trainer = marlhf(gpt2)
    assert not trainer.reward_model.training
    seen = []
    original = trainer.reward_model_loss
    trainer.reward_model_loss = lambda pairs: (seen.append(trainer.reward_model.training), original(pairs))[1]
    trainer._learn_reward_model()
    assert seen and all(seen) and not trainer.reward_model.training


def test_must_show_a_fitted_reward_model_scores_every_joint_answer_alone_as_in_a_batch(gpt2):
    """A MARLHF run on the tiny GPT-2: the reward model is fit, then used by the RL phase; every
    joint answer it was fit on or scored scores the same alone and in one batch of all of them."""
    trainer = marlhf(gpt2, reward_learning_rate=1e-3, num_generations=3)
    before = {k: v.clone() for k, v in trainer.reward_model.state_dict().items()}
    used = []
    original = trainer.reward_model_scores
    trainer.reward_model_scores = lambda nodes: (used.extend(trainer._joint_text(n, j) for n in nodes for j in range(len(n.joint))), original(nodes))[1]
    trainer.train()
    assert trainer.reward_phase.done and trainer.state.global_step >= 1 and used
    assert any(not torch.equal(before[k], v) for k, v in trainer.reward_model.state_dict().items())  # fitted
    texts = [t for pair in trainer.reward_pairs for t in pair] + used
    assert len({len(r) for r in trainer.reward_model.encode(texts)}) > 1  # the batch pads some rows
    alone, batched = alone_and_batched(trainer.reward_model, texts)
    assert batched == pytest.approx(alone, abs=1e-5)

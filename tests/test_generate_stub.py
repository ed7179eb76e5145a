"""A ``generate`` the script sets on its model (``model.generate = stub``, as CoMLRL's own tests
inject completions) is what llm_marl samples with: called once per prompt with
``num_return_sequences``, its rows (prompt + answer) are the answers the reward sees and the
trainer scores. Without a replaced ``generate`` the policy's own decode loop samples."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

from llm_marl.policies.causal_lm import CausalLMPolicy

WORDS = ["<pad>", "<eos>", "<unk>", "hello", "good", "bad", "task"]


def word_tokenizer():
    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    backend.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def tiny_model(tokenizer):
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=8, n_layer=1, n_head=1,
                                      bos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id))


def stub(model, tokenizer, answers, calls):
    """``model.generate`` replaced: row i of a call answers ``answers[i % len(answers)]``."""
    def generate(*, input_ids, num_return_sequences, **kwargs):
        calls.append((input_ids.shape[0], num_return_sequences))
        rows = [tokenizer.encode(answers[i % len(answers)] + " <eos>") for i in range(num_return_sequences)]
        width = max(map(len, rows))
        rows = [torch.cat([input_ids[0], torch.tensor(r + [tokenizer.pad_token_id] * (width - len(r)))]) for r in rows]
        return SimpleNamespace(sequences=torch.stack(rows))

    model.generate = generate


def test_the_policy_samples_with_a_replaced_generate_one_prompt_a_call():
    tokenizer = word_tokenizer()
    model = tiny_model(tokenizer)
    calls = []
    stub(model, tokenizer, ["good", "bad bad"], calls)
    policy = CausalLMPolicy(model, tokenizer, max_new_tokens=4)
    assert policy.generate_replaced
    answers = policy.sample(["hello", "task task"], 3)
    assert [[c.text for c in row] for row in answers] == [["good", "bad bad", "good"]] * 2
    assert calls == [(1, 3), (1, 3)]  # one prompt a call, n answers each
    eos = tokenizer.eos_token_id
    assert list(answers[0][1].token_ids) == [tokenizer.convert_tokens_to_ids("bad")] * 2 + [eos]  # padding dropped


def test_without_a_replaced_generate_the_decode_loop_samples():
    tokenizer = word_tokenizer()
    policy = CausalLMPolicy(tiny_model(tokenizer), tokenizer, max_new_tokens=4)
    assert not policy.generate_replaced
    assert len(policy.sample(["hello"], 2)[0]) == 2


def test_a_comlrl_trainer_rewards_and_trains_on_the_stubbed_answers(tmp_path, monkeypatch):
    from llm_marl.comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

    monkeypatch.chdir(tmp_path)
    tokenizer = word_tokenizer()
    models = [tiny_model(tokenizer), tiny_model(tokenizer)]
    calls: list = []
    stub(models[0], tokenizer, ["good", "bad"], calls)
    stub(models[1], tokenizer, ["bad"], calls)
    seen = []

    def reward(first, second):
        seen.append((list(first), list(second)))
        return [float(a == "good") for a in first]

    args = MAGRPOConfig(num_turns=1, num_train_epochs=1, num_generations=2, max_new_tokens=4, rollout_buffer_size=1,
                        eval_interval=0, progress_bar=False, agent_learning_rate=1e-2)
    trainer = MAGRPOTrainer(agents=models, tokenizer=tokenizer, reward_func=reward, train_dataset=[{"prompt": "task"}], args=args)
    before = [p.detach().clone() for p in models[0].parameters()]
    trainer.train()
    # aligned pairs, one reward call each: agent 0's two stubbed answers, agent 1's one
    assert sorted(first for firsts, _ in seen for first in firsts) == ["bad", "good"]
    assert [second for _, seconds in seen for second in seconds] == ["bad", "bad"]
    assert {n for _, n in calls} == {2}
    # agent 0's answers got different rewards: its update moved the weights
    assert any(not torch.equal(a, b) for a, b in zip(before, models[0].parameters()))

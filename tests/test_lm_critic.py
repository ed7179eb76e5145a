"""The language-model critic: where its value is read, placements, saving (a tiny local GPT-2).

Readout (llm_marl/policies/lm_critic.py): V(h) at the last prompt token (index P-1), Q(h, a) at
the last token of prompt + answer, its eos included (index P+L-1). Checked against a plain
forward pass of the unpadded sequence alone, for rows padded in a batch with longer ones.
"""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(1)

from llm_marl.policies.base import Completion  # noqa: E402
from llm_marl.policies.causal_lm import CausalLMPolicy  # noqa: E402
from llm_marl.policies.lm_critic import CausalLMCritic, ValueHead  # noqa: E402

PROMPTS = ["The assert statement", "If the module being imported is not a top level module, then", "A"]


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir  # tests/conftest.py: built once a session


@pytest.fixture()
def policy(model_dir):
    return CausalLMPolicy.from_pretrained(model_dir, max_new_tokens=6, temperature=1.0, top_p=None, top_k=None)


def hand_value(critic, ids, position):
    """The head applied to the final hidden state at ``position`` of ONE unpadded sequence."""
    with torch.no_grad():
        hidden = critic.model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[-1]
        return critic.head(hidden[0, position]).tolist()


def test_state_value_is_read_at_the_last_prompt_token(policy):
    critic = CausalLMCritic.for_policy(policy, shared=False, num_outputs=2, hidden_dim=8)
    with torch.no_grad():
        batch = critic.values(PROMPTS)
    assert batch.shape == (3, 2)
    for row, prompt in enumerate(PROMPTS):
        ids = policy.tokenizer(prompt)["input_ids"]
        assert batch[row].tolist() == pytest.approx(hand_value(critic, ids, len(ids) - 1), abs=1e-5)
        # any other position reads something else
        if len(ids) > 1:
            assert batch[row].tolist() != pytest.approx(hand_value(critic, ids, len(ids) - 2), abs=1e-5)


def test_action_value_is_read_at_the_answers_last_token_eos_included(policy):
    critic = CausalLMCritic.for_policy(policy, shared=False)
    eos = policy.eos_token_ids[0]
    words = policy.tokenizer(" is used to check", add_special_tokens=False)["input_ids"]
    finished, cut = Completion("x", tuple(words) + (eos,)), Completion("x", tuple(words))
    with torch.no_grad():
        values = critic.values([PROMPTS[0], PROMPTS[1], PROMPTS[0]], [finished, finished, cut])[:, 0].tolist()
    for row, (prompt, completion) in enumerate([(PROMPTS[0], finished), (PROMPTS[1], finished), (PROMPTS[0], cut)]):
        ids = policy.tokenizer(prompt)["input_ids"] + list(completion.token_ids)
        assert values[row] == pytest.approx(hand_value(critic, ids, len(ids) - 1)[0], abs=1e-5)
    assert values[0] != pytest.approx(values[2], abs=1e-6)  # the eos is read: stopping has a value


def test_text_answers_are_tokenized_with_an_eos_when_ids_are_not_trusted(policy):
    critic = CausalLMCritic.for_policy(policy, shared=False)
    critic.use_token_ids = False
    answer = Completion(" is used", token_ids=(1, 2, 3))
    expected = policy.tokenizer(PROMPTS[0])["input_ids"] + policy.tokenizer(" is used", add_special_tokens=False)["input_ids"]
    assert critic.input_ids(PROMPTS[0], answer) == expected + [policy.eos_token_ids[0]]


def test_shared_placement_trains_only_its_head_through_the_critic(policy):
    critic = CausalLMCritic.for_policy(policy, shared=True)
    assert critic.model is policy.model
    assert {id(p) for p in critic.parameters()} == {id(p) for p in critic.head.parameters()}
    assert set(critic.state_dict()) == {"head"}
    separate = CausalLMCritic.for_policy(policy, shared=False)
    assert separate.model is not policy.model
    assert len(list(separate.parameters())) == len(list(policy.parameters())) + 2


def test_value_head_initialisation_and_float32():
    torch.manual_seed(0)
    head = ValueHead(512, num_outputs=3, hidden_dim=256)
    first, last = head.net[0], head.net[-1]
    assert first.weight.shape == (256, 512) and last.weight.shape == (3, 256)
    assert torch.all(first.bias == 0) and torch.all(last.bias == 0)
    assert abs(first.weight.std().item() - 0.02) < 0.002
    assert head(torch.zeros(2, 512, dtype=torch.bfloat16)).dtype == torch.float32


def test_save_and_load_round_trip(policy, tmp_path):
    critic = CausalLMCritic.for_policy(policy, shared=False, num_outputs=2)
    with torch.no_grad():
        for p in critic.head.parameters():
            p.add_(0.1)
    critic.save_pretrained(tmp_path / "critic")
    loaded = CausalLMCritic.from_pretrained(tmp_path / "critic")
    with torch.no_grad():
        assert torch.allclose(loaded.values(PROMPTS), critic.values(PROMPTS), atol=1e-6)


def test_a_text_past_the_context_is_cut_from_the_left_keeping_the_readout(policy):
    """CoMLRL's Q14: a prompt longer than the model's context is cut from the right, losing its
    tail (in MAAC's joint text, the later agents). Here the critic keeps the LAST context-length
    tokens, so the value is still read at the prompt's own last token."""
    critic = CausalLMCritic.for_policy(policy, shared=False, actor_prompts=False)  # raw text (a central critic's path)
    limit = critic.context_length
    long_prompt = " ".join(f"word{i}" for i in range(limit)) + " and the end of the prompt"
    ids = policy.tokenizer(long_prompt)["input_ids"]
    assert len(ids) > limit
    # An agent's own critic reads the prompt as its actor does (cut to leave room for an answer).
    assert CausalLMCritic.for_policy(policy, shared=False).input_ids(long_prompt) == policy.encode_prompts([long_prompt])[0] == ids[-(limit - 1) :]
    with torch.no_grad():
        [[value]] = critic.values([long_prompt]).tolist()
    assert critic.input_ids(long_prompt) == ids[-limit:]
    assert value == pytest.approx(hand_value(critic, ids[-limit:], limit - 1)[0], abs=1e-5)
    assert value != pytest.approx(hand_value(critic, ids[:limit], limit - 1)[0], abs=1e-6)  # not the right cut


def test_value_heads_follow_the_trainer_seed_not_the_global_rng(model_dir):
    """Issue 22.6: two IAC trainers of one ``args.seed`` start with the same value heads, whatever
    the global RNG did in between; each agent's head is its own draw; another seed differs."""
    from llm_marl.envs import DialogueEnv
    from llm_marl.learners import IACConfig, IACTrainer
    from llm_marl.tasks.function_task import FunctionTask

    def heads(seed):
        task = FunctionTask(lambda a, b: [1.0], lambda item: item["prompt"], None, [{"prompt": "x"}], num_agents=2, num_turns=1)
        policies = [CausalLMPolicy.from_pretrained(model_dir, max_new_tokens=2) for _ in range(2)]
        args = IACConfig(num_turns=1, num_generations=2, progress_bar=False, seed=seed, use_separate_critic=False)
        trainer = IACTrainer(env=DialogueEnv(task), policies=policies, args=args)
        return [torch.cat([p.detach().flatten() for p in c.head.parameters()]) for c in trainer.critics.values()]

    torch.manual_seed(0)
    first = heads(7)
    torch.manual_seed(123)
    torch.rand(1000)
    again = heads(7)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0], first[1])
    assert not torch.equal(first[0], heads(8)[0])

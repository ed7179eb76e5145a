"""Chat templates in CausalLMPolicy: a tiny Llama whose tokenizer has a ChatML template (built
locally, tests/tiny_chat_model.py). Sampling and scoring see the same prompt tokens, an answer
ends at the template's end-of-turn token, observations may be message lists, and the adapter
team keeps all of it."""

from __future__ import annotations

import pytest
import torch

from llm_marl.policies import sampling, scoring
from llm_marl.policies.causal_lm import CausalLMPolicy
from tiny_chat_model import chat_tokenizer, tiny_llama

PROMPTS = ["Write one sentence about the sea.", "The ship is small."]


@pytest.fixture(scope="module")
def tokenizer():
    return chat_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return tiny_llama(tokenizer)


def _template_ids(tokenizer, messages) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_a_string_observation_is_one_user_message_in_the_template(model, tokenizer):
    policy = CausalLMPolicy(model, tokenizer, max_new_tokens=4)
    assert policy.uses_chat_template
    [ids] = policy.encode_prompts([PROMPTS[0]])
    assert ids == _template_ids(tokenizer, [{"role": "user", "content": PROMPTS[0]}])
    text = tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\nYou are a tiny test model.<|im_end|>")
    assert text.endswith(f"<|im_start|>user\n{PROMPTS[0]}<|im_end|>\n<|im_start|>assistant\n")
    assert text.count("<|im_start|>") == 3  # no second bos from add_special_tokens
    raw = CausalLMPolicy(model, tokenizer, max_new_tokens=4, chat_template=False)
    assert raw.encode_prompts([PROMPTS[0]]) == [tokenizer(PROMPTS[0])["input_ids"]]


def test_messages_and_system_prompt(model, tokenizer):
    chat = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": PROMPTS[1]}]
    policy = CausalLMPolicy(model, tokenizer, max_new_tokens=4, system_prompt="You write the second line.")
    [from_messages, from_string] = policy.encode_prompts([chat, PROMPTS[1]])
    assert from_messages == _template_ids(tokenizer, chat)  # its own system message is kept
    assert from_string == _template_ids(
        tokenizer, [{"role": "system", "content": "You write the second line."}, {"role": "user", "content": PROMPTS[1]}]
    )
    policy.system_prompt = "Another role."  # read at each call: the memo does not serve the old prompt
    [changed] = policy.encode_prompts([PROMPTS[1]])
    assert "Another role." in tokenizer.decode(changed)
    [[answer]] = policy.sample([chat], 1)
    assert policy.log_probs([chat], [answer]).shape == (1,)

    with pytest.raises(TypeError, match="needs a chat template"):
        CausalLMPolicy(model, tokenizer, max_new_tokens=4, chat_template=False).encode_prompts([chat])
    with pytest.raises(TypeError, match="role"):
        policy.encode_prompts([[{"text": "no role"}]])
    bare = chat_tokenizer()
    bare.chat_template = None
    with pytest.raises(ValueError, match="has no chat template"):
        CausalLMPolicy(model, bare, max_new_tokens=4, chat_template=True)
    with pytest.raises(ValueError, match="chat_template must be"):
        CausalLMPolicy(model, tokenizer, chat_template="chatml")
    assert not CausalLMPolicy(model, bare, max_new_tokens=4).uses_chat_template  # None: raw without a template


def test_sampling_and_scoring_use_the_same_prompt_tokens(model, tokenizer, monkeypatch):
    """The prompt rows the decode loop runs and the prompts scoring runs are the template's ids,
    and the scores equal log-probs recomputed by hand on ``template ids + answer``."""
    policy = CausalLMPolicy(model, tokenizer, max_new_tokens=5, temperature=1.0, top_p=None, top_k=None)
    seen: dict[str, list[list[int]]] = {"sampled": [], "scored": []}
    decode, score = sampling.decode, scoring.token_log_probs

    def spy_decode(runner, input_ids, attention_mask, num_samples, **kw):
        seen["sampled"] += [row[mask.bool()].tolist() for row, mask in zip(input_ids, attention_mask)]
        assert input_ids.shape[0] == len(PROMPTS)  # each prompt runs once for its K answers
        return decode(runner, input_ids, attention_mask, num_samples, **kw)

    def spy_score(runner, prompts, answers, **kw):
        seen["scored"] += [list(p) for p in prompts]
        return score(runner, prompts, answers, **kw)

    monkeypatch.setattr(sampling, "decode", spy_decode)
    monkeypatch.setattr(scoring, "token_log_probs", spy_score)
    torch.manual_seed(0)
    answers = policy.sample(PROMPTS, 3)
    flat_obs = [p for p in PROMPTS for _ in range(3)]
    flat = [c for row in answers for c in row]
    scores = policy.log_probs(flat_obs, flat)
    expected = [_template_ids(tokenizer, [{"role": "user", "content": p}]) for p in PROMPTS]
    assert seen["sampled"] == expected
    assert seen["scored"] == [expected[i // 3] for i in range(6)]
    for obs, completion, value in zip(flat_obs, flat, scores):
        ids = _template_ids(tokenizer, [{"role": "user", "content": obs}])
        answer = list(completion.token_ids)
        with torch.no_grad():
            logits = model(torch.tensor([ids + answer])).logits[0, len(ids) - 1 : -1]
        manual = torch.log_softmax(logits, -1).gather(1, torch.tensor(answer)[:, None]).sum()
        torch.testing.assert_close(value.detach(), manual, rtol=1e-4, atol=1e-4)


def test_an_answer_ends_at_the_templates_end_of_turn_token():
    """A tokenizer whose eos is <|endoftext|> but whose template ends a turn with <|im_end|>:
    <|im_end|> ends answers (and is what a text-only completion is scored with)."""
    tokenizer = chat_tokenizer()
    tokenizer.eos_token, tokenizer.pad_token = "<|endoftext|>", "<|endoftext|>"
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model = tiny_llama(tokenizer)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    policy = CausalLMPolicy(model, tokenizer, max_new_tokens=4)
    assert policy.eos_token_ids[0] == end and tokenizer.eos_token_id in policy.eos_token_ids
    [completion] = policy._completions([[40, 41, end, 42, 43]])
    assert completion.token_ids == (40, 41, end) and "<|im_end|>" not in completion.text
    from llm_marl.policies.base import Completion

    assert policy._answer_ids(Completion(text="The sea.", token_ids=None))[-1] == end
    raw = CausalLMPolicy(model, tokenizer, max_new_tokens=4, chat_template=False)
    assert end not in raw.eos_token_ids


def test_settings_are_saved_and_the_team_keeps_the_template(model, tokenizer, tmp_path):
    from llm_marl.policies.lora_team import LoRATeam

    policy = CausalLMPolicy(model, tokenizer, max_new_tokens=4, system_prompt="Be brief.")
    loaded = CausalLMPolicy.from_pretrained(policy.save_pretrained(tmp_path / "p"))
    assert (loaded.chat_template, loaded.system_prompt, loaded.uses_chat_template) == (None, "Be brief.", True)
    assert loaded.encode_prompts(PROMPTS) == policy.encode_prompts(PROMPTS)

    team = LoRATeam.from_model(tiny_llama(tokenizer), tokenizer, ["left", "right"], r=2, target_modules=["q_proj", "v_proj"], max_new_tokens=4)
    member = team.policies["left"]
    expected = [_template_ids(tokenizer, [{"role": "user", "content": p}]) for p in PROMPTS]
    assert member.uses_chat_template and member.encode_prompts(PROMPTS) == expected
    assert member.reference_policy().encode_prompts(PROMPTS) == expected  # the KL reference reads the same prompts
    torch.manual_seed(1)
    answers = team.sample({"left": PROMPTS, "right": PROMPTS}, 2)
    pairs = {agent: ([p for p in PROMPTS for _ in range(2)], [c for row in answers[agent] for c in row]) for agent in ("left", "right")}
    together = team.log_probs(pairs)
    for agent in ("left", "right"):
        alone = team.policies[agent].log_probs(*pairs[agent])
        torch.testing.assert_close(together[agent], alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lora_r", [None, 2], ids=["full-models", "adapter-team"])
def test_comlrl_scripts_keep_raw_formatter_text_unless_they_opt_in(model, tokenizer, tmp_path, lora_r):
    """A script written for CoMLRL sends its formatters' text as is (CoMLRL applies no chat
    template), even when the tokenizer has one; ``model_config={"chat_template": True}`` opts in."""
    from llm_marl.comlrl.trainers import MAGRPOConfig, MAGRPOTrainer

    folder = tmp_path / "chat-llama"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    args = MAGRPOConfig(num_agents=2, num_turns=1, num_generations=2, max_new_tokens=4, lora_r=lora_r,
                        **({"lora_target_modules": ["q_proj", "v_proj"]} if lora_r else {}))

    def build(**extra):
        return MAGRPOTrainer(agent_model=str(folder), reward_func=lambda a, b: [1.0], formatters=lambda item: item["prompt"],
                             train_dataset=[{"prompt": PROMPTS[0]}], args=args, **extra)

    for policy in build().policies.values():
        assert not policy.uses_chat_template
        assert policy.encode_prompts([PROMPTS[0]]) == [tokenizer(PROMPTS[0])["input_ids"]]
    for policy in build(model_config={"chat_template": True}).policies.values():
        assert policy.encode_prompts([PROMPTS[0]]) == [_template_ids(tokenizer, [{"role": "user", "content": PROMPTS[0]}])]


def test_team_agents_with_their_own_system_prompts_share_one_decode_loop(tokenizer, monkeypatch):
    # Planted bug caught: the team comparing every setting (system_prompt included) before batching,
    # which sampled a helper and a main writer with different roles in two decode loops.
    from llm_marl.policies import lora_team
    from llm_marl.policies.lora_team import LoRATeam

    team = LoRATeam.from_model(tiny_llama(tokenizer), tokenizer, ["helper", "main"], r=2, target_modules=["q_proj", "v_proj"], max_new_tokens=4)
    team.policies["helper"].system_prompt = "You write the helper function."
    team.policies["main"].system_prompt = "You write the main function."
    loops = []
    real = lora_team.AdapterPolicy._decode

    def counted(self, prompts, num_samples, routes=None):
        loops.append((list(prompts), None if routes is None else list(routes)))
        return real(self, prompts, num_samples, routes)

    monkeypatch.setattr(lora_team.AdapterPolicy, "_decode", counted)
    torch.manual_seed(2)
    team.sample({"helper": PROMPTS[:1], "main": PROMPTS[:1]}, 2)
    assert len(loops) == 1  # one loop for both agents
    [(prompts, routes)] = loops
    assert routes == ["helper", "main"]
    for ids, agent in zip(prompts, routes):  # each row carries its own agent's system prompt
        role = {"role": "system", "content": team.policies[agent].system_prompt}
        assert ids == _template_ids(tokenizer, [role, {"role": "user", "content": PROMPTS[0]}])
    team.policies["main"].temperature = 0.3  # a setting the shared loop reads: two loops again
    loops.clear()
    team.sample({"helper": PROMPTS[:1], "main": PROMPTS[:1]}, 2)
    assert len(loops) == 2

"""CausalLMPolicy on a tiny local GPT-2: sampling, exact log-probs, batching, gradients."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from llm_marl.policies.base import Completion, Policy, token_log_probs_of
from llm_marl.policies.causal_lm import CausalLMPolicy

torch.set_num_threads(1)

PROMPTS = ["The assert statement", "A", "If the module being imported is not a top level module,"]


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir  # tests/conftest.py: built once a session


def make(model_dir, **settings):
    return CausalLMPolicy.from_pretrained(model_dir, **settings)


def flat(groups):
    return [c for group in groups for c in group]


def hand_log_prob(model, prompt_ids, answer_ids, temperature):
    """One sequence, no padding, default positions: sum of log p(answer token | prefix)."""
    ids = torch.tensor([prompt_ids + answer_ids])
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1] / temperature
    logp = torch.log_softmax(logits.double(), -1)
    return logp.gather(-1, torch.tensor(answer_ids).unsqueeze(-1)).squeeze(-1)


def test_is_a_policy_and_samples_n_per_prompt(model_dir):
    policy = make(model_dir, max_new_tokens=12)
    assert isinstance(policy, Policy)
    eos = policy.eos_token_ids[0]
    torch.manual_seed(0)
    groups = policy.sample(PROMPTS, 4)
    assert len(groups) == len(PROMPTS) and all(len(g) == 4 for g in groups)
    ended = 0
    for c in flat(groups):
        assert isinstance(c.token_ids, tuple) and all(type(t) is int for t in c.token_ids)
        assert 1 <= len(c.token_ids) <= 12
        assert eos not in c.token_ids[:-1]  # nothing after the first eos, no padding inside
        if c.token_ids[-1] == eos:
            ended += 1
        else:
            assert len(c.token_ids) == 12  # cut by max_new_tokens
        assert c.text == policy.tokenizer.decode(c.token_ids, skip_special_tokens=True)
    assert ended > 0
    assert len(set(flat(groups))) >= 2  # hashable, and not all equal
    torch.manual_seed(0)
    assert policy.sample(PROMPTS, 4) == groups  # seeded by torch's global RNG
    assert policy.sample([], 3) == []
    with pytest.raises(ValueError):
        policy.sample(PROMPTS, 0)


def test_one_generate_call_unless_max_batch_size(model_dir, monkeypatch):
    policy = make(model_dir, max_new_tokens=4, use_hf_generate=True)
    calls = []
    original = policy.model.generate

    def counting(*args, **kwargs):
        calls.append(kwargs["input_ids"].shape[0] * kwargs["generation_config"].num_return_sequences)
        return original(*args, **kwargs)

    monkeypatch.setattr(policy.model, "generate", counting)
    policy.sample(PROMPTS, 3)
    assert calls == [9]
    calls.clear()
    policy.max_batch_size = 6  # two prompts x 3 samples per call
    assert [len(g) for g in policy.sample(PROMPTS, 3)] == [3, 3, 3]
    assert calls == [6, 3]


def test_decode_loop_runs_each_prompt_once_then_one_forward_per_token(model_dir, monkeypatch):
    policy = make(model_dir, max_new_tokens=4, min_new_tokens=4)
    forwards = []
    original = policy.model.forward

    def recording(*args, **kwargs):
        forwards.append(tuple(kwargs["input_ids"].shape))
        return original(*args, **kwargs)

    monkeypatch.setattr(policy.model, "forward", recording)
    widths = [len(p) for p in policy.encode_prompts(PROMPTS)]
    policy.sample(PROMPTS, 3)
    # one prefill of the 3 distinct prompts, then 3 forwards of 9 rows (the 4th token needs none)
    assert forwards == [(3, max(widths))] + [(9, 1)] * 3
    forwards.clear()
    policy.max_batch_size = 6
    policy.sample(PROMPTS, 3)
    assert forwards == [(2, max(widths[:2]))] + [(6, 1)] * 3 + [(1, widths[2])] + [(3, 1)] * 3


@pytest.mark.parametrize("use_hf_generate", [False, True])
def test_sampling_restores_mode_and_builds_no_graph(model_dir, use_hf_generate):
    policy = make(model_dir, max_new_tokens=3, use_hf_generate=use_hf_generate).train()
    grad_modes = []
    hook = policy.model.register_forward_hook(lambda module, inputs, output: grad_modes.append(torch.is_grad_enabled()))
    try:
        policy.sample(PROMPTS[:1], 2)
        assert policy.training
        assert grad_modes and not any(grad_modes), f"forwards ran with grad enabled: {grad_modes}"
        policy.eval()
        policy.sample(PROMPTS[:1], 2)
        assert not policy.training
    finally:
        hook.remove()
    assert torch.is_grad_enabled()  # sampling leaves the caller's grad mode alone


def answers_of_different_lengths(policy):
    eos = policy.eos_token_ids[0]
    encode = lambda text: policy.tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    return [
        Completion("is used for debugging.", tuple(encode(" is used for debugging.") + [eos])),
        Completion("", (eos,)),  # an immediately ended answer: one token, the eos
        Completion("x", tuple(encode(" and the value of the expression is returned"))),  # no eos
        Completion("y", tuple(encode(" a"))),
    ]


@pytest.mark.parametrize("score_temperature", ["sampling", 1.0])
def test_log_probs_equal_hand_computation(model_dir, score_temperature):
    policy = make(model_dir, temperature=0.7, score_temperature=score_temperature)
    temperature = 0.7 if score_temperature == "sampling" else 1.0
    completions = answers_of_different_lengths(policy)
    observations = PROMPTS + [PROMPTS[0]]
    values, mask = policy.token_log_probs(observations, completions)
    lengths = [len(c.token_ids) for c in completions]
    assert values.shape == mask.shape == (4, max(lengths))
    assert mask.sum(-1).tolist() == lengths
    assert torch.all(values[~mask] == 0)

    sums = policy.log_probs(observations, completions)
    means = policy.log_probs(observations, completions, reduction="mean")
    with torch.no_grad():
        for row, (obs, c) in enumerate(zip(observations, completions)):
            prompt = policy.tokenizer(obs)["input_ids"]
            expected = hand_log_prob(policy.model, prompt, list(c.token_ids), temperature)
            n = len(c.token_ids)
            torch.testing.assert_close(values[row, :n].double(), expected, atol=1e-4, rtol=0)
            assert sums[row].item() == pytest.approx(expected.sum().item(), abs=1e-4)
            assert means[row].item() == pytest.approx(expected.sum().item() / n, abs=1e-4)
    with pytest.raises(ValueError, match="reduction"):
        policy.log_probs(observations, completions, reduction="max")


def test_batched_equals_one_at_a_time_and_chunked(model_dir):
    policy = make(model_dir, max_new_tokens=10)
    torch.manual_seed(1)
    observations = [o for o in PROMPTS for _ in range(3)]
    completions = flat(policy.sample(PROMPTS, 3))
    with torch.no_grad():
        batched = policy.log_probs(observations, completions)
        single = torch.stack(
            [policy.log_probs([o], [c])[0] for o, c in zip(observations, completions)]
        )
        policy.max_batch_tokens = 40  # several forward passes of a few rows each
        chunked = policy.log_probs(observations, completions)
        values, mask = policy.token_log_probs(observations, completions)
    torch.testing.assert_close(batched, single, atol=1e-4, rtol=0)
    torch.testing.assert_close(batched, chunked, atol=1e-4, rtol=0)
    assert mask.sum(-1).tolist() == [len(c.token_ids) for c in completions]
    # token_log_probs_of (used for the reference KL) picks the policy's own per-token values
    values_of, _ = token_log_probs_of(policy, observations, completions)
    torch.testing.assert_close(values_of, values)


def test_scores_match_generate_transition_scores(model_dir):
    """At temperature 1 without truncation, our scoring layout reproduces generate's own scores."""
    policy = make(model_dir, max_new_tokens=16, temperature=1.0, top_k=None, top_p=None)
    prompts = policy.encode_prompts(PROMPTS)
    width = max(map(len, prompts))
    input_ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    torch.manual_seed(3)
    out = policy.model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=16,
        num_return_sequences=2,
        pad_token_id=0,
        eos_token_id=0,
        output_scores=True,
        return_dict_in_generate=True,
    )
    scores = policy.model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
    completions = [policy._completion(row) for row in out.sequences[:, width:].tolist()]
    observations = [o for o in PROMPTS for _ in range(2)]
    with torch.no_grad():
        values, mask = policy.token_log_probs(observations, completions)
    for row, c in enumerate(completions):
        n = len(c.token_ids)
        torch.testing.assert_close(values[row, :n], scores[row, :n], atol=1e-4, rtol=0)
    # with use_hf_generate, policy.sample is exactly that generate call: same seed, same tokens
    policy.use_hf_generate = True
    torch.manual_seed(3)
    assert flat(policy.sample(PROMPTS, 2)) == completions


@pytest.mark.parametrize("settings", [{}, {"temperature": 0.7, "top_k": 20, "top_p": 0.9}])
def test_decode_loop_samples_from_the_distribution_it_is_scored_by(model_dir, monkeypatch, settings):
    """Every step of the KV-cached loop (prompts run once, caches repeated, left padding) sees the
    same next-token distribution as the one-pass scorer: the logits _draw receives, tempered,
    equal token_log_probs row by row and token by token."""
    policy = make(model_dir, max_new_tokens=10, **settings)
    seen = []
    original = policy._draw

    def recording(logits, ban_eos=False):
        seen.append(torch.log_softmax(logits.float() / policy.temperature, dim=-1))
        return original(logits, ban_eos)

    monkeypatch.setattr(policy, "_draw", recording)
    torch.manual_seed(4)
    groups = policy.sample(PROMPTS, 3)
    completions = flat(groups)
    observations = [o for o in PROMPTS for _ in range(3)]
    with torch.no_grad():
        values, mask = policy.token_log_probs(observations, completions)
    for row, c in enumerate(completions):
        for t, token in enumerate(c.token_ids):
            assert mask[row, t]
            assert values[row, t].item() == pytest.approx(seen[t][row, token].item(), abs=1e-4)
            if settings:  # truncation: only tokens inside the top-k and the top-p nucleus are drawn
                probs = seen[t][row].exp()
                assert probs[token] >= probs.topk(20).values[-1]
                assert (probs[probs > probs[token]]).sum() < 0.9


def test_draw_matches_the_categorical_distribution(model_dir):
    policy = make(model_dir, temperature=0.5, top_k=None, top_p=None)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5]]).repeat(40000, 1)
    torch.manual_seed(0)
    counts = torch.bincount(policy._draw(logits), minlength=5).double() / len(logits)
    expected = torch.softmax(logits[0].double() / 0.5, -1)
    assert (counts - expected).abs().max() < 0.01  # 4 standard errors at most

    policy.top_k, policy.top_p = 3, None
    counts = torch.bincount(policy._draw(logits), minlength=5).double() / len(logits)
    top3 = torch.softmax(torch.tensor([2.0, 1.0, float("-inf"), float("-inf"), 0.5]).double() / 0.5, -1)
    assert (counts - top3).abs().max() < 0.01 and counts[[2, 3]].sum() == 0

    policy.top_k, policy.top_p = None, 0.9  # p = .83, .11, .015, .002, .041: nucleus {0, 1}
    counts = torch.bincount(policy._draw(logits), minlength=5).double() / len(logits)
    nucleus = expected.clone()
    nucleus[2:] = 0
    assert (counts - nucleus / nucleus.sum()).abs().max() < 0.01

    policy.top_p = None
    policy.eos_token_ids = (0,)
    drawn = policy._draw(logits[:1000], ban_eos=True)
    assert (drawn != 0).all()


@pytest.mark.parametrize("use_hf_generate", [False, True])
@pytest.mark.parametrize("min_new_tokens", [0, 3])
def test_min_new_tokens_with_eos_biased_logits(model_dir, min_new_tokens, use_hf_generate):
    """A model that all but always says eos: every answer is min_new_tokens other tokens, then eos."""
    policy = make(model_dir, max_new_tokens=8, min_new_tokens=min_new_tokens, use_hf_generate=use_hf_generate)
    eos = policy.eos_token_ids[0]

    def biased(module, inputs, logits):
        logits = logits.clone()
        logits[..., eos] += 1e4
        return logits

    hook = policy.model.get_output_embeddings().register_forward_hook(biased)
    try:
        torch.manual_seed(0)
        answers = flat(policy.sample(PROMPTS, 4))
    finally:
        hook.remove()
    assert [len(c.token_ids) for c in answers] == [min_new_tokens + 1] * len(answers)
    assert all(c.token_ids[-1] == eos and eos not in c.token_ids[:-1] for c in answers)


def test_min_new_tokens_forbids_an_early_eos(model_dir):
    policy = make(model_dir, max_new_tokens=6, min_new_tokens=6, temperature=3.0)
    torch.manual_seed(0)
    assert all(len(c.token_ids) == 6 for c in flat(policy.sample(PROMPTS, 4)))
    with pytest.raises(ValueError, match="min_new_tokens"):
        make(model_dir, max_new_tokens=3, min_new_tokens=4)


def test_shared_prompt_scoring_equals_one_pass_scoring_with_gradients(model_dir):
    policy = make(model_dir, max_new_tokens=10).train()
    torch.manual_seed(2)
    completions = flat(policy.sample(PROMPTS, 3))
    observations = [o for o in PROMPTS for _ in range(3)]

    def values_and_grad(shared):
        policy.score_prompts_once = shared
        policy.model.zero_grad()
        values, mask = policy.token_log_probs(observations, completions)
        (values * torch.linspace(-1, 1, values.numel()).view_as(values)).sum().backward()
        return values.detach(), mask, {n: p.grad.clone() for n, p in policy.named_parameters()}

    shared, shared_mask, shared_grads = values_and_grad(True)
    plain, plain_mask, plain_grads = values_and_grad(False)
    torch.testing.assert_close(shared, plain, atol=1e-5, rtol=0)
    assert torch.equal(shared_mask, plain_mask)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_fused_activations_compute_the_same_model(model_dir):
    from transformers.activations import NewGELUActivation

    from llm_marl.policies.causal_lm import TanhGELU

    plain = make(model_dir, fused_activations=False)
    fused = make(model_dir)
    kinds = lambda policy: [type(m) for m in policy.model.modules() if "GELU" in type(m).__name__]  # noqa: E731
    assert kinds(plain) == [NewGELUActivation] * 2 and kinds(fused) == [TanhGELU] * 2  # one per layer
    ids = torch.tensor([policy_ids for policy_ids in plain.encode_prompts(PROMPTS[2:])])
    x = torch.linspace(-6, 6, 1001, requires_grad=True)
    y = x.detach().clone().requires_grad_(True)
    NewGELUActivation()(x).sum().backward()
    TanhGELU()(y).sum().backward()
    torch.testing.assert_close(TanhGELU()(y), NewGELUActivation()(x), atol=1e-6, rtol=0)
    torch.testing.assert_close(y.grad, x.grad, atol=1e-5, rtol=0)
    with torch.no_grad():
        torch.testing.assert_close(fused.model(ids).logits, plain.model(ids).logits, atol=1e-4, rtol=0)
    assert plain.model.state_dict().keys() == fused.model.state_dict().keys()


def test_model_generation_config_cannot_change_the_sampler(model_dir):
    policy = make(model_dir, max_new_tokens=10)
    torch.manual_seed(5)
    plain = policy.sample(PROMPTS, 2)
    policy.model.generation_config.repetition_penalty = 5.0
    policy.model.generation_config.no_repeat_ngram_size = 1
    torch.manual_seed(5)
    assert policy.sample(PROMPTS, 2) == plain


def test_gradients_flow(model_dir):
    policy = make(model_dir).train()
    completions = answers_of_different_lengths(policy)
    loss = -policy.log_probs(PROMPTS + [PROMPTS[0]], completions).mean()
    loss.backward()
    grads = {name: p.grad for name, p in policy.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    assert all(g.abs().sum() > 0 for name, g in grads.items() if "wpe" not in name)
    # padding takes no part: the gradient of a padded answer's value is that of the unpadded one
    policy.model.zero_grad()
    policy.log_probs([PROMPTS[1]], [completions[1]])[0].backward()
    alone = policy.model.transformer.wte.weight.grad.clone()
    policy.model.zero_grad()
    policy.log_probs(PROMPTS + [PROMPTS[0]], completions)[1].backward()
    torch.testing.assert_close(policy.model.transformer.wte.weight.grad, alone, atol=1e-5, rtol=1e-4)


def test_text_only_and_empty_prompts(model_dir):
    policy = make(model_dir, max_new_tokens=5)
    eos = policy.eos_token_ids[0]
    ids = policy.tokenizer(" is used.", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        by_text = policy.log_probs(["The assert statement"], [Completion(" is used.")])
        by_ids = policy.log_probs(["The assert statement"], [Completion("", tuple(ids + [eos]))])
    torch.testing.assert_close(by_text, by_ids)
    torch.manual_seed(0)
    (group,) = policy.sample([""], 2)
    assert len(group) == 2 and policy.log_probs(["", ""], group).isfinite().all()


def test_prompt_longer_than_context_is_cut_from_the_left(model_dir):
    policy = make(model_dir, max_new_tokens=8)
    long_prompt = "The assert statement is used for debugging. " * 80
    (prompt,) = policy.encode_prompts([long_prompt])
    assert len(prompt) == policy.context_length - 1
    torch.manual_seed(0)
    (group,) = policy.sample([long_prompt], 2)
    assert all(len(c.token_ids) == 1 for c in group)  # the context leaves room for one token
    assert policy.log_probs([long_prompt] * 2, group).isfinite().all()


def test_missing_pad_token_is_warned_and_set(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.pad_token = None
    with pytest.warns(UserWarning, match="no pad token"):
        policy = CausalLMPolicy(model, tokenizer)
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == policy.pad_token_id


def test_dropout_is_switched_off_or_warned(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir, resid_pdrop=0.1)
    with pytest.warns(UserWarning, match="dropout"):
        CausalLMPolicy(model, AutoTokenizer.from_pretrained(model_dir), disable_dropout=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        CausalLMPolicy(model, AutoTokenizer.from_pretrained(model_dir))  # switched off: no warning
        make(model_dir)  # the tiny model has no dropout: no warning
    assert all(m.p == 0 for m in model.modules() if isinstance(m, torch.nn.Dropout))


def test_save_and_load_round_trip(model_dir, tmp_path):
    policy = make(model_dir, max_new_tokens=7, temperature=0.9, top_k=None)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01)
    policy.save_pretrained(tmp_path / "saved")
    loaded = CausalLMPolicy.from_pretrained(tmp_path / "saved", top_p=0.5)
    assert (loaded.max_new_tokens, loaded.temperature, loaded.top_k, loaded.top_p) == (7, 0.9, None, 0.5)
    state = policy.state_dict()
    assert all(torch.equal(state[k], v) for k, v in loaded.state_dict().items())
    fresh = make(model_dir)
    fresh.load_state_dict(state)
    assert all(torch.equal(state[k], v) for k, v in fresh.state_dict().items())
    assert fresh.to("cpu") is fresh and fresh.device.type == "cpu"


@pytest.mark.parametrize(
    "bad",
    [
        {"temperature": 0},
        {"top_p": 0},
        {"top_k": -1},
        {"max_new_tokens": 0},
        {"min_new_tokens": -1},
        {"score_temperature": "greedy"},
        {"score_temperature": -1.0},
        {"max_batch_tokens": 0},
    ],
)
def test_invalid_settings(model_dir, bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        make(model_dir, **bad)


def test_decode_cache_has_room_reserved_and_overflows_safely(model_dir):
    from llm_marl.policies.causal_lm import _repeat_with_room

    policy = make(model_dir, max_new_tokens=5)
    input_ids, attention_mask = policy._left_pad(policy.encode_prompts(PROMPTS))
    with torch.inference_mode():
        _, cache = policy._prefill(input_ids, attention_mask, 2)
    width = input_ids.shape[1]
    for layer in cache.layers:
        assert layer.keys.shape[0] == 6 and layer.keys.shape[-2] == width
        # one buffer with room for 5 more positions; the layer's tensors are views of its filled part
        assert layer.keys.untyped_storage().nbytes() == layer.keys[..., :1, :].numel() * (width + 5) * 4
    layer = cache.layers[0]
    extra = torch.ones(6, layer.keys.shape[1], 7, layer.keys.shape[-1])
    with torch.inference_mode():
        keys, _ = layer.update(extra[:, :, :3], extra[:, :, :3])  # within the room: written in place
        assert keys.shape[-2] == width + 3 and torch.equal(keys[:, :, width:], extra[:, :, :3])
        keys, _ = layer.update(extra[:, :, 3:], extra[:, :, 3:])  # 4 more than the 2 left: concatenated
        assert keys.shape[-2] == width + 7 and torch.equal(keys[:, :, width:], extra)
    assert not _repeat_with_room(object(), 2, 3)  # anything without DynamicLayer layers is left alone
    # each prompt's copies are adjacent and equal the prompt's own cache, as batch_repeat_interleave
    with torch.inference_mode():
        _, single = policy._run_prompts(input_ids, attention_mask)
    for layer, alone in zip(cache.layers, single.layers):
        torch.testing.assert_close(layer.keys[:, :, :width], alone.keys.repeat_interleave(2, dim=0))


def test_prompt_encodings_are_memoised_until_the_tokenizer_changes(model_dir, monkeypatch):
    policy = make(model_dir)
    calls = []
    original = type(policy.tokenizer).__call__

    def counting(tokenizer, texts, **kwargs):
        calls.append(list(texts))
        return original(tokenizer, texts, **kwargs)

    monkeypatch.setattr(type(policy.tokenizer), "__call__", counting)
    first = policy.encode_prompts(PROMPTS + [PROMPTS[0]])
    assert first[0] == first[3] and calls == [PROMPTS]  # each distinct text encoded once
    assert policy.encode_prompts(PROMPTS[::-1]) == first[:3][::-1] and len(calls) == 1
    policy.tokenizer.add_special_tokens({"additional_special_tokens": ["<|turn|>"]})
    policy.encode_prompts(PROMPTS[:1])
    assert calls[-1] == PROMPTS[:1]  # a changed vocabulary drops the memo


@pytest.mark.parametrize("setup", ["plain", "bf16-sampling copy", "adapter team"])
def test_lm_head_gets_its_sliced_input_as_a_fresh_tensor(model_dir, setup):
    """``logits_to_keep`` slices the hidden states (``h[:, -1:, :]``); a 3-D input with those
    strides runs on a CPU as a batched matmul with the lm head's weight copied per row (SmolLM2
    in bf16: 148 ms instead of 8 for one prompt, 1.18 s for eight). The runners hand the head a
    fresh tensor of the same values, once per head (a deep copy carries the hook)."""
    from llm_marl.policies.lm_runner import _dense_input
    from llm_marl.policies.lora_team import LoRATeam

    if setup == "adapter team":
        team = LoRATeam.from_pretrained(model_dir, agents=("a0", "a1"), r=4, alpha=8)
        policy, runner = team.policies["a0"], team.runner
    else:
        policy = make(model_dir, sample_dtype="bfloat16" if setup == "bf16-sampling copy" else None)
        runner = policy._sampling_runner()
    head = runner.model.get_output_embeddings()
    assert [h for h in head._forward_pre_hooks.values() if h is _dense_input] == [_dense_input]
    seen = []
    head.register_forward_pre_hook(lambda module, args: seen.append((args[0].shape, args[0].stride())))
    input_ids, attention_mask = policy._left_pad(policy.encode_prompts(PROMPTS))
    routes = policy._routes(len(PROMPTS))
    with torch.inference_mode():
        last, _ = runner.run_prompts(input_ids, attention_mask, routes)
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        full = runner.forward({"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": positions}, routes)
    shape, stride = seen[0]
    assert tuple(shape) == (len(PROMPTS), 1, head.in_features)
    assert stride == (head.in_features, head.in_features, 1)  # not the slice's (width * in_features, ...)
    torch.testing.assert_close(last, full.logits[:, -1])


def test_scoring_records_each_answer_tokens_entropy_from_its_own_logits(model_dir):
    """``last_token_entropy`` after scoring: at each answer token, the entropy of the tempered
    next-token distribution, by hand from one unpadded forward per answer (issue 44)."""
    policy = make(model_dir, max_new_tokens=5)
    torch.manual_seed(1)
    completions = flat(policy.sample(PROMPTS[:2], 2))
    observations = [p for p in PROMPTS[:2] for _ in range(2)]
    policy.token_log_probs(observations, completions)
    entropy, mask = policy.last_token_entropy
    temperature = policy.effective_score_temperature
    for row, (prompt, completion) in enumerate(zip(observations, completions)):
        prompt_ids = policy.encode_prompts([prompt])[0]
        answer = list(completion.token_ids)
        ids = torch.tensor([list(prompt_ids) + answer])
        with torch.no_grad():
            logits = policy.model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].double() / temperature
        logp = torch.log_softmax(logits, -1)
        by_hand = -(logp.exp() * logp).sum(-1)
        assert int(mask[row].sum()) == len(answer)
        assert torch.allclose(entropy[row, : len(answer)].double(), by_hand, atol=1e-4)
        assert (entropy[row, len(answer):] == 0).all()

"""Scoring handles every prompt the sampler handles, at the model's context limit too.

A 1024-position model; a prompt cut to leave room for one token (so its answer is one token)
scored in one batch with short prompts whose answers are longer. The shared-prompt path used to
number the padded columns after the one-token answer past position 1023 (IndexError in the
position embeddings). Both scoring paths must give the same log-probs as scoring each answer
alone, with no error.
"""

from __future__ import annotations

import pytest
import torch

from llm_marl.policies.causal_lm import CausalLMPolicy
from llm_marl.policies.tiny import build_tiny_model

SHORT = ["The assert statement", "A module can contain"]


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    directory = build_tiny_model(tmp_path_factory.mktemp("tiny") / "m1024", n_positions=1024, pretrain_steps=0)
    return CausalLMPolicy.from_pretrained(directory, max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=None, min_new_tokens=6)


def test_a_prompt_at_the_context_limit_scores_the_same_on_both_paths(policy):
    long_prompt = " ".join(f"w{i}" for i in range(3000))
    (ids,) = policy.encode_prompts([long_prompt])
    assert policy.context_length == 1024 and len(ids) == 1023  # cut to leave one token
    torch.manual_seed(0)
    long_answers = policy.sample([long_prompt], 2)[0]
    short_answers = [c for group in policy.sample(SHORT, 2) for c in group]
    assert [len(c.token_ids) for c in long_answers] == [1, 1]
    assert [len(c.token_ids) for c in short_answers] == [6] * 4  # min_new_tokens = max_new_tokens
    observations = [long_prompt] * 2 + [o for o in SHORT for _ in range(2)]
    completions = list(long_answers) + short_answers

    alone = torch.stack([policy.log_probs([o], [c])[0] for o, c in zip(observations, completions)]).detach()
    results = {}
    for shared in (True, False):
        policy.score_prompts_once = shared
        values, mask = policy.token_log_probs(observations, completions)
        results[shared] = (values.detach(), mask)
        torch.testing.assert_close(values.sum(-1).detach(), alone, atol=1e-4, rtol=0)
    torch.testing.assert_close(results[True][0], results[False][0], atol=1e-5, rtol=0)
    assert torch.equal(results[True][1], results[False][1])
    assert results[True][1].sum(-1).tolist() == [1, 1, 6, 6, 6, 6]

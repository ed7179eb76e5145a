"""Gradient checkpointing changes memory, never the math (issue 33.3): it needs the model in train
mode, which would switch dropout on in scoring; the policies switch dropout off (as TRL's
``disable_dropout``), so a model with dropout 0.1 scores the same log-probs and gradients with
and without checkpointing, and the same log-probs as the sampler (eval mode)."""

from __future__ import annotations

import pytest
import torch

from llm_marl.policies import CausalLMPolicy, LoRATeam

PROMPTS = ["The assert statement", "A", "If the module being imported is not a top level module,"]
DROPOUT = dict(resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
AGENTS = ("agent_0", "agent_1")


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir  # tests/conftest.py: built once a session


def team_of(model_dir, checkpointing, **settings):
    team = LoRATeam.from_pretrained(
        model_dir, agents=AGENTS, r=4, alpha=8, dropout=0.1, model_kwargs=DROPOUT, gradient_checkpointing=checkpointing,
        max_new_tokens=8, temperature=1.0, top_p=None, top_k=None, **settings,
    )
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in team.model.named_parameters():
            if "lora_" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=generator))
    return team


def scores_and_gradients(team, requests):
    torch.manual_seed(9)  # the same dropout masks, were dropout on
    values = team.log_probs(requests)
    sum(v.sum() * (i + 1) for i, v in enumerate(values.values())).backward()
    grads = {n: p.grad.clone() for n, p in team.model.named_parameters() if p.grad is not None}
    return {a: v.detach() for a, v in values.items()}, grads


def test_checkpointing_gives_the_same_log_probs_and_gradients_with_dropout(model_dir):
    """Fails on the old main: with checkpointing (train mode) dropout was on in scoring, scores
    off by 0.25-1 nats and gradients by more than their own size."""
    sampler = team_of(model_dir, False)
    torch.manual_seed(4)
    answers = sampler.sample({a: PROMPTS for a in AGENTS}, 2)
    requests = {a: ([p for p in PROMPTS for _ in range(2)], [c for g in answers[a] for c in g]) for a in AGENTS}
    plain, plain_grads = scores_and_gradients(team_of(model_dir, False), requests)
    ckpt_team = team_of(model_dir, True)
    assert ckpt_team.model.training  # checkpointing runs in train mode
    ckpt, ckpt_grads = scores_and_gradients(ckpt_team, requests)
    assert set(ckpt_grads) == set(plain_grads) and plain_grads
    for agent in AGENTS:
        torch.testing.assert_close(ckpt[agent], plain[agent], atol=1e-5, rtol=0)
    for name, grad in plain_grads.items():
        scale = float(grad.abs().max())
        torch.testing.assert_close(ckpt_grads[name], grad, atol=1e-5 + 2e-6 * scale, rtol=1e-4, msg=name)
    # and both are the sampler's (eval-mode) scores
    sampler.model.eval()
    with torch.no_grad():
        eval_scores = sampler.log_probs(requests)
    for agent in AGENTS:
        torch.testing.assert_close(ckpt[agent], eval_scores[agent], atol=1e-5, rtol=0)


def test_a_full_model_in_train_mode_scores_like_in_eval_mode(model_dir):
    """The same for a full model put in train mode (``policy.train()``), and the opt-out."""
    policy = CausalLMPolicy.from_pretrained(model_dir, model_kwargs=DROPOUT, max_new_tokens=8, temperature=1.0, top_p=None, top_k=None)
    torch.manual_seed(1)
    completions = [c for g in policy.sample(PROMPTS, 2) for c in g]
    observations = [p for p in PROMPTS for _ in range(2)]
    with torch.no_grad():
        eval_scores = policy.eval().log_probs(observations, completions)
        train_scores = policy.train().log_probs(observations, completions)
    torch.testing.assert_close(train_scores, eval_scores, atol=1e-5, rtol=0)
    with pytest.warns(UserWarning, match="dropout"):
        noisy = CausalLMPolicy.from_pretrained(model_dir, model_kwargs=DROPOUT, disable_dropout=False, max_new_tokens=8, temperature=1.0)
    with torch.no_grad():
        assert not torch.allclose(noisy.train().log_probs(observations, completions), eval_scores, atol=1e-3)


def test_checkpointing_in_train_mode_scores_without_gradients_like_with_them(model_dir):
    """Scoring under ``torch.no_grad()`` with checkpointing on (train mode) — the reference KL,
    critics' targets, a frozen comparator — gives the eval-mode scores. Fails without the cache
    check in ``ModelRunner.run_prompts``: HF hands back a cache that holds none of the prompt, so
    answers sharing a prompt were scored without it (off by 0.6 nats)."""
    policy = CausalLMPolicy.from_pretrained(model_dir, max_new_tokens=8, temperature=1.0, top_p=None, top_k=None)
    torch.manual_seed(5)
    completions = [c for g in policy.sample(PROMPTS, 2) for c in g]
    observations = [p for p in PROMPTS for _ in range(2)]  # answers share prompts: one prompt pass each
    with torch.no_grad():
        eval_scores = policy.eval().log_probs(observations, completions)
    policy.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    policy.train()
    with torch.no_grad():
        torch.testing.assert_close(policy.log_probs(observations, completions), eval_scores, atol=1e-5, rtol=0)
    team = team_of(model_dir, True)
    agent = AGENTS[0]
    team_completions = [c for g in team.sample({agent: PROMPTS}, 2)[agent] for c in g]
    requests = {agent: (observations, team_completions)}
    team.model.eval()
    with torch.no_grad():
        team_eval = team.log_probs(requests)[agent]
    team.model.train()
    with torch.no_grad():
        torch.testing.assert_close(team.log_probs(requests)[agent], team_eval, atol=1e-5, rtol=0)

"""ChoicePolicy (llm_marl/policies/choice.py): a language model choosing one move of the menu its
prompt lists, pi(c | o) = softmax over the menu of the wrapped policy's whole-answer
log-probabilities; the sampler draws from that same distribution."""

from __future__ import annotations

import math

import pytest
import torch

from llm_marl.assembly import AssemblyError, check_policy_options
from llm_marl.policies import LoRATeam
from llm_marl.policies.base import Completion, take_token_entropy
from llm_marl.policies.choice import ChoicePolicy, listed_choices
from resumed import uninterrupted_and_resumed

PROMPTS = [
    "tiny_hanabi_E: you are player 1.\np1:d0 p0:a2\nWhich move do you make? Choose one of: p1a0, p1a1, p1a2.",
    "a game: you are player 0.\nx\nWhich move do you make? Choose one of: (Play 0), (Reveal: colour R).",
]


@pytest.fixture()
def team(tiny_model_dir):
    return LoRATeam.from_pretrained(tiny_model_dir, agents=("x0", "x1"), r=4, alpha=8, temperature=0.7)


def test_the_menu_is_read_from_the_moves_the_prompt_lists():
    assert listed_choices(PROMPTS[0]) == ["p1a0", "p1a1", "p1a2"]
    assert listed_choices(PROMPTS[1]) == ["(Play 0)", "(Reveal: colour R)"]
    assert listed_choices("Choose one of: x, y.\nthen Choose one of: z") == ["z"]  # the last list counts
    with pytest.raises(ValueError, match="lists no moves.*Wait for the other player"):
        listed_choices("tiny_hanabi_E: you are player 1.\nWait for the other player.")


class _Scorer:
    """A stand-in wrapped policy: an answer's log-probability is minus its length."""

    def log_probs(self, observations, completions, reduction="sum"):
        return torch.tensor([-float(len(c.text)) for c in completions])

    def parameters(self):
        return iter(())


def test_a_fixed_menu_serves_every_prompt():
    policy = ChoicePolicy(_Scorer(), ["ab", "a"])
    got = policy.log_probs(["any", "other"], [Completion("ab"), Completion("a")])
    norm = math.log(math.exp(-2) + math.exp(-1))
    assert got.tolist() == pytest.approx([-2 - norm, -1 - norm])
    with pytest.raises(ValueError, match="distinct"):
        ChoicePolicy(_Scorer(), ["x", "x"])


def test_log_probs_are_the_softmax_over_the_menu_of_the_whole_answer_log_probs(team):
    inner = team.policies["x0"]
    policy = ChoicePolicy(inner)
    answers = [Completion("p1a2"), Completion("p1a0"), Completion("(Reveal: colour R)")]
    observations = [PROMPTS[0], PROMPTS[0], PROMPTS[1]]
    got = policy.log_probs(observations, answers)
    with torch.no_grad():  # by hand: each menu scored as text answers by the wrapped policy, normalized
        first = inner.log_probs([PROMPTS[0]] * 3, [Completion(m) for m in ("p1a0", "p1a1", "p1a2")])
        second = inner.log_probs([PROMPTS[1]] * 2, [Completion(m) for m in ("(Play 0)", "(Reveal: colour R)")])
    norm0, norm1 = torch.logsumexp(first, 0), torch.logsumexp(second, 0)
    expected = torch.stack([first[2] - norm0, first[0] - norm0, second[1] - norm1])
    assert torch.allclose(got.detach(), expected, atol=1e-5)
    # one "token" per answer: the mean reduction equals the sum
    assert torch.allclose(policy.log_probs(observations, answers, reduction="mean").detach(), expected, atol=1e-5)
    # the entropy the stall metrics log is the menu distribution's, per answer
    policy.log_probs(observations, answers)
    entropy, mask = take_token_entropy(policy)
    p0 = (first - norm0).exp()
    assert entropy.shape == (3, 1) and bool(mask.all())
    assert math.isclose(float(entropy[0, 0].detach()), float(-(p0 * p0.log()).sum()), rel_tol=1e-5)
    assert take_token_entropy(inner) is None  # the wrapped policy's token entropies are not left behind
    # probabilities() is the same distribution, summing to one
    table = policy.probabilities(PROMPTS[0])
    assert list(table) == ["p1a0", "p1a1", "p1a2"] and math.isclose(sum(table.values()), 1.0, rel_tol=1e-6)
    assert math.isclose(table["p1a2"], float(expected[0].exp()), rel_tol=1e-5)


def test_the_gradient_reaches_only_the_wrapped_agents_adapter(team):
    policy = ChoicePolicy(team.policies["x0"])
    policy.log_probs([PROMPTS[0]], [Completion("p1a1")]).sum().backward()
    mine = [p.grad for p in team.policies["x0"].parameters()]
    assert mine and any(g is not None and float(g.abs().sum()) > 0 for g in mine)
    assert all(p.grad is None or float(p.grad.abs().sum()) == 0 for p in team.policies["x1"].parameters())


def test_the_sampler_draws_from_the_distribution_it_is_scored_with(team):
    policy = ChoicePolicy(team.policies["x0"])
    torch.manual_seed(0)
    [answers] = policy.sample([PROMPTS[0]], 3000)
    table = policy.probabilities(PROMPTS[0])
    for j, name in enumerate(table):
        share = sum(a.text == name for a in answers) / len(answers)
        sigma = math.sqrt(table[name] * (1 - table[name]) / len(answers))
        assert abs(share - table[name]) < 4 * sigma + 1e-9, (name, share, table[name])
        assert all(a.action == j for a in answers if a.text == name)
    # each answer records the log-probability it was drawn with: the scorer's, so the gap is 0
    scored = policy.log_probs([PROMPTS[0]] * 5, answers[:5])
    assert [a.sampler.log_probs[0] for a in answers[:5]] == pytest.approx(scored.tolist(), abs=1e-6)
    total, count = policy.sampler_gap.drain()
    assert count == 5 and total < 1e-5


def test_an_answer_outside_the_menu_and_a_tabular_team_are_refused_by_name(team):
    policy = ChoicePolicy(team.policies["x0"])
    with pytest.raises(ValueError, match=r"answer 1 \('p0a1'\) is not one of its prompt's choices \['p1a0', 'p1a1', 'p1a2'\]"):
        policy.log_probs([PROMPTS[0]] * 2, [Completion("p1a0"), Completion("p0a1")])
    with pytest.raises(AssemblyError, match="--choice_answers: language-model agents only"):
        check_policy_options("tabular", choice_answers=True)
    with pytest.raises(TypeError, match="ChoicePolicy wraps a policy that scores answers"):
        ChoicePolicy(object())


def test_a_choice_team_stopped_and_resumed_equals_an_uninterrupted_run(tiny_model_dir, tmp_path):
    """Two choice-answering adapters on Tiny Hanabi E (text prompts): the draws come from torch's
    global RNG, which checkpoints keep, so a run cut after 2 optimizer steps and resumed ends with
    the same adapters and optimizer moments as one that never stopped."""
    pytest.importorskip("pyspiel")
    from llm_marl.envs.openspiel import tiny_hanabi
    from llm_marl.learners import MAGRPOConfig, MAGRPOTrainer

    def make(output_dir, **overrides):
        team = LoRATeam.from_pretrained(tiny_model_dir, agents=("player_0", "player_1"), r=4, alpha=8, target_modules=["c_attn"])
        policies = {agent: ChoicePolicy(policy) for agent, policy in team.policies.items()}
        env = tiny_hanabi("E", text=True, num_items=4)
        args = MAGRPOConfig(output_dir=str(output_dir), save_steps=1, num_train_epochs=1, num_generations=3, items_per_step=2,
                            rollout_buffer_size=2, agent_learning_rate=0.05, eval_interval=0, logging_steps=1, rollout_log_steps=0,
                            early_termination_threshold=None, progress_bar=False, seed=3, **overrides)
        return MAGRPOTrainer(env=env, policies=policies, args=args)

    full, resumed = uninterrupted_and_resumed(make, tmp_path, max_steps=2, seed=0)
    for agent in ("player_0", "player_1"):
        a, b = full.policies[agent].state_dict(), resumed.policies[agent].state_dict()
        assert set(a) == set(b) and all(torch.equal(a[n], b[n]) for n in a), agent
        assert any(float(v.abs().sum()) > 0 for n, v in a.items() if "lora_B" in n), agent  # the adapters moved
        sa, sb = full.optimizers[agent].state_dict()["state"], resumed.optimizers[agent].state_dict()["state"]
        assert sa and all(torch.equal(sa[k]["exp_avg"], sb[k]["exp_avg"]) for k in sa)

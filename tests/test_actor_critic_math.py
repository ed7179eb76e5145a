"""The hand-checkable cases of docs/actor_critic.md §7, computed independently.

T1  G=2, R=[1, 0], V_old=0.25 each: y = R = [1, 0]; A = y - V = [0.75, -0.25];
    whitened: mean 0.25, population std 0.5 -> [1, -1].
T2  A = [1, 3, 0, 4]: mean 2, variance (1+1+4+4)/4 = 2.5, std 1.5811388
    -> [-1/1.5811, 1/1.5811, -2/1.5811, 2/1.5811] = [-0.6325, 0.6325, -1.2649, 1.2649];
    one sample stays as it is (0.75); equal advantages -> 0 (std floored at 1e-6).
T3  H=3, gamma=0.9, r=[-1, -2, 0.5], V_old=[0.5, 0.6, 0.4]:
    y0 = -1 + 0.9*0.6 = -0.46, y1 = -2 + 0.9*0.4 = -1.64, y2 = 0.5 (no bootstrap);
    A = y - V = [-0.96, -2.24, 0.10].
T4  tau=-0.9, rewards [-1, -0.5] (mean -0.75 > -0.9): stop; tau=-0.2, [0, 0]: stop; None: never.
T5  eps=0.2, V_old=0.5, y=1: V=0.9 -> V_clip=0.7, e=max(0.01, 0.09)=0.09 and de/dV=0 (the clipped
    branch wins and does not depend on V); V=0.6 -> e=max(0.16, 0.16)=0.16 with de/dV=-0.8;
    L_V = 0.6 * mean(0.09, 0.16) = 0.075.
T6  policy token log-probs [-1, -2], reference [-1.5, -1]: delta = ref - pol = [-0.5, 1];
    KL = (e^-0.5 + 0.5 - 1) + (e^1 - 1 - 1) = 0.1065307 + 0.7182818 = 0.8248125;
    R=1, beta=0.1 -> 1 - 0.08248125 = 0.91751875.
T7  MAAC, H=2, gamma=1, joint V_old=[0.2, 0.1], agent 0 rewards [1, 0.5], agent 1 [0, 0.5]:
    agent 0: y = [1 + 0.1, 0.5] = [1.1, 0.5], A = [0.9, 0.4];
    agent 1: y = [0 + 0.1, 0.5] = [0.1, 0.5], A = [-0.1, 0.4].
T9  token log-probs [-1.2, -2.0] sum to -3.2; A=0.5: -(-3.2)(0.5) = 1.6.
(T8, the anchor's broadcasting of one reward list over N agents x G generations, has no
counterpart: here the reward is asked once per joint action — docs/actor_critic_learners.md, Q6.)
"""

from __future__ import annotations

import math

import pytest
import torch

torch.set_num_threads(1)

from llm_marl.learners.actor_critic import math as acm  # noqa: E402
from llm_marl.advantages import k3_kl, sample_losses, should_stop  # noqa: E402


def test_t1_single_turn_targets_and_advantages():
    targets = [acm.td_target(r, None, 1.0) for r in (1.0, 0.0)]
    assert targets == [1.0, 0.0]
    raw = acm.advantages(targets, [0.25, 0.25])
    assert raw == pytest.approx([0.75, -0.25])
    assert acm.whiten(raw) == pytest.approx([1.0, -1.0])


def test_t2_whitening_uses_the_population_std_and_leaves_a_single_sample():
    s = math.sqrt(2.5)
    assert acm.whiten([1.0, 3.0, 0.0, 4.0]) == pytest.approx([-1 / s, 1 / s, -2 / s, 2 / s], abs=1e-9)
    assert acm.whiten([1.0, 3.0, 0.0, 4.0]) == pytest.approx([-0.6325, 0.6325, -1.2649, 1.2649], abs=1e-4)
    assert acm.whiten([0.75]) == [0.75]
    assert acm.whiten([0.3, 0.3, 0.3]) == [0.0, 0.0, 0.0]
    with pytest.raises(FloatingPointError, match="finite"):
        acm.whiten([1.0, float("nan")])


def test_t3_three_turn_td_targets_advantages_and_returns():
    rewards, values = [-1.0, -2.0, 0.5], [0.5, 0.6, 0.4]
    targets = acm.td_targets(rewards, values, 0.9)
    assert targets == pytest.approx([-0.46, -1.64, 0.5], abs=1e-12)
    assert acm.advantages(targets, values) == pytest.approx([-0.96, -2.24, 0.10], abs=1e-12)


def test_t4_early_termination_rule():
    assert should_stop([-1.0, -0.5], -0.9)
    assert not should_stop([-1.0, -0.5], -0.7)
    assert should_stop([0.0, 0.0], -0.2)
    assert not should_stop([0.0, 0.0], 0.0)  # strictly above
    assert not should_stop([5.0], None)
    # an episode stopped after one turn is not bootstrapped
    assert acm.td_target(-0.75, None, 1.0) == -0.75


def test_t5_clipped_value_errors_and_their_gradients():
    values = torch.tensor([0.9, 0.6], requires_grad=True)
    old, targets = torch.tensor([0.5, 0.5]), torch.tensor([1.0, 1.0])
    errors = acm.value_errors(values, old, targets, 0.2)
    assert errors.tolist() == pytest.approx([0.09, 0.16])
    errors.sum().backward()
    assert values.grad.tolist() == pytest.approx([0.0, -0.8])
    assert 0.6 * errors.mean().item() == pytest.approx(0.075)  # L_V = c_v * mean e
    # without clipping: plain squared errors (0.01 for V=0.9)
    assert acm.value_errors(values.detach(), old, targets, None).tolist() == pytest.approx([0.01, 0.16])


def test_t6_reference_kl_shaping():
    kl = k3_kl(torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]]), torch.tensor([[True, True]]))
    expected = (math.exp(-0.5) + 0.5 - 1) + (math.exp(1) - 1 - 1)
    assert kl.item() == pytest.approx(expected) == pytest.approx(0.82481, abs=1e-5)
    assert acm.shaped_rewards([1.0], kl.tolist(), 0.1) == pytest.approx([0.917519], abs=1e-6)
    assert acm.shaped_rewards([1.0, 2.0], [], 0.1) == [1.0, 2.0]
    with pytest.raises(ValueError, match="2 rewards but 1 KL"):
        acm.shaped_rewards([1.0, 2.0], [0.5], 0.1)


def test_t7_central_values_give_each_agent_its_own_targets():
    joint_values = [0.2, 0.1]
    per_agent = {0: [1.0, 0.5], 1: [0.0, 0.5]}
    expected = {0: ([1.1, 0.5], [0.9, 0.4]), 1: ([0.1, 0.5], [-0.1, 0.4])}
    for agent, rewards in per_agent.items():
        targets = acm.td_targets(rewards, joint_values, 1.0)
        assert targets == pytest.approx(expected[agent][0])
        assert acm.advantages(targets, joint_values) == pytest.approx(expected[agent][1])


def test_t9_actor_loss_term_is_minus_logprob_times_advantage():
    # the actor loss is the REINFORCE learners' per-sample loss mean_k(-A_k log pi), shared code
    log_prob = torch.tensor([-1.2, -2.0]).sum()
    assert sample_losses(log_prob[None], torch.tensor([0.5]), [1]).tolist() == pytest.approx([1.6])
    two = sample_losses(torch.tensor([-3.2, -1.0]), torch.tensor([0.5, -1.0]), [1, 1])
    assert two.mean().item() == pytest.approx((1.6 - 1.0) / 2)


def test_mismatched_lengths_are_errors():
    with pytest.raises(ValueError, match="3 rewards but 2 values"):
        acm.td_targets([1, 2, 3], [0, 0], 1.0)
    with pytest.raises(ValueError, match="1 targets but 2 baselines"):
        acm.advantages([1.0], [0.0, 0.0])
    with pytest.raises(FloatingPointError, match="rewards: entry 1 is nan"):
        acm.check_finite([0.0, float("nan")], "rewards")

"""Advantage math against numbers computed by hand (docs/algorithms.md §2, §3.6, §3.7, §6).

The K=4 example used throughout: returns r = [1, 2, 3, 6], so sum = 12, mean = 3, max = 6.

    raw   A = r                       = [ 1,    2,    3,  6]
    mean  A = r - 3                   = [-2,   -1,    0,  3]
    rloo  A_k = r_k - (12 - r_k) / 3  = [1 - 11/3, 2 - 10/3, 3 - 9/3, 6 - 6/3]
                                      = [-8/3, -4/3,  0,  4]   (= 4/3 x the mean advantages)
    max   A = r - 6                   = [-5,   -4,   -3,  0]
    best  A = 1/n on the n answers at the max, 0 elsewhere = [0, 0, 0, 1]
          (normalized: centred [-1/4, -1/4, -1/4, 3/4], std sqrt(3/16) = 0.4330127,
           A = [-0.5773503, -0.5773503, -0.5773503, 1.7320508])

Normalized (every mode): centre, divide by the POPULATION std of the group:
    centred = [-2, -1, 0, 3]; variance = (4 + 1 + 0 + 9) / 4 = 3.5; std = sqrt(3.5) = 1.8708287
    A = [-2, -1, 0, 3] / 1.8708287 = [-1.0690450, -0.5345225, 0, 1.6035675]
(the sample std sqrt(14/3) = 2.1602469 would give [-0.9258201, -0.4629100, 0, 1.3887301]).
"""

from __future__ import annotations

import math

import pytest
import torch

torch.set_num_threads(1)

from llm_marl.advantages import (  # noqa: E402
    agent_returns,
    discounted_return,
    group_advantages,
    k3_kl,
    normalize_advantages,
    policy_gradient_loss,
)

RETURNS = [1.0, 2.0, 3.0, 6.0]
MODES = ("raw", "mean", "rloo", "max")

UNNORMALIZED = {
    "raw": [1.0, 2.0, 3.0, 6.0],
    "mean": [-2.0, -1.0, 0.0, 3.0],
    "rloo": [-8 / 3, -4 / 3, 0.0, 4.0],
    "max": [-5.0, -4.0, -3.0, 0.0],
}
NORMALIZED = [-1.0690450, -0.5345225, 0.0, 1.6035675]
SAMPLE_STD_NORMALIZED = [-0.9258201, -0.4629100, 0.0, 1.3887301]


@pytest.mark.parametrize("mode", MODES)
def test_unnormalized_advantages_match_hand_values(mode):
    got = group_advantages(RETURNS, mode, normalize=False)
    assert isinstance(got, list) and len(got) == 4
    assert got == pytest.approx(UNNORMALIZED[mode], abs=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_normalized_advantages_match_hand_values(mode):
    got = group_advantages(RETURNS, mode, normalize=True)
    assert got == pytest.approx(NORMALIZED, abs=1e-6)
    # population std (divide by K), not the sample std (divide by K-1)
    assert got != pytest.approx(SAMPLE_STD_NORMALIZED, abs=1e-3)


def test_normalization_is_the_default():
    assert group_advantages(RETURNS) == pytest.approx(NORMALIZED, abs=1e-6)
    assert group_advantages(RETURNS, "rloo") == pytest.approx(NORMALIZED, abs=1e-6)


def _random_groups():
    gen = torch.Generator().manual_seed(0)
    for k in (2, 3, 4, 5, 8, 16):
        for _ in range(10):
            yield (torch.randn(k, generator=gen, dtype=torch.float64) * 5).tolist()
    yield [0.0, 0.0, 1.0]
    yield [-3.0, 7.0]


def test_rloo_is_k_over_k_minus_1_times_mean():
    for returns in _random_groups():
        k = len(returns)
        rloo = group_advantages(returns, "rloo", normalize=False)
        mean = group_advantages(returns, "mean", normalize=False)
        assert rloo == pytest.approx([k / (k - 1) * a for a in mean], rel=0, abs=1e-12)


def test_max_advantages_are_nonpositive_and_the_best_sample_gets_zero():
    for returns in _random_groups():
        adv = group_advantages(returns, "max", normalize=False)
        assert all(a <= 0.0 for a in adv)
        best = max(range(len(returns)), key=returns.__getitem__)
        assert adv[best] == 0.0


def test_normalized_modes_agree_and_use_population_std():
    for returns in _random_groups():
        t = torch.tensor(returns, dtype=torch.float64)
        centred = t - t.mean()
        expected = (centred / max(float(t.std(correction=0)), 1e-6)).tolist()
        for mode in MODES:
            got = group_advantages(returns, mode)
            assert got == pytest.approx(expected, abs=1e-6), mode


def test_unnormalized_modes_keep_their_differences():
    values = {mode: group_advantages(RETURNS, mode, normalize=False) for mode in MODES}
    for a in MODES:
        for b in MODES:
            if a != b:
                assert values[a] != pytest.approx(values[b])


def test_best_imitates_the_groups_best_answers_and_splits_ties():
    assert group_advantages(RETURNS, "best", normalize=False) == [0.0, 0.0, 0.0, 1.0]
    assert group_advantages(RETURNS, "best") == pytest.approx([-0.5773503, -0.5773503, -0.5773503, 1.7320508], abs=1e-6)
    assert group_advantages([1.0, 6.0, 3.0, 6.0], "best", normalize=False) == [0.0, 0.5, 0.0, 0.5]
    assert group_advantages([-2.0, -7.0], "best", normalize=False) == [1.0, 0.0]


@pytest.mark.parametrize("mode", MODES + ("best",))
def test_equal_returns_give_zeros_not_nan(mode):
    got = group_advantages([5.0, 5.0, 5.0, 5.0], mode)
    assert got == [0.0, 0.0, 0.0, 0.0]
    assert not any(math.isnan(a) for a in got)


def test_std_floor_is_1e_minus_6():
    # returns [0, 0, 0, 4e-7]: mean 1e-7, centred [-1e-7, -1e-7, -1e-7, 3e-7],
    # population std sqrt(12e-14 / 4) = 1.732e-7 < 1e-6, so the divisor is 1e-6:
    # A = [-0.1, -0.1, -0.1, 0.3]   (without the floor: [-0.577, -0.577, -0.577, 1.732])
    got = group_advantages([0.0, 0.0, 0.0, 4e-7], "mean")
    assert got == pytest.approx([-0.1, -0.1, -0.1, 0.3], abs=1e-9)
    got = normalize_advantages(torch.tensor([0.0, 0.0, 0.0, 4e-7], dtype=torch.float64))
    assert got.tolist() == pytest.approx([-0.1, -0.1, -0.1, 0.3], abs=1e-9)


def test_tensor_in_tensor_out():
    t = torch.tensor(RETURNS, dtype=torch.float64)
    got = group_advantages(t, "mean")
    assert isinstance(got, torch.Tensor)
    assert got.tolist() == pytest.approx(NORMALIZED, abs=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_integer_returns_are_promoted_to_float(mode):
    got = group_advantages(torch.tensor([1, 2, 3, 6]), mode, normalize=False)
    assert got.is_floating_point() and got.tolist() == pytest.approx(UNNORMALIZED[mode])
    assert group_advantages(torch.tensor([1, 2, 3, 6]), mode).tolist() == pytest.approx(NORMALIZED, abs=1e-6)
    assert group_advantages([1, 2, 3, 6], mode) == pytest.approx(NORMALIZED, abs=1e-6)


@pytest.mark.parametrize("returns", [[], [1.0], [[1.0, 2.0], [3.0, 4.0]]])
@pytest.mark.parametrize("mode", MODES)
def test_fewer_than_two_returns_raise(returns, mode):
    with pytest.raises(ValueError, match="at least 2"):
        group_advantages(returns, mode)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("mode", MODES)
def test_non_finite_returns_raise(bad, mode):
    with pytest.raises(ValueError, match="finite"):
        group_advantages([1.0, bad, 2.0], mode)
    with pytest.raises(ValueError, match="finite"):
        group_advantages([1.0, bad, 2.0], mode, normalize=False)


def test_unknown_mode_raises_naming_the_allowed_modes():
    with pytest.raises(ValueError, match="rloo"):
        group_advantages(RETURNS, "median")


# --- per-agent returns (docs/algorithms.md §3.7) --------------------------------------------------------

# K=2, N=2, cross: joint actions (answer of agent 0, answer of agent 1) and their returns
CROSS_JOINT = [(0, 0), (0, 1), (1, 0), (1, 1)]
CROSS_RETURNS = [1.0, 4.0, 2.0, 8.0]
# agent 0: answer 0 is in (0,0)->1 and (0,1)->4; answer 1 is in (1,0)->2 and (1,1)->8
# agent 1: answer 0 is in (0,0)->1 and (1,0)->2; answer 1 is in (0,1)->4 and (1,1)->8
CROSS_EXPECTED = {
    "sum": ([5.0, 10.0], [3.0, 12.0]),
    "mean": ([2.5, 5.0], [1.5, 6.0]),
    "max": ([4.0, 8.0], [2.0, 8.0]),
}


@pytest.mark.parametrize("how", ["sum", "mean", "max"])
def test_agent_returns_cross(how):
    first, second = CROSS_EXPECTED[how]
    assert agent_returns(CROSS_JOINT, CROSS_RETURNS, 0, 2, how) == first
    assert agent_returns(CROSS_JOINT, CROSS_RETURNS, 1, 2, how) == second


def test_agent_returns_default_is_sum():
    assert agent_returns(CROSS_JOINT, CROSS_RETURNS, 0, 2) == [5.0, 10.0]


@pytest.mark.parametrize("how", ["sum", "mean", "max"])
def test_agent_returns_aligned_is_the_joint_return(how):
    joint = [(0, 0), (1, 1)]
    assert agent_returns(joint, [3.0, 7.0], 0, 2, how) == [3.0, 7.0]
    assert agent_returns(joint, [3.0, 7.0], 1, 2, how) == [3.0, 7.0]


def test_agent_returns_errors():
    with pytest.raises(ValueError, match="cross_aggregation"):
        agent_returns(CROSS_JOINT, CROSS_RETURNS, 0, 2, "median")
    with pytest.raises(ValueError, match="no joint action"):
        agent_returns([(0, 0)], [1.0], 0, 2)


# --- reference KL (k3) -------------------------------------------------------------------------


def test_k3_kl_is_zero_for_identical_log_probs():
    logps = torch.log(torch.tensor([[0.5, 0.25, 0.1], [0.9, 0.05, 0.3]]))
    mask = torch.tensor([[True, True, True], [True, True, False]])
    assert k3_kl(logps, logps.clone(), mask).tolist() == [0.0, 0.0]


def test_k3_kl_hand_values():
    # row 0: delta = l_ref - l_pol = log .25 - log .5 = -ln 2 -> e^-ln2 + ln2 - 1 = 0.5 + 0.6931472 - 1
    #        = 0.1931472; second token identical -> 0; third token masked -> 0 whatever its values
    # row 1: delta = +ln 2 -> 2 - ln 2 - 1 = 0.3068528; other tokens masked
    policy = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.25, 0.01, 0.01]]))
    reference = torch.log(torch.tensor([[0.25, 0.25, 0.001], [0.5, 0.99, 0.99]]))
    mask = torch.tensor([[True, True, False], [True, False, False]])
    got = k3_kl(policy, reference, mask)
    assert got.tolist() == pytest.approx([0.1931472, 0.3068528], abs=1e-6)
    assert (got >= 0).all()


# --- discounted returns (docs/algorithms.md §3.6) ---------------------------------------------------------


def test_discounted_return():
    assert discounted_return(3.0, None, 0.9) == 3.0  # leaf: G = r
    assert discounted_return(3.0, [], 0.9) == 3.0
    assert discounted_return(1.0, [2.0, 4.0], 1.0) == 4.0  # 1 + 1.0 * mean(2, 4)
    assert discounted_return(1.0, [2.0, 4.0], 0.5) == 2.5  # 1 + 0.5 * 3
    assert discounted_return(-1.0, [2.0, 4.0, 9.0], 0.0) == -1.0
    assert discounted_return(0.5, [1.0, 2.0, 3.0, 6.0], 0.25) == 0.5 + 0.25 * 3.0


# --- the loss (docs/algorithms.md §4) ---------------------------------------------------------------------


def test_policy_gradient_loss_hand_value_and_gradient():
    # -A * log pi: [[-(1)(-1), -(-1)(-2)], [-(2)(-0.5), -(1)(-1)]] = [[1, -2], [1, 1]] -> mean 0.25
    log_probs = torch.tensor([[-1.0, -2.0], [-0.5, -1.0]], requires_grad=True)
    advantages = torch.tensor([[1.0, -1.0], [2.0, 1.0]], requires_grad=True)
    loss = policy_gradient_loss(log_probs, advantages)
    assert loss.item() == pytest.approx(0.25)
    loss.backward()
    assert torch.allclose(log_probs.grad, -advantages.detach() / 4)
    assert advantages.grad is None  # advantages are constants


def test_raw_returns_without_normalization_accept_a_group_of_one():
    """Plain REINFORCE at K = 1: the advantage is the return; any baseline or normalization
    still needs two returns."""
    assert group_advantages([2.5], "raw", normalize=False) == [2.5]
    with pytest.raises(ValueError, match="at least 2 returns"):
        group_advantages([2.5], "mean", normalize=False)
    with pytest.raises(ValueError, match="at least 2 returns"):
        group_advantages([2.5], "raw", normalize=True)

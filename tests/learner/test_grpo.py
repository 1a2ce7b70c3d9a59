"""GRPO math against values worked out by hand in float64."""

from __future__ import annotations

import math

import pytest
import torch

from learner.grpo import clipped_surrogate_loss, group_advantages

EPS = 1e-6


def f64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


# Two groups, interleaved in the batch: group 0 = rewards (1, 0, 0, 0), group 1 = rewards (2, 4).
REWARDS = f64([1.0, 2.0, 0.0, 0.0, 4.0, 0.0])
GROUPS = torch.tensor([0, 1, 0, 0, 1, 0])


def test_group_advantages_by_hand() -> None:
    # group 0: mean = 1/4 = 0.25; deviations 0.75, -0.25, -0.25, -0.25;
    #          population variance = (0.5625 + 3 * 0.0625) / 4 = 0.1875, std = sqrt(0.1875) = 0.4330127...
    # group 1: mean = 3; deviations -1, +1; variance = (1 + 1) / 2 = 1, std = 1
    std0 = math.sqrt(0.1875)
    expected = [0.75 / (std0 + EPS), -1.0 / (1.0 + EPS), -0.25 / (std0 + EPS), -0.25 / (std0 + EPS),
                1.0 / (1.0 + EPS), -0.25 / (std0 + EPS)]

    adv = group_advantages(REWARDS, GROUPS, eps=EPS)

    assert adv.dtype == torch.float64
    assert adv.tolist() == pytest.approx(expected, rel=1e-12)
    # the closed forms: the lone success of four is +sqrt(3), each failure -1/sqrt(3)
    assert adv[0].item() == pytest.approx(math.sqrt(3), rel=1e-5)
    assert adv[2].item() == pytest.approx(-1 / math.sqrt(3), rel=1e-5)


def test_group_advantages_use_population_std() -> None:
    # (1, 0): mean 0.5, population std 0.5 -> +-1 (the sample std, 0.707, would give +-0.707)
    adv = group_advantages(f64([1.0, 0.0]), torch.tensor([0, 0]), eps=0.0)

    assert adv.tolist() == pytest.approx([1.0, -1.0], rel=1e-12)


def test_group_with_equal_rewards_has_zero_advantage() -> None:
    adv = group_advantages(f64([1.0, 1.0, 1.0, 0.0, 1.0]), torch.tensor([0, 0, 0, 1, 1]))

    assert adv[:3].tolist() == [0.0, 0.0, 0.0]
    assert not torch.isnan(adv).any()
    assert adv[3].item() == pytest.approx(-0.5 / (0.5 + 1e-6), rel=1e-12)


def test_mean_only_advantages() -> None:
    # the same two groups, centred but not scaled: r - 0.25 in group 0, r - 3 in group 1
    adv = group_advantages(REWARDS, GROUPS, scale=False)

    assert adv.tolist() == pytest.approx([0.75, -1.0, -0.25, -0.25, 1.0, -0.25], rel=1e-12)


# Surrogate: clip_eps = 0.2, so the trust region for the ratio is [0.8, 1.2].
#   row 0, A = +1:  ratios 1.1 (inside), 1.5 (above: clipped to 1.2), 0.5 (below: min keeps 0.5, not clipped)
#   row 1, A = -2:  ratios 0.9 (inside), 0.5 (below: min picks 0.8 * -2 = -1.6), 1.5 (above: min keeps -3.0)
#   row 2, A = 0.5: ratio 1.05 learns; ratios 2.0 and 0.1 are masked out
RATIOS = [[1.1, 1.5, 0.5], [0.9, 0.5, 1.5], [1.05, 2.0, 0.1]]
ADVANTAGES = [1.0, -2.0, 0.5]
MASK = [[1, 1, 1], [1, 1, 1], [1, 0, 0]]
BEHAVIOUR = [[-1.0, -2.0, -0.5], [-0.3, -1.2, -2.5], [-0.7, -0.1, -4.0]]


def surrogate_inputs():
    behaviour = f64(BEHAVIOUR)
    logp = (behaviour + f64(RATIOS).log()).requires_grad_(True)
    return logp, behaviour, f64(ADVANTAGES), torch.tensor(MASK)


def test_clipped_surrogate_loss_by_hand() -> None:
    # per-token min(ratio * A, clip(ratio) * A) on learning tokens:
    #   row 0: 1.1, min(1.5, 1.2) = 1.2, min(0.5, 0.8) = 0.5                 -> 2.8
    #   row 1: -1.8, min(-1.0, -1.6) = -1.6, min(-3.0, -2.4) = -3.0           -> -6.4
    #   row 2: 0.525                                                         -> 0.525
    # 7 learning tokens: loss = -(2.8 - 6.4 + 0.525) / 7 = 3.075 / 7
    logp, behaviour, adv, mask = surrogate_inputs()

    terms = clipped_surrogate_loss(logp, behaviour, adv, mask, clip_eps=0.2)

    assert terms.loss.item() == pytest.approx(3.075 / 7, rel=1e-12)
    # ratios outside [0.8, 1.2] on learning tokens: 1.5, 0.5, 0.5, 1.5 -> 4 of 7
    assert terms.clip_fraction == pytest.approx(4 / 7)
    # mean ratio on learning tokens: (1.1 + 1.5 + 0.5 + 0.9 + 0.5 + 1.5 + 1.05) / 7
    assert terms.mean_ratio == pytest.approx(7.05 / 7)


def test_clipped_surrogate_gradient_by_hand() -> None:
    # d(ratio * A)/d logp = ratio * A where the unclipped term is chosen, 0 where the clipped constant is;
    # the loss is minus the mean over 7 tokens, so grad = -ratio * A / 7 there; masked tokens get 0.
    expected = [[-1.1 / 7, 0.0, -0.5 / 7],
                [1.8 / 7, 0.0, 3.0 / 7],
                [-0.525 / 7, 0.0, 0.0]]
    logp, behaviour, adv, mask = surrogate_inputs()

    clipped_surrogate_loss(logp, behaviour, adv, mask, clip_eps=0.2).loss.backward()

    torch.testing.assert_close(logp.grad, f64(expected), rtol=1e-12, atol=1e-15)


def test_on_policy_loss_is_minus_mean_advantage_per_token() -> None:
    # ratio 1 everywhere: loss = -(A0 * 2 + A1 * 1) / 3 with masks (1, 1) and (1, 0)
    behaviour = f64([[-1.0, -2.0], [-0.5, -0.5]])
    logp = behaviour.clone().requires_grad_(True)

    terms = clipped_surrogate_loss(logp, behaviour, f64([0.6, -0.3]), torch.tensor([[1, 1], [1, 0]]))
    terms.loss.backward()

    assert terms.loss.item() == pytest.approx(-(0.6 * 2 - 0.3) / 3, rel=1e-12)
    assert terms.clip_fraction == 0.0
    assert terms.mean_ratio == pytest.approx(1.0)
    torch.testing.assert_close(logp.grad, f64([[-0.2, -0.2], [0.1, 0.0]]), rtol=1e-12, atol=1e-15)


def test_fully_masked_batch_gives_zero_loss_not_nan() -> None:
    logp, behaviour, adv, _ = surrogate_inputs()

    terms = clipped_surrogate_loss(logp, behaviour, adv, torch.zeros(3, 3))
    terms.loss.backward()

    assert terms.loss.item() == 0.0
    assert torch.equal(logp.grad, torch.zeros(3, 3, dtype=torch.float64))

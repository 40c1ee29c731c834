"""The clipped policy loss, its gradients and its variants, against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from tryloop.train.losses import entropy, k3, normaliser, policy_loss

LN = math.log


def one(log_ratios, adv, mask=None, **kw):
    """Loss and d loss / d logp_new for one sequence whose old logprobs are 0."""
    logp = torch.tensor([log_ratios], dtype=torch.float64, requires_grad=True)
    old = torch.zeros_like(logp)
    m = torch.ones_like(logp) if mask is None else torch.tensor([mask], dtype=torch.float64)
    a = torch.tensor([adv], dtype=torch.float64)
    out = policy_loss(logp, old, a, m, **kw)
    out.loss.backward()
    return out.loss.item(), logp.grad[0].tolist(), out.stats


def test_ratio_one_is_the_policy_gradient():
    # r = 1 everywhere: loss = -A, d/dlogp = -A * r / N = -2/3 per token.
    loss, grad, stats = one([0.0, 0.0, 0.0], 2.0)
    assert loss == pytest.approx(-2.0)
    assert grad == pytest.approx([-2 / 3] * 3)
    assert stats["ratio_mean"] == pytest.approx(1.0)
    assert stats["clip_frac"] == 0.0
    assert stats["approx_kl"] == pytest.approx(0.0)


@pytest.mark.parametrize(("ratio", "adv", "loss", "grad", "clipped"), [
    # above 1 + eps with A > 0: the clipped branch wins, no gradient (no more push up)
    (1.5, +1.0, -1.2, 0.0, True),
    # above 1 + eps with A < 0: min(-1.5, -1.2) = -1.5 keeps the unclipped term, gradient flows
    (1.5, -1.0, 1.5, 1.5, False),
    # below 1 - eps with A < 0: clipped at 0.8, no gradient (no more push down)
    (0.5, -1.0, 0.8, 0.0, True),
    # below 1 - eps with A > 0: min(0.5, 0.8) = 0.5 unclipped, gradient -A * r
    (0.5, +1.0, -0.5, -0.5, False),
])
def test_clip_is_one_sided(ratio, adv, loss, grad, clipped):
    got_loss, got_grad, stats = one([LN(ratio)], adv, eps_low=0.2, eps_high=0.2)
    assert got_loss == pytest.approx(loss)
    assert got_grad == pytest.approx([grad])
    assert stats["clip_frac"] == (1.0 if clipped else 0.0)


def test_clip_higher_is_asymmetric():
    # r = 1.25, A = +1: clipped by the symmetric 0.2, free under DAPO's eps_high = 0.28.
    _, g_sym, _ = one([LN(1.25)], 1.0, eps_low=0.2, eps_high=0.2)
    loss, g_dapo, stats = one([LN(1.25)], 1.0, eps_low=0.2, eps_high=0.28)
    assert g_sym == [0.0]
    assert g_dapo == pytest.approx([-1.25]) and loss == pytest.approx(-1.25)
    assert stats["clip_frac"] == 0.0
    # r = 0.75, A = -1: the low side still clips at 0.8 under both.
    for hi in (0.2, 0.28):
        loss, g, stats = one([LN(0.75)], -1.0, eps_low=0.2, eps_high=hi)
        assert (loss, g) == (pytest.approx(0.8), [0.0])
        assert stats["clip_frac_low"] == 1.0 and stats["clip_frac_high"] == 0.0
    # r = 1.3, A = +1: beyond 1.28 too.
    loss, g, stats = one([LN(1.3)], 1.0, eps_low=0.2, eps_high=0.28)
    assert (loss, g) == (pytest.approx(-1.28), [0.0])
    assert stats["clip_frac_high"] == 1.0


def test_masked_tokens_do_not_count():
    # Token 2 is masked; its huge log ratio must not leak into loss, gradient or stats.
    loss, grad, stats = one([0.0, 50.0, 0.0], 1.0, mask=[1, 0, 1])
    assert loss == pytest.approx(-1.0)
    assert grad == pytest.approx([-0.5, 0.0, -0.5])
    assert stats["tokens"] == 2.0 and stats["ratio_mean"] == pytest.approx(1.0)


def batch_two():
    """Sequence 0: one policy token, A = +1. Sequence 1: three policy tokens, A = -1. r = 1."""
    logp = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    return logp, mask, adv


@pytest.mark.parametrize(("aggregation", "loss", "grads"), [
    # per-token losses: -1 (seq 0), +1 +1 +1 (seq 1)
    ("token_mean", (-1 + 3) / 4, [[-1 / 4, 0, 0], [1 / 4] * 3]),
    ("seq_mean", (-1 / 1 + 3 / 3) / 2, [[-1 / 2, 0, 0], [1 / 6] * 3]),
    ("seq_sum_const", (-1 + 3) / (2 * 4), [[-1 / 8, 0, 0], [1 / 8] * 3]),
])
def test_aggregations(aggregation, loss, grads):
    logp, mask, adv = batch_two()
    out = policy_loss(logp, torch.zeros_like(logp), adv, mask, aggregation=aggregation, loss_const=4)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(loss)
    assert logp.grad.tolist() == [pytest.approx(g) for g in grads]


def test_normaliser_over_micro_batches():
    a = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])  # second row has no policy token
    b = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    assert normaliser([a, b], "token_mean") == 6.0
    assert normaliser([a, b], "seq_mean") == 4.0
    assert normaliser([a, b], "seq_sum_const", loss_const=10) == 40.0
    assert normaliser(torch.zeros(2, 2), "token_mean") == 1.0  # never divides by zero
    with pytest.raises(ValueError):
        normaliser(a, "seq_sum_const")


def test_explicit_norm_splits_a_batch_exactly():
    logp, mask, adv = batch_two()
    whole = policy_loss(logp, torch.zeros_like(logp), adv, mask, aggregation="seq_mean").loss
    z = normaliser(mask, "seq_mean")
    parts = [policy_loss(logp[i:i + 1], torch.zeros(1, 3, dtype=torch.float64), adv[i:i + 1],
                         mask[i:i + 1], aggregation="seq_mean", norm=z).loss for i in range(2)]
    assert sum(parts).item() == pytest.approx(whole.item())


def test_gspo_ratio_is_the_geometric_mean():
    lr = [LN(1.1), LN(1.3), LN(0.9)]
    s = math.exp(sum(lr) / 3)  # (1.1 * 1.3 * 0.9) ** (1/3) = 1.0877...
    assert s == pytest.approx(1.287 ** (1 / 3))
    loss, grad, stats = one(lr, 1.0, gspo=True, eps_low=0.2, eps_high=0.2)
    assert stats["ratio_mean"] == pytest.approx(s)
    assert loss == pytest.approx(-s)
    # d(-s)/d logp_t = -s / 3, the same for every token
    assert grad == pytest.approx([-s / 3] * 3)


def test_gspo_clips_the_sequence_not_the_token():
    # Token ratios 2 and 0.5: geometric mean 1, nothing clipped, both tokens get -A*s/2.
    loss, grad, stats = one([LN(2.0), LN(0.5)], 1.0, gspo=True)
    assert loss == pytest.approx(-1.0) and grad == pytest.approx([-0.5, -0.5])
    assert stats["clip_frac"] == 0.0
    # Token-level: token 1 is clipped (no gradient), token 2 keeps r = 0.5 -> -0.5/2.
    loss, grad, _ = one([LN(2.0), LN(0.5)], 1.0, gspo=False)
    assert loss == pytest.approx(-(1.2 + 0.5) / 2) and grad == pytest.approx([0.0, -0.25])
    # Both tokens at ratio 2: the sequence ratio 2 is clipped at 1.2, no gradient anywhere.
    loss, grad, stats = one([LN(2.0), LN(2.0)], 1.0, gspo=True)
    assert loss == pytest.approx(-1.2) and grad == [0.0, 0.0]
    assert stats["clip_frac"] == 1.0


def test_gspo_with_seq_mean_is_a_mean_over_sequences():
    logp = torch.tensor([[LN(2.0), 0.0, 0.0], [LN(1.1), LN(1.1), LN(1.1)]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    out = policy_loss(logp, torch.zeros_like(logp), adv, mask, gspo=True, aggregation="seq_mean")
    # seq 0: min(2, 1.2) * 1 -> -1.2; seq 1: ratio 1.1, A = -1: min(-1.1, -1.1) -> +1.1
    assert out.loss.item() == pytest.approx((-1.2 + 1.1) / 2)


def test_k3_kl():
    # ref - new = ln 0.5: 0.5 - ln 0.5 - 1 = 0.193147...
    assert float(k3(torch.tensor(LN(0.25)), torch.tensor(LN(0.5)))) == pytest.approx(0.5 + LN(2) - 1)
    assert float(k3(torch.tensor(-1.3), torch.tensor(-1.3))) == 0.0
    logp = torch.tensor([[LN(0.5), LN(0.5)]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[LN(0.25), LN(0.5)]], dtype=torch.float64)
    out = policy_loss(logp, logp.detach(), torch.zeros(1), torch.ones(1, 2), ref_logp=ref, kl_coef=0.1)
    kl0 = 0.5 + LN(2) - 1
    assert out.stats["kl"] == pytest.approx(kl0 / 2)
    assert out.loss.item() == pytest.approx(0.1 * kl0 / 2)
    out.loss.backward()
    # d k3 / d new = 1 - exp(ref - new) = 1 - 0.5 on token 1, 0 on token 2
    assert logp.grad[0].tolist() == pytest.approx([0.1 * 0.5 / 2, 0.0])


def test_kl_off_by_default_costs_nothing():
    logp = torch.zeros(1, 2)
    out = policy_loss(logp, logp, torch.ones(1), torch.ones(1, 2))
    assert "kl" not in out.stats


def test_approx_kl_and_entropy_stats():
    logits = torch.zeros(1, 1, 4)  # uniform over 4 tokens
    _, _, stats = one([LN(1.5)], 1.0, eps_high=1.0)
    assert stats["approx_kl"] == pytest.approx(1.5 - 1 - LN(1.5))  # k3 of KL(old || new)
    out = policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1),
                      logits=logits)
    assert out.stats["entropy"] == pytest.approx(LN(4))
    assert entropy(torch.tensor([0.0, -1e9])).item() == pytest.approx(0.0, abs=1e-6)


def test_truncated_importance_weights_scale_each_tokens_loss_and_are_capped():
    from tryloop.train.losses import tis_weights

    # pi_old (the learner's) vs mu (the older weights that sampled): ratios e^0.5, e^-1, e^2 (capped at 2).
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    mu = torch.tensor([[-1.5, -1.0, -2.5, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    w = tis_weights(old, mu, mask, cap=2.0)
    assert torch.allclose(w[0, :3], torch.tensor([math.exp(0.5), math.exp(-1.0), 2.0]))
    assert w[0, 3] == 1.0                    # masked: no weight from a token that is not trained on
    logp = old.clone().requires_grad_(True)
    adv = torch.tensor([1.0])
    out = policy_loss(logp, old, adv, mask, is_weights=w, is_cap=2.0)
    # ratio 1 everywhere: loss = -sum(w * A) / tokens, and each token's gradient is -w * A / tokens.
    assert out.loss.item() == pytest.approx(-(math.exp(0.5) + math.exp(-1.0) + 2.0) / 3)
    out.loss.backward()
    assert torch.allclose(logp.grad[0, :3], -w[0, :3] / 3)
    assert out.stats["tis_weight_mean"] == pytest.approx((math.exp(0.5) + math.exp(-1.0) + 2.0) / 3)
    assert out.stats["tis_truncated_frac"] == pytest.approx(1 / 3)
    # Without weights the loss is unchanged from before.
    plain = policy_loss(old.clone().requires_grad_(True), old, adv, mask)
    assert plain.loss.item() == pytest.approx(-1.0) and "tis_weight_mean" not in plain.stats


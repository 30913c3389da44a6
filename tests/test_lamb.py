"""LAMB against an independent NumPy transcription of You et al. 2019, Algorithm 2."""

import copy

import numpy as np
import pytest
import torch

from bertkit.errors import BertkitError
from bertkit.training.lamb import Lamb


def lamb_reference(w, grads, lr, b1, b2, eps, wd, trust):
    """Algorithm 2 written out in float64 NumPy, one tensor, one step per gradient."""
    w = w.astype(np.float64).copy()
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        g = g.astype(np.float64)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat = m / (1 - b1**t)
        v_hat = v / (1 - b2**t)
        u = m_hat / (np.sqrt(v_hat) + eps) + wd * w
        wn, un = np.linalg.norm(w), np.linalg.norm(u)
        r = wn / un if (trust and wn > 0 and un > 0) else 1.0
        w = w - lr * r * u
    return w


@pytest.mark.parametrize("trust,wd", [(True, 0.01), (True, 0.0), (False, 0.01)])
def test_lamb_matches_the_paper_algorithm(trust, wd):
    rng = np.random.default_rng(0)
    w0 = rng.normal(size=(5, 7)).astype(np.float32)
    grads = [rng.normal(scale=s, size=(5, 7)).astype(np.float32) for s in (1.0, 0.1, 3.0, 0.5)]
    p = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    opt = Lamb([p], lr=0.05, betas=(0.9, 0.99), eps=1e-6, weight_decay=wd, trust_ratio=trust)
    for g in grads:
        p.grad = torch.from_numpy(g)
        opt.step()
    expected = lamb_reference(w0, grads, 0.05, 0.9, 0.99, 1e-6, wd, trust)
    np.testing.assert_allclose(p.detach().numpy(), expected, rtol=1e-5, atol=1e-6)


def test_trust_ratio_makes_every_layer_move_by_lr_times_its_norm():
    # The point of LAMB: ||delta w|| = lr * ||w|| per tensor, whatever the gradient scale.
    torch.manual_seed(0)
    big = torch.nn.Parameter(torch.randn(20, 20) * 10)
    small = torch.nn.Parameter(torch.randn(20) * 0.01)
    before = [big.detach().clone(), small.detach().clone()]
    opt = Lamb([big, small], lr=0.01, weight_decay=0.0)
    big.grad, small.grad = torch.randn(20, 20) * 1e3, torch.randn(20) * 1e-4
    opt.step()
    for p, w in zip((big, small), before):
        assert torch.linalg.norm(p.detach() - w).item() == pytest.approx(0.01 * torch.linalg.norm(w).item(), rel=1e-4)


def test_zero_weights_fall_back_to_ratio_one():
    p = torch.nn.Parameter(torch.zeros(4))
    opt = Lamb([p], lr=0.1, weight_decay=0.0)
    p.grad = torch.tensor([1.0, -2.0, 0.5, 0.0])
    opt.step()
    # first Adam step: m_hat / sqrt(v_hat) = sign(g) (eps negligible), ratio 1
    np.testing.assert_allclose(p.detach().numpy(), [-0.1, 0.1, -0.1, 0.0], atol=1e-6)


def test_lamb_state_round_trips_through_state_dict():
    torch.manual_seed(1)
    a = torch.nn.Parameter(torch.randn(3, 3))
    b = torch.nn.Parameter(a.detach().clone())
    opt_a, opt_b = Lamb([a], lr=0.01), Lamb([b], lr=0.01)
    g = [torch.randn(3, 3) for _ in range(4)]
    for gi in g[:2]:
        a.grad = gi.clone()
        opt_a.step()
    b.data.copy_(a.data)
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))  # as if read back from disk
    for gi in g[2:]:
        a.grad, b.grad = gi.clone(), gi.clone()
        opt_a.step()
        opt_b.step()
    assert torch.equal(a, b)


def test_bad_settings_are_user_errors():
    p = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(BertkitError, match="betas"):
        Lamb([p], betas=(1.0, 0.999))
    with pytest.raises(BertkitError, match="learning rate"):
        Lamb([p], lr=-1)

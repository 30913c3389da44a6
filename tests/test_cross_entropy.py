"""bertkit.model.cross_entropy against torch's F.cross_entropy: loss and gradient, in blocks of rows."""

import pytest
import torch
import torch.nn.functional as F

from bertkit.model import cross_entropy as ce


def case(dtype, M=37, V=301):
    torch.manual_seed(0)
    logits = (torch.randn(M, V, dtype=torch.float64) * 4).to(dtype).requires_grad_()
    return logits, torch.randint(0, V, (M,))


@pytest.mark.parametrize("block", [301, 1000, 2**18])  # one row a block, three, all
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
def test_equals_torch(monkeypatch, block, dtype, tol):
    monkeypatch.setattr(ce, "BLOCK", block)
    logits, target = case(dtype)
    before = logits.detach().clone()
    ours = ce.cross_entropy(logits, target)
    (g_ours,) = torch.autograd.grad(ours * 1.7, logits)
    assert torch.equal(logits.detach(), before)  # the saved logits are not overwritten
    ref = F.cross_entropy(logits, target)
    (g_ref,) = torch.autograd.grad(ref * 1.7, logits)
    torch.testing.assert_close(ours, ref, rtol=tol, atol=tol)
    torch.testing.assert_close(g_ours, g_ref, rtol=tol, atol=tol)


def test_bf16_logits_as_autocast_computes_them():
    logits, target = case(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = ce.cross_entropy(logits, target)
        ref = F.cross_entropy(logits, target)  # autocast runs it in float32
    (g_ours,) = torch.autograd.grad(ours, logits)
    (g_ref,) = torch.autograd.grad(ref, logits)
    assert ours.dtype == ref.dtype == torch.float32 and g_ours.dtype == torch.bfloat16
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(g_ours.float(), g_ref.float(), rtol=0.01, atol=1e-6)  # bf16 rounding of the gradient

"""Softmax cross-entropy over a large vocabulary, computed a few rows at a time.

The masked-LM loss scores every masked token against all V = 30,522 words: logits
[M, V], loss = mean over rows of logsumexp(row) - row[target], and the gradient
(softmax(row) - onehot(target)) / M. `torch.nn.functional.cross_entropy` gets there
through whole [M, V] float32 tensors: under bf16 autocast a float32 copy of the
logits, the log-probabilities, then in backward a zeroed [M, V] gradient of the
loss, the log-softmax gradient and its cast back to bf16: several passes over
18 million numbers for 600 masked tokens, a quarter of a bf16 pre-training step of
the mini model.

Here the forward keeps one number per row (its logsumexp), and the backward makes
each row's gradient from the logits and that number, both going through blocks of
rows that stay in the CPU's cache: the logits are read once forward and once
backward, and the gradient written once, in the logits' dtype. The sums are done
in float32 (float64 for float64 logits), as autocast does for cross_entropy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BLOCK = 2**18  # logits per block of rows: 1 MB in float32


def _rows(V: int) -> int:
    return max(1, BLOCK // V)


def _sum_dtype(logits: torch.Tensor) -> torch.dtype:
    return torch.promote_types(logits.dtype, torch.float32)  # float32, or float64 for float64 logits


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target):
        M, V = logits.shape
        dtype, step = _sum_dtype(logits), _rows(V)
        lse = torch.empty(M, dtype=dtype, device=logits.device)
        for r in range(0, M, step):
            lse[r:r + step] = torch.logsumexp(logits[r:r + step].to(dtype), dim=-1)
        picked = logits.gather(1, target[:, None])[:, 0].to(dtype)  # each row's score of its target
        ctx.save_for_backward(logits, target, lse)
        return (lse - picked).mean()

    @staticmethod
    def backward(ctx, grad):
        logits, target, lse = ctx.saved_tensors
        M, V = logits.shape
        out = torch.empty_like(logits)
        scale, step = grad.to(lse.dtype) / M, _rows(V)
        for r in range(0, M, step):
            rows = slice(r, r + step)
            p = logits[rows].to(lse.dtype, copy=True).sub_(lse[rows, None]).exp_()  # softmax of the rows
            p[torch.arange(p.shape[0], device=p.device), target[rows]] -= 1  # minus onehot(target)
            out[rows] = p.mul_(scale)
        return out, None


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean softmax cross-entropy of logits [M, V] (M >= 1) against class ids [M] (none ignored).

    On the CPU; elsewhere torch's kernel (a GPU's fused kernels do not have the problem)."""
    if logits.device.type != "cpu":
        return F.cross_entropy(logits, target)
    return _CrossEntropy.apply(logits, target)

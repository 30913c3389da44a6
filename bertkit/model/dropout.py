"""Dropout (Srivastava et al. 2014, "Dropout: A Simple Way to Prevent Neural Networks
from Overfitting"): in training every element is zeroed with probability p and the
survivors are scaled by 1 / (1 - p), so each element keeps its expected value and
inference needs no rescaling. BERT drops the embeddings' output, the attention
weights and each sub-layer's output, all at 0.1.

The arithmetic is torch's own (`torch.nn.functional.dropout` on the CPU: the input
times a mask of 0 and 1 / (1 - p) in the input's dtype, so the gradient is the
same mask times the incoming gradient); only the drawing of the mask differs. torch
draws it with `bernoulli_`, one call of its random generator and one float draw per
element, on one thread. In BERT training that was a sixth of a float32 step and
over a quarter of a bf16 step: the attention weights alone are B x N x T x T
elements per layer. Here one 64-bit draw gives two 32-bit integers, and an element
is dropped when its integer falls in the lowest p * 2^32 of their range: the same
Bernoulli(p) (p resolved to 2^-32, finer than torch's 24-bit float draw), from the
same seeded generator, at under half the cost (`tests/test_dropout.py` holds the
statistics). Other devices keep torch's kernel, which draws and applies the mask in
one fused pass, and so does a model under `torch.compile` (`pretrain run --compile`),
whose compiler fuses it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def keep_mask(shape, p: float, device=None, out: torch.Tensor | None = None) -> torch.Tensor:
    """A bool tensor of `shape` (or `out`, filled), each element True (kept) with probability 1 - p, independently."""
    n = math.prod(shape)
    cut = round(p * 2**32) - 2**31  # the lowest p * 2^32 of the int32 range are dropped
    draws = torch.empty((n + 1) // 2, dtype=torch.int64, device=device).random_(-2**63, None)  # all 64 bits
    drawn = draws.view(torch.int32)[:n].view(shape)  # two int32s a draw
    return drawn.ge(cut) if out is None else torch.ge(drawn, cut, out=out)


def as_dtype(keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool mask as 1 and 0 in `dtype` (through uint8: torch converts bool to float a few times slower)."""
    return keep.view(torch.uint8).to(dtype)


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """x with each element zeroed with probability p and the rest scaled by 1 / (1 - p) (training only)."""
    if not training or p == 0:
        return x
    # torch's fused kernel off the CPU, for its checks and p = 1, and under torch.compile, which traces F.dropout
    # into its graph where the in-place draw below (`random_`) would break the graph at every dropout
    if x.device.type != "cpu" or not 0 < p < 1 or torch.compiler.is_compiling():
        return F.dropout(x, p, True)
    return x * as_dtype(keep_mask(x.shape, p, x.device), x.dtype).div_(1 - p)  # 0 or 1 / (1 - p), as torch's


class Dropout(nn.Dropout):
    """`nn.Dropout` (same attributes, same arithmetic) with the mask drawn by `keep_mask`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

"""Attention with dropout on its weights, in training, a few sequences at a time.

BERT drops 10% of the attention weights in training (`attention_probs_dropout_prob`),
so the fused kernels that never materialise the [B, N, T, T] weights (FlashAttention,
Dao et al. 2022; torch's CPU kernel) are not used: torch has no CPU kernel that
drops inside them, and the plain computation keeps the scores, the weights, the
dropout mask and the dropped weights of every layer for the backward pass. At 32
sequences of 256 tokens that is 100 MB each, per layer, written and read again from
main memory (and, with glibc's default malloc, zero-filled by the kernel page by
page at every allocation), the main part of what attention dropout added to a training
step (docs/benchmarks.md, "Numbers that left the docstrings").

This is FlashAttention's remedy at the grain of whole sequences: the forward pass
goes through a few sequences at a time (about 2^20 weights, a few MB that stay in
the CPU's cache), keeps only the output and the dropout mask (one byte a weight),
and the backward pass recomputes each chunk's weights from q and k (one more
q k^T product per layer) and takes the gradients there. A chunk holds whole rows,
so the softmax needs none of FlashAttention's running rescaling. The sums are
those of the plain computation (bertkit.model.modeling's explicit path):

    scores  S = q k^T / sqrt(D) + mask           weights W = softmax(S)   (rows)
    dropped P = W * keep / (1 - p)               context   = P v
    dV = P^T dC     dP = dC v^T     dW = dP * keep / (1 - p)
    dS = W * (dW - rowsum(dW * W))   dq = dS k / sqrt(D)   dk = dS^T q / sqrt(D)

(the 1 / sqrt(D) is applied to q and the 1 / (1 - p) to v, once, before the
chunks: P v = (W * keep) (v / (1 - p))), and the mask is drawn in chunk order from
the same generator as one `bertkit.model.dropout.keep_mask` of the whole [B, N, T, T]
(when a chunk's size is even). Chunking is the CPU's remedy: on a GPU, torch's
fused kernels drop inside and this module is not used.
"""

from __future__ import annotations

import math

import torch

from bertkit.model.dropout import as_dtype, keep_mask

CHUNK_WEIGHTS = 2**20  # weights per chunk: 4 MB in float32, a size the caches hold


def rows_per_chunk(shape) -> int:
    """How many sequences of a [B, N, T, D] query go through at once."""
    B, N, T, _ = shape
    return max(1, min(B, CHUNK_WEIGHTS // (N * T * T)))


def _weights(q, k, mask):
    """softmax(q k^T + mask), q already scaled: [b, N, T, T]."""
    scores = torch.matmul(q, k.transpose(-1, -2))
    if mask is not None:
        scores.add_(mask)  # padding keys get the dtype's min -> weight 0
    return scores.softmax(dim=-1)


class _Attention(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx, q, k, v, mask, p):
        B, N, T, D = q.shape
        rows = rows_per_chunk(q.shape)
        # once, before the chunks: q scaled by 1 / sqrt(D), v by dropout's 1 / (1 - p); the weights are
        # then only multiplied by 0 or 1. Each is a copy (k too), so that what backward keeps is not a view
        # holding the projections' whole [B, T, 3H] output; the copies keep that output's layout, which
        # the chunks' products take as it is.
        q, k, v = q.mul(1.0 / math.sqrt(D)), k.clone(), v.mul(1.0 / (1.0 - p))
        keep = torch.empty((B, N, T, T), dtype=torch.bool, device=q.device)
        out = torch.empty((B, N, T, D), dtype=q.dtype, device=q.device)
        for b in range(0, B, rows):
            c = slice(b, b + rows)
            kept = _weights(q[c], k[c], None if mask is None else mask[c])  # W, then W * keep
            kept.mul_(as_dtype(keep_mask(kept.shape, p, q.device, out=keep[c]), kept.dtype))
            torch.matmul(kept, v[c], out=out[c])  # [b, N, T, D]
        ctx.save_for_backward(q, k, v, mask, keep)
        ctx.p = p
        return out

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")  # the recomputed weights in the forward's precision
    def backward(ctx, grad):
        q, k, v, mask, keep = ctx.saved_tensors  # q scaled by 1 / sqrt(D), v by 1 / (1 - p)
        B, N, T, D = q.shape
        rows = rows_per_chunk(q.shape)
        dq, dk, dv = (torch.empty((B, N, T, D), dtype=t.dtype, device=t.device) for t in (q, k, v))  # contiguous
        for b in range(0, B, rows):
            c = slice(b, b + rows)
            w = _weights(q[c], k[c], None if mask is None else mask[c])  # recomputed: W
            g = grad[c].to(v.dtype)
            kept = as_dtype(keep[c], w.dtype)
            torch.matmul((w * kept).transpose(-1, -2), g, out=dv[c])  # P^T dC (times 1 - p: below)
            dw = torch.matmul(g, v[c].transpose(-1, -2)).mul_(kept)  # dW
            ds = dw.sub_((dw * w).sum(dim=-1, keepdim=True)).mul_(w)  # dS
            torch.matmul(ds, k[c], out=dq[c])
            torch.matmul(ds.transpose(-1, -2), q[c], out=dk[c])
        return dq.mul_(1.0 / math.sqrt(D)), dk, dv.mul_(1.0 / (1.0 - ctx.p)), None, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, p: float) -> torch.Tensor:
    """softmax(q k^T / sqrt(D) + mask) with dropout p on the weights, times v: [B, N, T, D] (0 < p < 1)."""
    return _Attention.apply(q, k, v, mask, p)

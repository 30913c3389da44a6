"""Fit a distilled static table to the model's sentence vectors: Tokenlearn's idea (MinishLab 2024).

Model2Vec's table is made of single tokens, each through the model alone; a text's vector is then
the mean of its rows, which is not what the model gives the whole text. Tokenlearn (MinishLab's
`tokenlearn`, the method behind the potion models) trains the table so that this mean regresses the
model's own sentence vector over a corpus, the model's outputs being the targets:

    text i: ids t_1..t_n (no [CLS]/[SEP])          s_i = the model's sentence vector [H] (its pooling)
    target    y_i = (s_i - mean) @ components      [D]: the table's own PCA basis (`distill.static.pca_basis`)
    prediction m_i = mean_k table[t_k]             [D]
    loss = mean_i 1 - cos(m_i, y_i)

Every text touches many rows at once, so the table moves as a whole towards the model's geometry, and
rows stay in the space of the rows no text contains (their distilled vectors): that is what a
contrastive run on pairs (`finetune embed --static`) does not keep (docs/distill.md). The cosine, not
the MSE: a static model's vector is normalised, so only the direction is asked for, and the rows'
norms (SIF's weights at the start) stay free to be learnt as the tokens' weights.

Deviations from tokenlearn (which trains the table's unit rows, a weight per token and a linear head
to the targets, PCA'd on their own, with MSE or a contrastive loss, then discards the head): no head,
because the targets are projected on the table's own PCA basis, where a text's mean already
approximates them before training; the table keeps its SIF weights as its start and no re-weighting
follows. Rows that were never distilled ([UNK], [CLS], [SEP], [MASK], [unusedN]) are zero again after
the fit. The loop is the one training loop (`bertkit.tasks.trainer.train`: seeded length-grouped
batches, AdamW, warm-up and linear decay, progress), without an output folder: the fit takes minutes,
the teacher's vectors, the long part, are kept by `--teacher-cache` (chunk by chunk: a rerun resumes them).

Shapes: B texts, T their longest id list, V rows, D the table's width.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertkit.tasks.trainer import train


def fit_loss(means: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """mean over B of 1 - cos(means_i, targets_i); means, targets [B, D]."""
    return (1 - F.cosine_similarity(means.float(), targets.float(), dim=-1)).mean()


@dataclass
class FitOutput:
    loss: torch.Tensor


class TableFit(nn.Module):
    """The table being fitted (a `StaticEmbedding`); the loop calls model(**batch).loss with `labels` [B, D],
    the targets."""

    def __init__(self, static: nn.Module):
        super().__init__()
        self.static = static

    def forward(self, input_ids, attention_mask, token_type_ids=None, labels=None) -> FitOutput:
        return FitOutput(fit_loss(self.static.embed_padded(input_ids, attention_mask), labels))


def fit_table(static: nn.Module, ids: list, targets: np.ndarray, training, pad_id: int = 0, log=print) -> dict:
    """Fit `static` (a StaticEmbedding, in place) so each text's mean row points where its target does.
    ids: each text's ids (no special tokens); targets [N, D] in the table's basis; training: the loop's
    settings (`bertkit.tasks.config.TrainConfig`). Texts with no id are left out. Returns the loss before
    and after over the texts (at most 10,000 of them) and the loop's seconds."""
    keep = [i for i, row in enumerate(ids) if row]
    features = [{"input_ids": ids[i], "labels": targets[i].tolist()} for i in keep]
    before = mean_loss(static, [ids[i] for i in keep], targets[keep])
    zero = static.embedding.weight.detach().norm(dim=1) == 0  # never distilled: zero again after the fit
    static.train()
    result = train(TableFit(static), features, training, pad_id=pad_id, log=log, desc="distill static --fit")
    static.eval()
    with torch.no_grad():
        static.embedding.weight[zero] = 0
    after = mean_loss(static, [ids[i] for i in keep], targets[keep])
    return {"fit_texts": len(keep), "fit_loss_before": round(before, 4), "fit_loss_after": round(after, 4),
            "fit_seconds": round(result.seconds, 1)}


def mean_loss(static: nn.Module, ids: list, targets: np.ndarray, limit: int = 10000, batch: int = 1000) -> float:
    """`fit_loss` over the first `limit` texts (ids: each text's non-empty id list), in batches."""
    n, total = min(limit, len(ids)), 0.0
    with torch.no_grad():
        for b in range(0, n, batch):
            rows = ids[b : b + batch]
            flat = torch.tensor([t for row in rows for t in row], dtype=torch.long)
            offsets = torch.tensor(np.cumsum([0] + [len(r) for r in rows[:-1]]), dtype=torch.long)
            means = static(flat, offsets)
            total += float(fit_loss(means, torch.from_numpy(targets[b : b + len(rows)]))) * len(rows)
    return total / max(n, 1)

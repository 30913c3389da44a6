"""Features in padded batches: `collate` (training and inference) and `run_model` (inference).

A *feature* is a dict holding `input_ids` and optionally `token_type_ids`,
`labels`, `start_positions`, `end_positions`, `teacher_logits` (anything else, such as
`example_index`, is the task's bookkeeping). `collate` pads a list of them to
its longest and stacks them (`loss_terms`: how many terms a batch's loss averages,
the training loop's weight for it); `run_model` runs a model over features without
labels, longest first so batches pad little, and hands back its outputs per
feature. Using a fine-tuned model needs only this module, never the trainer.

Shapes: B batch, T longest feature in the batch; input_ids (B, T) int64.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from tqdm.auto import tqdm

from bertkit.model.config import IGNORE_INDEX


def collate(features: list[dict], pad_id: int = 0) -> dict:
    """Pad a list of features to the batch's longest and stack them into tensors.

    input_ids pad with `pad_id`, token_type_ids with 0, attention_mask is 1
    on real tokens; token-level labels (lists) pad with -100; scalar labels
    become int64 (class ids) or float32 (scores, multi-hot vectors).
    """
    T = max(len(f["input_ids"]) for f in features)
    batch = {}
    ids = torch.full((len(features), T), pad_id, dtype=torch.long)
    types = torch.zeros((len(features), T), dtype=torch.long)
    mask = torch.zeros((len(features), T), dtype=torch.long)
    for i, f in enumerate(features):
        n = len(f["input_ids"])
        ids[i, :n] = torch.tensor(f["input_ids"])
        if "token_type_ids" in f:
            types[i, :n] = torch.tensor(f["token_type_ids"])
        mask[i, :n] = 1
    batch.update(input_ids=ids, token_type_ids=types, attention_mask=mask)
    for key in ("labels", "start_positions", "end_positions"):
        if key not in features[0]:
            continue
        values = [f[key] for f in features]
        first = values[0]
        if isinstance(first, list) and isinstance(first[0], int):  # token labels
            lab = torch.full((len(features), T), IGNORE_INDEX, dtype=torch.long)
            for i, v in enumerate(values):
                lab[i, : len(v)] = torch.tensor(v)
            batch[key] = lab
        elif isinstance(first, float) or (isinstance(first, list) and isinstance(first[0], float)):
            batch[key] = torch.tensor(values, dtype=torch.float32)
        else:
            batch[key] = torch.tensor(values, dtype=torch.long)
    if "teacher_logits" in features[0]:  # layer distillation's soft targets: [C] per feature, or [T, C] per token
        batch["teacher_logits"] = padded_rows([np.asarray(f["teacher_logits"], dtype=np.float32) for f in features], T)
    return batch


def padded_rows(rows: list[np.ndarray], T: int) -> torch.Tensor:
    """Arrays of one shape [C] stacked to [B, C]; arrays [t_i, C] zero-padded to [B, T, C]."""
    if rows[0].ndim == 1:
        return torch.from_numpy(np.stack(rows))
    out = torch.zeros((len(rows), T, rows[0].shape[-1]), dtype=torch.float32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.from_numpy(r)
    return out


def loss_terms(batch: dict) -> float:
    """How many terms a micro-batch's loss averages: its labelled tokens (`collate` pads
    token labels with IGNORE_INDEX), or its examples."""
    labels = batch.get("labels")
    if labels is not None and labels.dim() == 2 and not labels.is_floating_point():
        return float((labels != IGNORE_INDEX).sum())
    return float(batch["input_ids"].shape[0])


@torch.inference_mode()
def run_model(model, features: list[dict], batch_size: int = 64, outputs=("logits",), per_token=False,
              progress=False, desc="predict") -> dict[str, list[np.ndarray]]:
    """Forward all features without labels; {output name: one array per feature, input order}.

    Features are run longest-first so batches pad little. `per_token` cuts
    each (T, ...) output back to its feature's own length.
    """
    was_training = model.training
    model.eval()
    order = sorted(range(len(features)), key=lambda i: -len(features[i]["input_ids"]))
    result = {name: [None] * len(features) for name in outputs}
    batches = [order[k:k + batch_size] for k in range(0, len(order), batch_size)]
    device = next(model.parameters()).device
    # Inside the training loop's bar tqdm would place this one a line below and move the cursor up to it;
    # a log file or pipe has no cursor, so the escape codes land in it as text: there, draw on one line.
    position = None if sys.stderr.isatty() else 0
    for idx in tqdm(batches, desc=desc, disable=not progress, leave=False, position=position):
        batch = collate([{"input_ids": features[i]["input_ids"],
                          **({"token_type_ids": features[i]["token_type_ids"]}
                             if "token_type_ids" in features[i] else {})} for i in idx])
        out = model(**{k: v.to(device) for k, v in batch.items()})
        for name in outputs:
            values = getattr(out, name).float().cpu().numpy()
            for row, i in enumerate(idx):
                v = values[row]
                result[name][i] = v[: len(features[i]["input_ids"])] if per_token else v
    model.train(was_training)
    return result

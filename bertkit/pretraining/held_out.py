"""The held-out slice of pre-training data: whole documents, never trained on.

Evaluation must read text the model has not trained on. With dupe_factor > 1
the same sentences appear in several instances, so a random slice of
instances would leak; whole documents are held out instead, the ones prepare
kept apart before it made any pair (see `held_out_split`). At the start of a run the NSP/SOP label balance of both
parts is logged: a pair objective is only learnt from both labels.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np

from bertkit.errors import BertkitError
from bertkit.pretraining.dataset import PretrainingDataset


class Subset:
    """instances[indices[i]] without copying: the training rest or the held-out slice."""

    def __init__(self, seq, indices):
        self.seq, self.indices = seq, indices

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, i: int):
        return self.seq[int(self.indices[i])]


def held_out_split(data_dir, num_instances: int, n_eval: int, seed: int):
    """(train_indices, eval_indices): the documents prepare kept apart are never trained on.

    prepare chose them before making any pair (`bertkit.pretraining.blocks.held_out_documents`)
    and drew the "random next" segments of training documents only from other
    training documents, so leaving out every instance that touches one of them
    (as A or B) removes no pair of a training document: the training labels keep
    the balance prepare wrote, however small the corpus. (A held-out document's
    random next segment may come from a training document, as in the reference:
    its pairs are only evaluated.) The held-out slice is the first `n_eval`
    instances whose segment A comes from them. Reads the instance shards'
    `docs.npy` ([n, 2] document of A and B, -1: none or several; see prepare).

    Sequences packed across documents (objective "none") record no document. If
    the corpus went into them once (dupe factor 1), every token is in exactly
    one instance, so a seeded sample of instances is held out instead; with
    more passes their text repeats elsewhere and nothing is held out.
    """
    if n_eval == 0:
        return np.arange(num_instances), np.arange(0)
    manifest = json.loads((Path(data_dir) / "manifest.json").read_text())
    docs = _shard_arrays(data_dir, "docs")
    assert len(docs) == num_instances, "docs.npy does not match the dataset"
    if (docs[:, 0] < 0).all():
        if manifest["dupe_factor"] != 1 or num_instances < 2:
            return np.arange(num_instances), np.arange(0)
        in_eval = np.zeros(num_instances, dtype=bool)
        in_eval[np.random.default_rng([seed, 17]).permutation(num_instances)[:min(n_eval, num_instances - 1)]] = True
        return np.flatnonzero(~in_eval), np.flatnonzero(in_eval)
    held = manifest.get("held_out_documents", [])  # none in data prepared before prepare chose them
    touches = np.isin(docs, held).any(axis=1)
    return np.flatnonzero(~touches), np.flatnonzero(np.isin(docs[:, 0], held))[:n_eval]


def open_prepared(cfg, seed: int):
    """The prepared data: (dataset, train Subset, eval Subset, collate, tokenizer). `cfg`: the run's
    `bertkit.pretraining.run_config.RunConfig` (its data folder and held-out settings)."""
    if not Path(cfg.data).is_dir():
        raise BertkitError(f"no prepared data at {cfg.data}: make it with `bertkit pretrain prepare CORPUS -o {cfg.data}`")
    ds = PretrainingDataset(cfg.data, seed=seed)
    n_eval = cfg.eval_sequences if cfg.eval_every else 0
    train_idx, eval_idx = held_out_split(cfg.data, len(ds), n_eval, seed)
    return ds, Subset(ds, train_idx), Subset(ds, eval_idx), ds.collator(seed=seed, replacement=cfg.replacement()), ds.tokenizer()


def _shard_arrays(data_dir, name: str) -> np.ndarray:
    manifest = json.loads((Path(data_dir) / "manifest.json").read_text())
    return np.concatenate([np.load(Path(data_dir) / e["path"] / f"{name}.npy") for e in manifest["shards"]])


def label_balance(data_dir, subset: Subset) -> str:
    """"n instances, x% with label 1 (what 1 means)" for a part of pair-objective data ("" without NSP/SOP labels)."""
    labels = _shard_arrays(data_dir, "labels")[np.asarray(subset.indices, dtype=np.int64)]
    if not len(labels) or (labels < 0).all():
        return ""
    objective = json.loads((Path(data_dir) / "manifest.json").read_text())["config"]["objective"]
    meaning = {"nsp": "random next", "sop": "swapped"}.get(objective, "random next / swapped")  # SOP said both
    return f"{len(labels)} instances, {(labels == 1).mean():.1%} with label 1 ({meaning})"


def _why_none(data_dir) -> str:
    """Why `held_out_split` holds nothing out of `data_dir`, and the fix: packed text read more than once
    (any corpus size), or too few documents."""
    dupe = json.loads((Path(data_dir) / "manifest.json").read_text())["dupe_factor"]
    docs = _shard_arrays(data_dir, "docs")
    if dupe != 1 and len(docs) > 1 and (docs[:, 0] < 0).all():
        return (f"{data_dir} packs sentences across documents and was prepared with --dupe-factor {dupe}: each text "
                "is in several instances, so none can be held out unseen; prepare it with --dupe-factor 1 (the "
                "default with --dynamic-masking), or --eval-every 0")
    return (f"{data_dir} is too small for a held-out set (evaluation holds out whole documents that prepare kept "
            "apart, and needs 3 or more; packed sequences only with --dupe-factor 1, where no text repeats); "
            "prepare more documents, or --eval-every 0")


def log_label_balance(train_set, eval_set, cfg, log=print) -> None:
    """Say what training and evaluation hold; warn when there is nothing to hold out."""
    if cfg.eval_every and cfg.eval_sequences and not len(eval_set):
        warnings.warn(f"no held-out evaluation: {_why_none(cfg.data)}", stacklevel=2)
    for name, part in (("training", train_set), ("held out", eval_set)):
        balance = label_balance(cfg.data, part)
        if balance:
            log(f"{name}: {balance}")

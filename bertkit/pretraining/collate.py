"""The batch collator: instances -> padded tensors, masked now if masking is dynamic.

Input: a list of instances as `PretrainingDataset` yields them (numpy arrays
`input_ids` [L], `token_type_ids` [L], optionally `next_sentence_label`, and for
static masking `masked_positions` / `masked_ids`). Output, padded only to the
longest instance of the batch (B = batch size, T = its longest length):

    input_ids            [B, T] long   masked ids, [PAD] after the end
    token_type_ids       [B, T] long   0 for [CLS] A [SEP], 1 for B [SEP], 0 padding
    attention_mask       [B, T] long   1 on real tokens
    labels               [B, T] long   the original id where a token is to be predicted, -100 elsewhere
    next_sentence_label  [B]    long   NSP: 1 = B is random; SOP: 1 = swapped (absent without a pair objective)
    masked_positions     [B, P] long   (return_masked_positions) positions to predict, 0-padded
    masked_weights       [B, P] float  1.0 on real entries (google-research/bert `masked_lm_weights`)

Dynamic masking (RoBERTa, Liu et al. 2019, section 4.1) draws a new mask every
time a batch is made, from `generator` (a torch.Generator; the training loop
seeds one per batch position, so a resumed run sees the same masks). Token
masking is vectorised: every row gets a uniformly random subset of exactly
num_to_predict candidates (random scores, ranks below the budget), then one
uniform draw splits 80/10/10 (`replace_chosen`; ELECTRA's rule: 85/0/15); that
is the distribution of `masking.mask_sequence` (a test checks them against each other). Whole-word and n-gram masking run
`mask_sequence` per row with a `random.Random` seeded from the generator.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch

from bertkit.model.config import IGNORE_INDEX
from bertkit.pretraining.masking import MaskingConfig, MaskVocab, mask_sequence


@dataclass
class PretrainingCollator:
    """Callable `collate(instances, generator=None) -> dict of tensors` (see the module docstring).

    masking: None uses the masks stored in the instances (static masking);
    a MaskingConfig masks at batch time (dynamic). replacement: with stored masks only,
    (mask_replace_prob, random_replace_prob) to show the stored positions by, drawn anew for each batch
    (ELECTRA's 85/0/15 on data prepare masked 80/10/10); None: as stored. seed: used only when no
    generator is passed: a batch of streamed instances is then seeded by its first
    position, anything else draws from one generator in sequence (in a DataLoader
    worker, one seeded by the seed torch gives that worker: other masks per worker and epoch).
    """

    vocab: MaskVocab
    pad_id: int
    masking: MaskingConfig | None = None
    return_masked_positions: bool = False
    seed: int = 0
    replacement: tuple | None = None

    def __post_init__(self):
        self._special = torch.from_numpy(self.vocab.special_mask())
        self._replace = torch.from_numpy(self.vocab.replace_ids)
        self._own_generator = torch.Generator().manual_seed(self.seed)
        self._worker_seed = None  # the DataLoader worker's seed _own_generator was last seeded from

    def __call__(self, instances: list, generator: torch.Generator | None = None) -> dict:
        # a plain TypeError / ValueError: a program's mistake, not a user's input (no import of bertkit.errors here)
        if not isinstance(instances, (list, tuple)):
            raise TypeError(f"the collator takes a non-empty list of instances (as PretrainingDataset yields them), "
                            f"got {type(instances).__name__}")
        if not instances:
            raise ValueError("the collator takes a non-empty list of instances, got an empty list")
        B = len(instances)
        lengths = torch.tensor([len(x["input_ids"]) for x in instances])
        T = int(lengths.max())
        ids = np.full((B, T), self.pad_id, dtype=np.int64)
        types = np.zeros((B, T), dtype=np.int64)
        for i, x in enumerate(instances):
            n = len(x["input_ids"])
            ids[i, :n] = x["input_ids"]
            types[i, :n] = x["token_type_ids"]
        input_ids = torch.from_numpy(ids)
        attention_mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
        if self.masking is None:
            labels = self._stored_labels(instances, B, T)
            if self.replacement is not None:  # the stored positions, shown by this rule instead of the stored one
                chosen = labels != IGNORE_INDEX
                g = generator if generator is not None else self._generator_for(instances)
                input_ids = replace_chosen(torch.where(chosen, labels, input_ids), chosen, self.replacement,
                                           self.vocab.mask_id, g, self._replace)
        else:
            g = generator if generator is not None else self._generator_for(instances)
            if self.masking.masking == "token":
                input_ids, labels = mask_tokens(input_ids, attention_mask.bool(), self.masking, self.vocab, g,
                                                self._special, self._replace)
            else:
                input_ids, labels = self._mask_rows(input_ids, lengths, g)
        batch = {
            "input_ids": input_ids,
            "token_type_ids": torch.from_numpy(types),
            "attention_mask": attention_mask,
            "labels": labels,
        }
        if "next_sentence_label" in instances[0]:
            batch["next_sentence_label"] = torch.tensor([int(x["next_sentence_label"]) for x in instances])
        if self.return_masked_positions:
            batch.update(masked_positions_from_labels(labels))
        return batch

    def _generator_for(self, instances) -> torch.Generator:
        # Instances from the dataset's stream carry their position: seed by it, so
        # the batch at a position always gets the same masks (exact resume).
        if "position" in instances[0]:
            return torch.Generator().manual_seed(self.seed * 1_000_003 + int(instances[0]["position"]))
        # A DataLoader worker collates with a copy of this collator made when it started: every worker drew
        # the masks of the others, and the same again each epoch (workers start anew from an unused copy).
        # torch gives each worker of each epoch its own seed, drawn from the parent's seeded generator.
        worker = torch.utils.data.get_worker_info()
        if worker is not None and worker.seed != self._worker_seed:
            self._worker_seed = worker.seed
            self._own_generator = torch.Generator().manual_seed((self.seed * 1_000_003 + worker.seed) % 2**63)
        return self._own_generator

    def _stored_labels(self, instances, B, T) -> torch.Tensor:
        labels = np.full((B, T), IGNORE_INDEX, dtype=np.int64)
        for i, x in enumerate(instances):
            labels[i, x["masked_positions"]] = x["masked_ids"]
        return torch.from_numpy(labels)

    def _mask_rows(self, input_ids: torch.Tensor, lengths: torch.Tensor, g: torch.Generator) -> tuple:
        rng = random.Random(int(torch.randint(0, 2**62, (1,), generator=g)))
        out = input_ids.clone()
        labels = torch.full_like(input_ids, IGNORE_INDEX)
        for i, n in enumerate(lengths.tolist()):
            m = mask_sequence(input_ids[i, :n].numpy(), self.masking, self.vocab, rng)
            out[i, :n] = torch.from_numpy(m.input_ids)
            pos = torch.from_numpy(m.positions)
            labels[i, pos] = torch.from_numpy(m.labels)
        return out, labels


def mask_tokens(input_ids: torch.Tensor, real: torch.Tensor, cfg: MaskingConfig, vocab: MaskVocab,
                g: torch.Generator, special: torch.Tensor | None = None, replace: torch.Tensor | None = None) -> tuple:
    """Vectorised token masking of a padded batch input_ids [B, T] (real [B, T]: not padding).

    Returns (masked ids, labels), labels -100 where nothing is predicted. `special`
    ([V] bool) and `replace` ([R] ids) are the vocab's lookup tables as tensors
    (built from `vocab` when not given). Also used by prepare for static masking.
    """
    if special is None:
        special, replace = torch.from_numpy(vocab.special_mask()), torch.from_numpy(vocab.replace_ids)
    B, T = input_ids.shape
    # index_select, not special[input_ids]: torch's advanced indexing of a bool table takes a slow general
    # path (docs/benchmarks.md, "Numbers that left the docstrings")
    cand = real & ~special.index_select(0, input_ids.flatten()).view(B, T)
    lengths = real.sum(1)
    # torch.round halves to even, like Python's round in the per-sequence path
    budget = torch.round(lengths.double() * cfg.masked_lm_prob).long().clamp(min=1, max=cfg.max_predictions_per_seq)
    scores = torch.rand(B, T, generator=g).masked_fill(~cand, 2.0)  # non-candidates sort last
    # the `budget` lowest random scores of a row: a uniformly random subset of its candidates
    k = min(int(budget.max()), T)
    lowest = scores.topk(k, dim=1, largest=False, sorted=True).indices
    take = torch.arange(k)[None, :] < budget[:, None]
    chosen = torch.zeros(B, T, dtype=torch.bool).scatter_(1, lowest, take) & cand
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    rule = (cfg.mask_replace_prob, cfg.random_replace_prob)
    return replace_chosen(input_ids, chosen, rule, vocab.mask_id, g, replace), labels


def replace_chosen(input_ids: torch.Tensor, chosen: torch.Tensor, rule: tuple, mask_id: int, g: torch.Generator,
                   replace: torch.Tensor) -> torch.Tensor:
    """What the model reads at the chosen positions [B, T]: rule = (mask_replace_prob, random_replace_prob), the
    shares shown as [MASK] and as a random id of `replace` [R]; the rest keep their token (BERT 80/10/10, ELECTRA
    85/0/15: bertkit.pretraining.run_config.REPLACEMENT)."""
    B, T = input_ids.shape
    to_mask_p, random_p = rule
    u = torch.rand(B, T, generator=g)  # one draw splits [MASK] / random / kept
    to_mask = chosen & (u < to_mask_p)
    to_random = chosen & (u >= to_mask_p) & (u < to_mask_p + random_p)
    out = input_ids.masked_fill(to_mask, mask_id)
    rand_ids = replace.index_select(0, torch.randint(len(replace), (B * T,), generator=g)).view(B, T)
    return torch.where(to_random, rand_ids, out)


def masked_positions_from_labels(labels: torch.Tensor) -> dict:
    """masked_positions [B, P] (0-padded) and masked_weights [B, P] from labels [B, T]."""
    chosen = labels != IGNORE_INDEX
    counts = chosen.sum(1)
    P = max(int(counts.max()), 1)
    B, T = labels.shape
    # stable sort puts the chosen positions first, in position order
    key = (~chosen).long() * T + torch.arange(T)
    positions = key.argsort(dim=1)[:, :P]
    weights = (torch.arange(P)[None, :] < counts[:, None]).float()
    return {"masked_positions": positions * weights.long(), "masked_weights": weights}

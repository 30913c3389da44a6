"""Instance blocks: the unit of stage 3 of `bertkit pretrain prepare` (`bertkit.pretraining.prepare`).

For each of `dupe_factor` passes the documents are put in a fresh order, seeded by
(seed, pass), and cut every ~BLOCK_TOKENS tokens into blocks (`plan_blocks`). A
block becomes one instance shard in a worker process (`write_block`): its
documents' pairs or packed sequences (`bertkit.pretraining.instances`), masked now
unless masking is dynamic (`bertkit.pretraining.masking`, or the collator's
vectorised token masking for a whole block at once), written atomically with a
meta.json last. Every block draws from its own `random.Random`, seeded by (seed,
pass, block), so the output is the same whatever the number of workers.

The documents held out for evaluation are a seeded choice made before any pair
(`held_out_documents`): a training document's random next segment never comes
from one of them. `cfg` is the run's `PrepareConfig`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np

from bertkit.pretraining import instances as inst_mod
from bertkit.pretraining.masking import MaskingConfig, MaskVocab, mask_sequence
from bertkit.pretraining.shards import load_corpus, token_dtype, write_shard

BLOCK_TOKENS = 1_000_000  # corpus tokens per instance block (one unit of parallel work)

_WORKER: dict = {}  # what a worker process holds for its blocks: the corpus arrays, the vocabulary


def plan_blocks(doc_offsets: np.ndarray, sent_offsets: np.ndarray, cfg) -> list:
    """(pass, block, documents) units: each pass a fresh seeded document order, cut every ~BLOCK_TOKENS."""
    starts = sent_offsets[doc_offsets[:-1]]
    ends = sent_offsets[doc_offsets[1:]]
    doc_tokens = np.asarray(ends - starts)
    units = []
    for p in range(cfg.passes):
        order = np.random.default_rng([cfg.seed, p]).permutation(len(doc_tokens))
        cum = np.cumsum(doc_tokens[order])
        cut_at = np.searchsorted(cum, np.arange(BLOCK_TOKENS, int(cum[-1]) + 1, BLOCK_TOKENS), side="left") + 1
        bounds = [0, *sorted(set(int(c) for c in cut_at if 0 < c < len(order))), len(order)]
        for b in range(len(bounds) - 1):
            units.append((p, b, order[bounds[b]:bounds[b + 1]]))
    return units


def held_out_documents(n_docs: int, cfg) -> np.ndarray:
    """The documents kept apart for evaluation (sorted ids): a seeded choice, made before any pair.

    At least two documents stay for training, so that they can pair with each other.
    """
    k = min(n_docs - 2, max(1, round(n_docs * cfg.held_out))) if cfg.held_out > 0 and n_docs >= 3 else 0
    return np.sort(np.random.default_rng([cfg.seed, 29]).permutation(n_docs)[:k])


def init_block_worker(corpus_dir: str, vocab: MaskVocab, cls_id: int, sep_id: int, pad_id: int) -> None:
    tokens, sents, docs = load_corpus(Path(corpus_dir))
    # word_start is derived from `vocab` on first use; a run in this same process
    # (workers=1) may have left the previous vocabulary's there
    _WORKER.update(tokens=tokens, sents=np.asarray(sents), docs=np.asarray(docs), vocab=vocab,
                   cls=cls_id, sep=sep_id, pad=pad_id, word_start=None)


def block_instances(p: int, b: int, doc_ids, cfg, tokens, sents, docs, word_start, rng) -> list:
    """The Instance list of one block (documents doc_ids of pass p), and how many documents gave none."""
    if cfg.objective in ("nsp", "sop"):
        # a training document's random next segment comes from another training document (a held-out
        # one's from any document: its pairs are only evaluated, and keep both labels)
        is_held = np.zeros(len(docs) - 1, dtype=bool)
        is_held[held_out_documents(len(docs) - 1, cfg)] = True
        training_docs = np.flatnonzero(~is_held) if is_held.any() else None
        out, unusable = [], 0
        for d in doc_ids:
            made = inst_mod.pair_instances(int(d), sents, docs, tokens, cfg.objective, cfg.max_seq_length,
                                           cfg.short_seq_prob, rng, word_start, None if is_held[d] else training_docs)
            unusable += not made
            out.extend(made)
        return out, unusable
    return inst_mod.packed_instances(doc_ids, sents, docs, cfg.max_seq_length, cfg.short_seq_prob, rng,
                                     cross_documents=cfg.objective == "none"), 0


def _block_seed(seed: int, p: int, b: int) -> str:
    # A str seed is hashed with SHA-512 by random.seed: stable across runs and platforms.
    return f"bertkit-pretraining:{seed}:{p}:{b}"


def write_block(job) -> dict:
    """Make, mask (when static) and write one block's instance shard; its meta.json."""
    p, b, doc_ids, cfg, folder, fingerprint = job
    w = _WORKER
    tokens, vocab = w["tokens"], w["vocab"]
    word_start = w.get("word_start")
    if word_start is None:
        word_start = w["word_start"] = vocab.word_start_mask()
    rng = random.Random(_block_seed(cfg.seed, p, b))
    insts, unusable = block_instances(p, b, doc_ids, cfg, tokens, w["sents"], w["docs"], word_start, rng)
    n, T = len(insts), cfg.max_seq_length
    ids = np.zeros((n, T), dtype=token_dtype(vocab.size))
    lengths = np.zeros(n, dtype=np.int16)
    type_a = np.zeros(n, dtype=np.int16)
    labels = np.full(n, -1, dtype=np.int8)
    spans = np.full((n, 4), -1, dtype=np.int64)
    sources = np.full((n, 4), -1, dtype=np.int64)
    docs = np.full((n, 2), -1, dtype=np.int32)
    static = not cfg.dynamic_masking
    mcfg = cfg.masking_config()
    for k, inst in enumerate(insts):
        seq, types = inst_mod.render(inst, tokens, w["cls"], w["sep"])
        assert len(seq) <= T, (len(seq), T)
        ids[k, : len(seq)] = seq
        lengths[k] = len(seq)
        type_a[k] = int((types == 0).sum())
        labels[k] = inst.label
        if inst.label >= 0 or cfg.objective == "single":
            for j, (s, e) in enumerate(inst.parts[:2]):
                spans[k, 2 * j: 2 * j + 2] = (s, e)
                docs[k, j] = inst.docs[j]
            for j, (s, e) in enumerate(inst.sources[:2]):
                sources[k, 2 * j: 2 * j + 2] = (s, e)
    arrays = {"input_ids": ids, "lengths": lengths, "type_a": type_a, "labels": labels, "spans": spans,
              "sources": sources, "docs": docs}
    masked = 0
    if static:
        ids, mpos, mids = _static_masks(ids, lengths, mcfg, vocab, rng)
        arrays.update(input_ids=ids, masked_positions=mpos, masked_ids=mids)
        masked = int((mpos >= 0).sum())
    meta = {"fingerprint": fingerprint, "pass": p, "block": b, "instances": n,
            "tokens": int(lengths.sum()), "masked": masked, "label_ones": int((labels == 1).sum()),
            "unusable_documents": unusable if p == 0 else 0,
            # tokens truncate_pair cut off the pairs' sentences (an unset part, -1 to -1, gives 0): the summary says it
            "truncated": int(np.diff(sources.reshape(n, 2, 2), axis=2).clip(0).sum()
                             - np.diff(spans.reshape(n, 2, 2), axis=2).clip(0).sum())}
    write_shard(Path(folder), arrays, {"meta.json": json.dumps(meta)})  # a refused write names its file
    return meta


def _static_masks(ids: np.ndarray, lengths: np.ndarray, mcfg: MaskingConfig, vocab: MaskVocab, rng) -> tuple:
    """Mask a block's instances ids [n, T] now: (masked ids, positions [n, P] -1 padded, original ids [n, P]).

    Token masking runs the collator's vectorised `mask_tokens` on the whole block
    (one algorithm for static and dynamic masking); word and n-gram masking run
    `mask_sequence` per instance.
    """
    n, T = ids.shape
    P = mcfg.max_predictions_per_seq
    mpos = np.full((n, P), -1, dtype=np.int16)
    mids = np.zeros((n, P), dtype=np.int32)
    out = ids.copy()
    if mcfg.masking == "token":
        import torch

        from bertkit.pretraining.collate import mask_tokens, masked_positions_from_labels

        g = torch.Generator().manual_seed(rng.getrandbits(63))
        real = torch.arange(T)[None, :] < torch.from_numpy(lengths.astype(np.int64))[:, None]
        # one thread: the workers already use every core, and intra-op threads would fight them
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            masked, labels = mask_tokens(torch.from_numpy(ids.astype(np.int64)), real, mcfg, vocab, g)
        finally:
            torch.set_num_threads(threads)
        out[:] = masked.numpy()
        # each row's chosen positions, ascending: the collator's own reading of its labels, [n, P'] with P' <= P
        chosen = masked_positions_from_labels(labels)
        keep, cols = chosen["masked_weights"].numpy() > 0, chosen["masked_positions"].numpy()
        mpos[:, : cols.shape[1]] = np.where(keep, cols, -1)
        mids[:, : cols.shape[1]] = np.where(keep, np.take_along_axis(ids, cols, 1), 0)
        return out, mpos, mids
    for k in range(n):
        m = mask_sequence(ids[k, : lengths[k]], mcfg, vocab, rng)
        out[k, : lengths[k]] = m.input_ids
        mpos[k, : len(m.positions)] = m.positions
        mids[k, : len(m.labels)] = m.labels
    return out, mpos, mids

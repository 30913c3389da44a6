"""The prepared data as a dataset: instances streamed from the instance shards.

`PretrainingDataset(dir)` reads a folder made by `bertkit pretrain prepare`
(see `prepare` for the layout) through memory maps, so the corpus is never held
in memory. It is both

- a sequence: `len(ds)`, `ds[i]` -> the i-th instance on disk (random access);
- a stream: iterating yields instances in a seeded random order, a fresh
  permutation every epoch (`order(epoch)`, numpy PCG64 seeded by (seed,
  epoch)); global position p is instance order(p // N)[p % N], so `seek(p)`
  jumps anywhere at once, which an exact resume needs. Under a DataLoader with
  several workers, worker w of W takes the positions p = w (mod W). With
  `epochs=N`, one iteration is N epochs and the next iteration the N after
  them (a for-epoch loop); DataLoader workers that are not persistent (torch's
  default) start each epoch from a fresh copy of the main process's dataset,
  which they never move on: the loop calls `set_epoch(epoch)` before each
  epoch, as for torch's DistributedSampler (or gives them
  `persistent_workers=True`), else every epoch is epoch 1 again.

An instance is a dict of numpy arrays: `input_ids` [L] int64, `token_type_ids`
[L] int64, `next_sentence_label` (pair objectives), `masked_positions` [M] /
`masked_ids` [M] (static masking), `index` (on disk) and `position` (in the
stream, when iterated). `collator()` returns the matching `PretrainingCollator`.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import torch

from bertkit.errors import BertkitError
from bertkit.pretraining.collate import PretrainingCollator
from bertkit.pretraining.masking import MaskVocab, MaskingConfig, default_max_predictions
from bertkit.text.tokenizer import Tokenizer

_ARRAYS = ("input_ids", "lengths", "type_a", "labels", "spans", "sources", "docs")


class PretrainingDataset(torch.utils.data.IterableDataset):
    def __init__(self, directory, seed: int = 0, shuffle: bool = True, position: int = 0, epochs: int | None = 1):
        self.directory = Path(directory)
        manifest = self.directory / "manifest.json"
        if not manifest.is_file():
            hint = ("it looks unfinished: run `bertkit pretrain prepare` again with the same arguments to complete it"
                    if (self.directory / "tokens").is_dir() else "make it with `bertkit pretrain prepare CORPUS -o DIR`")
            raise BertkitError(f"{self.directory} is not a prepared pre-training folder (no manifest.json); {hint}")
        self.manifest = _read_manifest(manifest)
        self.config = self.manifest["config"]
        if not _is_count(seed):
            raise BertkitError(f"seed must be a non-negative int, got {seed!r}")
        if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, (int, float, np.number))
                                   or not epochs > 0):
            raise BertkitError(f"epochs must be a number > 0 (passes over the data) or None (endless), got {epochs!r}")
        self.seed, self.shuffle, self.epochs = seed, shuffle, epochs
        names = _ARRAYS + (("masked_positions", "masked_ids") if self.static_masking else ())
        self._shards = [_open_shard(self.directory / entry["path"], names) for entry in self.manifest["shards"]]
        self._starts = np.cumsum([0] + [len(s["lengths"]) for s in self._shards])
        if self._starts[-1] == 0:
            raise BertkitError(f"{manifest} lists no instances: re-run `bertkit pretrain prepare`")
        self._order_cache = (None, None)
        self.position = 0
        self.seek(position)

    # --- what the data is ---------------------------------------------------------------

    @property
    def objective(self) -> str:
        return self.config["objective"]

    @property
    def static_masking(self) -> bool:
        return not self.config["dynamic_masking"]

    @property
    def max_seq_length(self) -> int:
        return self.config["max_seq_length"]

    @property
    def vocab_size(self) -> int:
        return self.manifest["vocab_size"]

    def masking_note(self) -> str | None:
        """One line when the data's cap on predictions cuts the masked share of its full sequences (data prepared
        at 512 tokens before the cap's default followed the length kept 20: 3.9% masked), else None."""
        c = self.config
        cap, prob, T = c["max_predictions_per_seq"], c["masked_lm_prob"], self.max_seq_length
        wanted = int(round(T * prob))  # masking.num_to_predict's budget for a full sequence
        if cap >= wanted:
            return None
        return (f"note: this data masks at most {cap} tokens per sequence (its --max-predictions-per-seq), "
                f"{cap / T:.1%} of a full {T}-token sequence, not {prob:.0%}; prepare it again for "
                f"max(20, round({T} x {prob})) = {default_max_predictions(T, prob)}, the default now")

    @property
    def fingerprint(self) -> str:
        """What was prepared (settings, counts, shards), not how or from where (time, workers, the paths as
        typed): a checkpoint keeps it, so a run resumed on data prepared again otherwise is refused."""
        what = {k: v for k, v in self.manifest.items() if k not in ("seconds", "inputs")}
        what["config"] = {k: v for k, v in self.config.items() if k != "workers"}
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()

    def tokenizer(self):
        """The tokenizer the data was prepared with (saved in the folder)."""
        return Tokenizer.from_pretrained(self.directory)

    def collator(self, return_masked_positions: bool = False, seed: int | None = None, replacement: tuple | None = None):
        """The collator for this data: stored masks (static) or the prepared masking settings (dynamic).

        replacement: (mask_replace_prob, random_replace_prob), how a masked token is shown (None: BERT's 80/10/10,
        the rule prepare stores static masks by); static masks shown by another rule are drawn anew per batch."""
        if seed is not None and not _is_count(seed):
            raise BertkitError(f"seed must be a non-negative int (or None: the dataset's), got {seed!r}")
        tok = self.tokenizer()
        stored = (MaskingConfig.mask_replace_prob, MaskingConfig.random_replace_prob)
        rule = stored if replacement is None else tuple(replacement)
        masking, redraw = None, None
        if not self.static_masking:
            c = self.config
            masking = MaskingConfig(c["masking"], c["masked_lm_prob"], c["max_predictions_per_seq"], c["max_ngram"],
                                    mask_replace_prob=rule[0], random_replace_prob=rule[1]).validate()
        elif rule != stored:
            redraw = rule
        return PretrainingCollator(MaskVocab.from_tokens(tok.ids_to_tokens), tok.pad_token_id, masking,
                                   return_masked_positions, self.seed if seed is None else seed, redraw)

    # --- random access --------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _locate(self, index: int) -> tuple[dict, int, int]:
        """(the shard holding instance `index`, its row there, the index counted from 0)."""
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"instance {index} out of range (the data has {n})")
        index %= n
        k = int(np.searchsorted(self._starts, index, side="right")) - 1
        return self._shards[k], index - int(self._starts[k]), index

    def __getitem__(self, index: int) -> dict:
        s, j, index = self._locate(index)
        length, type_a = int(s["lengths"][j]), int(s["type_a"][j])
        ids = np.asarray(s["input_ids"][j, :length], dtype=np.int64)
        types = np.zeros(length, dtype=np.int64)
        types[type_a:] = 1
        out = {"input_ids": ids, "token_type_ids": types, "index": index}
        if self.objective in ("nsp", "sop"):
            out["next_sentence_label"] = int(s["labels"][j])
        if self.static_masking:
            pos = np.asarray(s["masked_positions"][j], dtype=np.int64)
            keep = pos >= 0
            out["masked_positions"] = pos[keep]
            out["masked_ids"] = np.asarray(s["masked_ids"][j], dtype=np.int64)[keep]
        return out

    def source(self, index: int) -> dict:
        """Where instance `index` came from: corpus token ranges of A and B after truncation (`spans`)
        and before (`sources`), and their documents (-1: none)."""
        s, j, _ = self._locate(index)
        return {key: [int(x) for x in s[key][j]] for key in ("spans", "sources", "docs")}

    def corpus_tokens(self):
        """The consolidated corpus ids (memory-mapped), for showing an instance's original text."""
        return np.load(self.directory / "corpus" / "tokens.npy", mmap_mode="r")

    # --- the seeded stream ------------------------------------------------------------------

    def order(self, epoch: int) -> np.ndarray:
        """The permutation of instance indices used in `epoch` (identity without shuffle)."""
        if self._order_cache[0] != epoch:
            n = len(self)
            perm = np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle else np.arange(n)
            self._order_cache = (epoch, perm)
        return self._order_cache[1]

    def seek(self, position: int) -> None:
        """Continue the stream at global position `position` (epoch = position // len)."""
        if not _is_count(position):
            raise BertkitError(f"stream position must be an int >= 0, got {position!r}")
        self.position = int(position)

    def set_epoch(self, epoch: int) -> None:
        """The next iteration runs pass `epoch` (from 0; a pass is `epochs` epochs), as torch's
        DistributedSampler.set_epoch: a loop over a DataLoader whose workers are not persistent calls it before
        each epoch, since those workers start from a fresh copy of this dataset, which iterating in them never
        moves on (each epoch repeated epoch 1's order and masks). In-process and persistent workers move on by
        themselves, to the epoch this says."""
        if not _is_count(epoch):
            raise BertkitError(f"epoch must be an int >= 0, got {epoch!r}")
        if self.epochs is None:
            raise BertkitError("an endless stream (epochs=None) has no epochs to set: seek a position instead")
        self.seek(math.ceil(epoch * self.epochs * len(self)))

    def index_at(self, position: int) -> int:
        n = len(self)
        return int(self.order(position // n)[position % n])

    def __iter__(self):
        """The stream from `position` to the end of its pass (`epochs` epochs; None: endless). A finite pass moves
        `position` on to the next one: iterated again (a for-epoch loop over one DataLoader), the dataset runs the
        next epochs, as one stream with more epochs would; it repeated the first pass's order and masks."""
        n, start = len(self), self.position
        stop = None
        if self.epochs is not None:
            span = self.epochs * n  # positions per pass; a fraction of an epoch ends where it falls
            stop = (start // span + 1) * span
            self.position = math.ceil(stop)
        info = torch.utils.data.get_worker_info()
        step, first = (1, 0) if info is None else (info.num_workers, info.id)
        return self._stream(start + first, stop, step)

    def _stream(self, p: int, stop, step: int):
        while stop is None or p < stop:
            item = self[self.index_at(p)]
            item["position"] = p
            yield item
            p += step


def _is_count(value) -> bool:
    """An int >= 0 (numpy's integers too), not a bool: a seed, a stream position."""
    return not isinstance(value, bool) and isinstance(value, (int, np.integer)) and value >= 0


def _read_manifest(path: Path) -> dict:
    """manifest.json, refused by name when it is not what prepare writes (cut short, edited)."""
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BertkitError(f"{path} is corrupt ({err}): re-run `bertkit pretrain prepare`") from None
    if (not isinstance(manifest, dict) or not isinstance(manifest.get("config"), dict)
            or not isinstance(manifest.get("shards"), list)
            or not all(isinstance(e, dict) and isinstance(e.get("path"), str) for e in manifest["shards"])):
        raise BertkitError(f"{path} lacks the config and shards prepare writes: re-run `bertkit pretrain prepare`")
    return manifest


def _open_shard(folder: Path, names: tuple) -> dict:
    """A shard's arrays, memory-mapped (never pickled objects), one row per instance in each."""
    arrays = {}
    for name in names:
        path = folder / f"{name}.npy"
        try:
            arrays[name] = np.load(path, mmap_mode="r", allow_pickle=False)
        except FileNotFoundError:
            raise BertkitError(f"prepared data is incomplete: {path} is missing; re-run prepare") from None
        except (ValueError, OSError):  # cut short, not an .npy, or Python objects (which we never load)
            raise BertkitError(f"{path} is truncated or corrupt (not a numeric .npy array); re-run prepare") from None
    rows = {name: len(a) for name, a in arrays.items()}
    if len(set(rows.values())) > 1:
        raise BertkitError(f"{folder}: the arrays disagree on the number of instances ({rows}); re-run prepare")
    return arrays

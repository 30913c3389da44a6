"""`bertkit pretrain prepare`: raw text in, masked training instances out.

The job behind the command, in three resumable stages (each writes folders
atomically and skips the ones a previous run finished with the same settings):

1. tokenise: every input file -> a token shard (`shards.tokenize_file`), in
   worker processes (both cores);
2. consolidate the shards into one memory-mapped corpus (`shards.consolidate`);
3. instances: for each of `dupe_factor` passes, the documents in a fresh seeded
   order are cut into blocks of about a million tokens; each block becomes an
   instance shard (pairs or packed sequences from `instances`, masked now by
   `masking` unless masking is dynamic), again in worker processes
   (`bertkit.pretraining.blocks`). Every block has its own `random.Random` seeded
   by (seed, pass, block), so the output is the same whatever the number of workers.

Output folder DIR:

    manifest.json             settings, counts, skips, the instance shards (written last: its
                              presence means the folder is complete)
    vocab.txt, tokenizer_config.json   the tokenizer the ids belong to
    tokens/NNNNN/             token shards, one per input file (kept for resuming)
    corpus/                   the consolidated corpus (tokens + sentence/document offsets)
    instances/NNNNN/          instance shards, read by `dataset.PretrainingDataset`:
        input_ids.npy         [n, T] uint16/int32  ids, masked if static, 0-padded to T = max_seq_length
        lengths.npy           [n]    int16  real length L (<= T)
        type_a.npy            [n]    int16  tokens of type 0 ([CLS] A [SEP]); the rest are type 1
        labels.npy            [n]    int8   NSP/SOP label, -1 without a pair objective
        spans.npy             [n, 4] int64  corpus token ranges of A and B (-1: none), for showing the text
        sources.npy           [n, 4] int64  the same before truncation (whole sentences; pairs only)
        docs.npy              [n, 2] int32  documents of A and B (-1: none or several)
        masked_positions.npy  [n, P] int16  static masking: positions, -1 padded (P = max_predictions_per_seq)
        masked_ids.npy        [n, P] int32  static masking: the original ids there
        meta.json             block identity and counts (written last)

Deviation from create_pretraining_data: instances are not shuffled on disk
(that would need them all in memory); the dataset reads them in a seeded
random permutation instead, a fresh one every epoch.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
import textwrap

import numpy as np

from bertkit.errors import BertkitError, probability
from bertkit.pretraining import instances as inst_mod
from bertkit.pretraining.blocks import held_out_documents, init_block_worker, plan_blocks, write_block
from bertkit.data.outputs import check_output, folder_lock
from bertkit.data.corpus import (DOCUMENT_MODES, ENCODING_ERRORS, SENTENCE_MODES, SKIP_REASONS, CorpusStats,
                                 check_encoding, check_encoding_errors, corpus_files)
from bertkit.pretraining.masking import MASKING_MODES, MaskingConfig, MaskVocab, default_max_predictions
from bertkit.pretraining.shards import (
    consolidate,
    file_identity,
    load_corpus,
    read_shard_stats,
    room_for_instances,
    shard_is_complete,
    tokenize_file,
    tokenizer_identity,
)
from bertkit.text.workers import run_jobs
from bertkit.text.tokenizer import Tokenizer

FORMAT_VERSION = 1


def _opt(default, help, choices=None, **more):
    return field(default=default, metadata={"help": help, "choices": choices, **more})


@dataclass
class PrepareConfig:
    """Every setting of `bertkit pretrain prepare` (one flag each), with the original's defaults."""

    max_seq_length: int = _opt(128, "tokens per instance, [CLS]/[SEP] included")
    objective: str = _opt("nsp", "pair objective: nsp (random next), sop (sentence order), none (full sentences "
                          "packed across documents), single (one segment per document span)", inst_mod.OBJECTIVES)
    masking: str = _opt("token", "what is masked together: token, whole-word, or ngram (1-3 whole words, ALBERT)",
                        MASKING_MODES)
    dynamic_masking: bool = _opt(False, "store unmasked instances; the collator masks anew every epoch")
    masked_lm_prob: float = _opt(0.15, "fraction of tokens to predict")
    max_predictions_per_seq: int | None = _opt(None, "at most this many predictions per instance (default: "
                                               "max(20, round(max-seq-length x masked-lm-prob)), which never cuts "
                                               "the masked share: 20 at 128 tokens, as the original, 77 at 512)")
    max_ngram: int = _opt(3, "longest n-gram (in words) for --masking ngram", needs=("masking", "ngram"))
    short_seq_prob: float = _opt(0.1, "probability of a shorter random target length")
    dupe_factor: int | None = _opt(None, "passes over the corpus, each with new pairs and masks "
                                   "(default: 10 with static masking, as the original; 1 with dynamic)")
    seed: int = _opt(12345, "random seed (pairs, masks); the output is a function of inputs and settings")
    documents: str = _opt("blank-line", "what ends a document: a blank line (the original format) or the end "
                          "of the file (books: blank lines then only end paragraphs)", DOCUMENT_MODES)
    sentences: str = _opt("split", "split: join each paragraph's lines and cut sentences with the splitter; "
                          "line: every line is a sentence", SENTENCE_MODES)
    encoding: str = _opt("utf-8", "the text encoding of the corpus files, e.g. latin-1 or cp1252")
    encoding_errors: str = _opt("strict", "a line that does not decode: strict (stop, naming it) or replace "
                                "(repair its bad bytes, counted in the summary)", ENCODING_ERRORS)
    workers: int = _opt(0, "worker processes (0: one per core, at most 2)")
    held_out: float = _opt(0.01, "fraction of documents kept apart for the run's held-out evaluation, chosen before "
                           "pairs are made (at least one with 3 or more documents, none with fewer): a training "
                           "document's random next segment never comes from them (nsp, sop: sequences packed "
                           "across documents hold out a seeded sample of instances instead)",
                           needs=("objective", ("nsp", "sop")))

    def validate(self) -> "PrepareConfig":
        if self.objective not in inst_mod.OBJECTIVES:
            raise BertkitError(f"unknown objective {self.objective!r}; choose one of {', '.join(inst_mod.OBJECTIVES)}")
        if self.documents not in DOCUMENT_MODES:
            raise BertkitError(f"unknown --documents {self.documents!r}; choose one of {', '.join(DOCUMENT_MODES)}")
        if self.sentences not in SENTENCE_MODES:
            raise BertkitError(f"unknown --sentences {self.sentences!r}; choose one of {', '.join(SENTENCE_MODES)}")
        low = 5 if self.objective in ("nsp", "sop") else 3  # messages name the flags (pretrain prepare's options)
        if not low <= self.max_seq_length <= 32767:
            raise BertkitError(f"--max-seq-length must be in {low}..32767 for objective {self.objective}, "
                               f"got {self.max_seq_length}")
        probability(self.short_seq_prob, "--short-seq-prob")
        if self.dupe_factor is not None and self.dupe_factor < 1:
            raise BertkitError(f"--dupe-factor must be >= 1, got {self.dupe_factor}")
        if not 0 <= self.held_out < 0.5:
            raise BertkitError(f"--held-out must be in [0, 0.5), got {self.held_out}")
        if self.workers < 0:
            raise BertkitError(f"--workers must be >= 0 (0: one per core), got {self.workers}")
        check_encoding(self.encoding)
        check_encoding_errors(self.encoding_errors)
        self.masking_config()
        return self

    def masking_config(self) -> MaskingConfig:
        return MaskingConfig(self.masking, self.masked_lm_prob, self.max_predictions, self.max_ngram).validate()

    @property
    def max_predictions(self) -> int:
        """max_predictions_per_seq as given, else its default for this length and masked_lm_prob."""
        if self.max_predictions_per_seq is not None:
            return self.max_predictions_per_seq
        return default_max_predictions(self.max_seq_length, self.masked_lm_prob)

    def resolved(self) -> "PrepareConfig":
        """A copy with the cap as a number: what the instances' fingerprints and the manifest record (data
        prepared at 128 tokens before the default followed the length recorded 20, as this gives, and is reused;
        data prepared at 512 then recorded 20 too, which its dynamic masking keeps, and is made again)."""
        return replace(self, max_predictions_per_seq=self.max_predictions)

    @property
    def passes(self) -> int:
        if self.dupe_factor is not None:
            return self.dupe_factor
        return 1 if self.dynamic_masking else 10

    def num_workers(self) -> int:
        return self.workers or min(2, os.cpu_count() or 1)


@dataclass
class Summary:
    """What prepare reports: corpus counts, skips, and the instances made."""

    corpus: CorpusStats
    instances: int = 0
    instance_tokens: int = 0
    masked_tokens: int = 0
    label_ones: int = 0
    truncated_tokens: int = 0  # cut off the pairs by truncation (a blocks' meta from before it was counted: 0)
    seconds: float = 0.0
    shards: list = field(default_factory=list)

    @property
    def mean_length(self) -> float:
        return self.instance_tokens / self.instances if self.instances else 0.0


# --- stage 1: tokenise --------------------------------------------------------------

_WORKER: dict = {}


def _init_tokenize_worker(tokenizer) -> None:
    _WORKER["tokenizer"] = tokenizer


def _tokenize_job(job) -> tuple:
    path, shard, settings = job
    return shard, tokenize_file(Path(path), Path(shard), _WORKER["tokenizer"], settings)


def _tokenize_stage(files: list, out: Path, tokenizer, cfg: PrepareConfig, progress: bool) -> tuple:
    settings = {"documents": cfg.documents, "sentences": cfg.sentences, "encoding": cfg.encoding,
                "encoding_errors": cfg.encoding_errors, "vocab_size": len(tokenizer),
                "tokenizer": tokenizer_identity(tokenizer)}
    root = out / "tokens"
    root.mkdir(parents=True, exist_ok=True)
    shards = [root / f"{i:05d}" for i in range(len(files))]
    _remove_extra(root, len(files))
    todo = [(str(f), str(s), settings) for f, s in zip(files, shards)
            if not shard_is_complete(s, file_identity(f), settings)]
    todo.sort(key=lambda job: -Path(job[0]).stat().st_size)  # largest first: no core idles at the end
    stats = CorpusStats()
    pending = {job[1] for job in todo}
    for s in shards:
        if str(s) not in pending:
            stats.merge(read_shard_stats(s))
    from tqdm import tqdm  # late: tqdm reads its TQDM_* defaults when imported, after the command's settings
    bar = tqdm(total=len(files), initial=len(files) - len(todo), unit="file", desc="tokenising",
               disable=not progress, dynamic_ncols=True)
    for _, st in run_jobs(_tokenize_job, todo, cfg.num_workers(), _init_tokenize_worker, (tokenizer,)):
        stats.merge(st)
        bar.set_postfix(tokens=f"{stats.tokens:,}", refresh=False)  # drawn by update(), at its pace
        bar.update(1)
    bar.close()
    return shards, stats, settings


def _remove_extra(root: Path, keep: int) -> None:
    """Delete our own numbered shard folders beyond `keep` (left by an earlier, larger run) and a killed writer's
    temporaries (`write_folder`'s NNNNN.tmp/ and its lock; an older bertkit's .NNNNN.tmp-PID/)."""
    for p in root.iterdir():
        if ".tmp" in p.name and p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        elif ".tmp" in p.name:
            p.unlink(missing_ok=True)
        elif p.is_dir() and p.name.isdigit() and int(p.name) >= keep:
            shutil.rmtree(p)


# --- stage 3: instances (the blocks: bertkit.pretraining.blocks) ---------------------------


def _instance_stage(out: Path, cfg: PrepareConfig, vocab: MaskVocab, tokenizer, corpus_fp: dict, progress: bool):
    tokens, sents, docs = load_corpus(out / "corpus")
    n_docs = len(docs) - 1
    if cfg.objective == "nsp" and n_docs < 2:
        raise BertkitError(
            f"next-sentence prediction needs at least 2 documents for its random next segment, the corpus has "
            f"{n_docs}; use --documents blank-line if documents are separated by blank lines, or --objective sop/none"
        )
    units = plan_blocks(np.asarray(docs), np.asarray(sents), cfg)
    doc_tokens = np.diff(np.asarray(sents)[np.asarray(docs)])  # [D]
    pairs = cfg.objective in ("nsp", "sop")  # each document's instances at least, whatever the draws
    doc_rows = inst_mod.pair_instances_at_least(sents, docs, cfg.max_seq_length) if pairs else None
    del tokens, sents, docs
    root = out / "instances"
    root.mkdir(parents=True, exist_ok=True)
    _remove_extra(root, len(units))
    cfg_dict = asdict(cfg)
    fingerprint = {"corpus": corpus_fp, "config": {k: v for k, v in cfg_dict.items() if k != "workers"},
                   "format": FORMAT_VERSION}
    folders = [root / f"{i:05d}" for i in range(len(units))]
    metas: dict = {}
    todo = []
    for (p, b, doc_ids), folder in zip(units, folders):
        meta = _read_meta(folder)
        if meta is not None and meta.get("fingerprint") == fingerprint:
            metas[str(folder)] = meta
        else:
            todo.append((p, b, doc_ids, cfg, str(folder), fingerprint))
    # a certain lower bound of the rows still to write; packed (`instances.packed_instances`): each token once per
    # pass, at most T - 2 in an instance ([CLS], [SEP]); pairs: `instances.pair_instances_at_least`
    rows = sum(int(doc_rows[job[2]].sum()) if pairs else -(-int(doc_tokens[job[2]].sum()) // (cfg.max_seq_length - 2))
               for job in todo)
    room_for_instances(root, rows, cfg.max_seq_length, vocab.size,
                       0 if cfg.dynamic_masking else cfg.max_predictions_per_seq)
    from tqdm import tqdm  # late: tqdm reads its TQDM_* defaults when imported, after the command's settings
    bar = tqdm(total=len(units), initial=len(units) - len(todo), unit="block", desc="instances",
               disable=not progress, dynamic_ncols=True)
    initargs = (str(out / "corpus"), vocab, tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id)
    for job, meta in zip(todo, run_jobs(write_block, todo, cfg.num_workers(), init_block_worker, initargs,
                                        uses_torch=True)):
        metas[job[4]] = meta
        bar.update(1)
    bar.close()
    return [(f, metas[str(f)]) for f in folders], held_out_documents(n_docs, cfg).tolist()


def _read_meta(folder: Path):
    try:
        return json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError):
        return None


# --- the job --------------------------------------------------------------------------


# a folder holding these is finished prepared data (the manifest is written last): not replaced unasked
PREPARED = {"prepared pre-training data": ("manifest.json",)}


def _check_output_dir(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise BertkitError(f"output {out} exists and is not a folder; pass a folder with -o")
    if out.is_dir() and any(out.iterdir()):
        ours = {"manifest.json", "tokens", "corpus", "instances", "vocab.txt", "tokenizer_config.json",
                "corpus.tmp", "corpus.tmp.lock"}  # a killed run's corpus, being written (`write_folder`)
        foreign = [p.name for p in out.iterdir() if p.name not in ours and not p.name.startswith(".")]
        if foreign:
            raise BertkitError(
                f"output folder {out} is not empty and not a prepared-data folder (it holds {', '.join(sorted(foreign)[:3])}); "
                "choose a new or empty folder with -o"
            )
    # finished data is refused unless `overwrite`: another corpus or settings rebuilt it silently under the runs
    # that train on it; an unfinished folder (no manifest: a run was stopped) is continued, as before
    check_output(out, overwrite=overwrite, kinds=PREPARED, call="prepare")


def prepare(corpus, output, cfg: PrepareConfig | None = None, vocab=None, progress: bool = True,
            overwrite: bool = False) -> Summary:
    """Prepare pre-training data from `corpus` (files/folders) into the folder `output`.

    vocab: a vocab.txt or model folder (None: the default model's). Re-running after an interruption
    continues the work (a folder without manifest.json); the result is identical.
    overwrite: a folder holding finished prepared data (its manifest.json) is refused unless it is True, as the
    CLI refuses it without --overwrite (a second call with another corpus or settings rebuilt the data under
    the runs training on it, without a word); with it the data is made again, reusing what the same corpus
    and settings already made.
    """
    cfg = (cfg or PrepareConfig()).validate().resolved()
    t0 = time.perf_counter()
    out = Path(output)
    files = corpus_files(corpus, skip=(out, vocab))
    _check_output_dir(out, overwrite)
    # one writer at a time: two runs into one folder took each other's token shards, corpus and instances
    # for "finished by a previous run", and the manifest of one described instances cut from the other's text
    with folder_lock(out, "bertkit pretrain prepare"):
        return _prepare_locked(files, out, cfg, vocab, progress, t0)


def _prepare_locked(files: list, out: Path, cfg: PrepareConfig, vocab, progress: bool, t0: float) -> Summary:
    """`prepare`'s stages, into the folder `out` that it holds locked."""
    (out / "manifest.json").unlink(missing_ok=True)  # the folder is incomplete until the end
    tokenizer = Tokenizer.from_pretrained(vocab)
    tokenizer.save_pretrained(out)
    vocab_info = MaskVocab.from_tokens(tokenizer.ids_to_tokens)

    shards, stats, tok_settings = _tokenize_stage(files, out, tokenizer, cfg, progress)
    if stats.tokens == 0:
        reasons = stats.describe_skips() or "the files are empty"
        raise BertkitError(f"the corpus has no text to train on ({len(files)} file(s); {reasons})")
    corpus_fp = _corpus_stage(shards, out, tok_settings, len(tokenizer))
    blocks, held_out = _instance_stage(out, cfg, vocab_info, tokenizer, corpus_fp, progress)
    summary = _summarise(stats, blocks, out)
    if summary.instances == 0:
        raise BertkitError("no training instance could be made: the documents are too short for the objective "
                           f"{cfg.objective!r} (try --objective none or more text)")
    summary.seconds = time.perf_counter() - t0
    _write_manifest(out, cfg, tokenizer, files, summary, held_out)
    return summary


def _corpus_stage(shards: list, out: Path, tok_settings: dict, vocab_size: int) -> dict:
    """The tokenized shards consolidated into out/corpus, unless it already holds them; returns their fingerprint."""
    corpus_fp = {"inputs": [json.loads((s / "stats.json").read_text())["input"] for s in shards],
                 "settings": tok_settings}
    marker = out / "corpus" / "corpus.json"
    fp_file = out / "corpus" / "fingerprint.json"
    if not (marker.is_file() and _read_fingerprint(fp_file) == corpus_fp):
        # the fingerprint is published with the corpus folder: written after it, in place, a kill or a full disk
        # there left it cut, and every later run over the folder died on it (a JSONDecodeError traceback)
        consolidate(shards, out / "corpus", vocab_size, corpus_fp)
    return corpus_fp


def _read_fingerprint(path: Path) -> dict | None:
    """What a corpus folder says it was made from; None when it says nothing readable (it is made again)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # missing, cut (an older bertkit wrote it in place), not UTF-8
        return None


def _summarise(stats, blocks: list, out: Path) -> Summary:
    """The run's summary: the corpus statistics and the instance blocks' counts (documents too short are skips)."""
    summary = Summary(stats)
    for folder, meta in blocks:
        summary.instances += meta["instances"]
        summary.instance_tokens += meta["tokens"]
        summary.masked_tokens += meta["masked"]
        summary.label_ones += meta["label_ones"]
        summary.truncated_tokens += meta.get("truncated", 0)
        if meta["unusable_documents"]:
            stats.skip("unusable_documents", meta["unusable_documents"])
        if meta["instances"]:
            summary.shards.append({"path": str(folder.relative_to(out)), "instances": meta["instances"]})
    return summary


def _write_manifest(out: Path, cfg: PrepareConfig, tokenizer, files: list, summary: Summary, held_out: list) -> None:
    """manifest.json, written last and atomically: its presence says the folder is complete."""
    manifest = {
        "format": FORMAT_VERSION,
        "config": asdict(cfg),
        "dupe_factor": cfg.passes,
        "vocab_size": len(tokenizer),
        "special_ids": {"pad": tokenizer.pad_token_id, "cls": tokenizer.cls_token_id,
                        "sep": tokenizer.sep_token_id, "mask": tokenizer.mask_token_id},
        "inputs": [str(f) for f in files],
        "corpus": summary.corpus.to_dict(),
        "instances": summary.instances,
        "instance_tokens": summary.instance_tokens,
        "mean_length": summary.mean_length,
        "masked_tokens": summary.masked_tokens,
        "label_ones": summary.label_ones,
        "held_out_documents": held_out,
        "shards": summary.shards,
        "seconds": summary.seconds,
    }
    tmp = out / ".manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, out / "manifest.json")


def format_summary(summary: Summary, cfg: PrepareConfig) -> str:
    c = summary.corpus
    lines = [
        f"files       {c.files:,} ({c.bytes / 1e6:,.1f} MB)",
        f"documents   {c.documents:,}",
        f"sentences   {c.sentences:,}",
        f"tokens      {c.tokens:,}",
        f"instances   {summary.instances:,} ({cfg.passes} pass(es), objective {cfg.objective}, "
        f"{'dynamic' if cfg.dynamic_masking else 'static'} {cfg.masking} masking)",
        f"mean length {summary.mean_length:.1f} tokens (max {cfg.max_seq_length})",
    ]
    if summary.masked_tokens:
        lines.append(f"masked      {summary.masked_tokens:,} tokens ({summary.masked_tokens / summary.instance_tokens:.1%})")
    if cfg.objective in ("nsp", "sop"):
        what = "random next" if cfg.objective == "nsp" else "swapped"
        lines.append(f"label 1     {summary.label_ones / summary.instances:.1%} ({what})")
    if c.skips:
        lines.append("skipped / repaired:")
        lines += [f"  {n:>9,}  {SKIP_REASONS[k]}" for k, n in sorted(c.skips.items())]
    else:
        lines.append("skipped     nothing")
    if cfg.documents == "blank-line" and c.documents and c.sentences / c.documents < 4:
        lines.append(f"note        documents average {c.sentences / c.documents:.1f} sentences: if blank lines separate "
                     "paragraphs rather than documents (books), use --documents file")
    if cfg.objective in ("nsp", "sop"):  # after the skips: the guide's outputs end there with "..."
        drawn = summary.instance_tokens - 3 * summary.instances + summary.truncated_tokens  # less [CLS] A [SEP] B [SEP]
        lines.append(f"truncated   {summary.truncated_tokens:,} tokens ({summary.truncated_tokens / drawn:.1%} of the "
                     "pairs' sentences) cut to fit, as create_pretraining_data cuts them; a sentence longer than the "
                     "sequence loses its tail (--objective none or single: cut into pieces instead)")
    rate = c.tokens / summary.seconds if summary.seconds else 0
    lines.append(f"time        {summary.seconds:.1f} s ({rate:,.0f} corpus tokens/s)")
    return "\n".join(lines)


# --- what the command prints ---------------------------------------------------------------


def _wrap(text: str, width: int = 100, indent: str = "    ") -> str:
    return textwrap.fill(text, width, initial_indent=indent, subsequent_indent=indent)


def format_example(ds, index: int, tok) -> str:
    """One instance three ways: the original spans, what the model sees, and what it must predict."""
    item = ds[index]
    src = ds.source(index)
    corpus = ds.corpus_tokens()
    lines = [f"example instance {index} ({len(item['input_ids'])} tokens)"]
    spans = src["spans"]
    names = ["A", "B"]
    if spans[0] >= 0:
        lines.append("original text:")
        for j in range(2):
            s, e = spans[2 * j], spans[2 * j + 1]
            if s >= 0:
                lines.append(f"  {names[j]} (document {src['docs'][j]}):")
                lines.append(_wrap(tok.decode([int(t) for t in corpus[s:e]])))
    if "next_sentence_label" in item:
        label = item["next_sentence_label"]
        meaning = {"nsp": ("B follows A", "B is random, from another document"),
                   "sop": ("A and B in order", "A and B swapped")}[ds.objective][label]
        lines.append(f"next_sentence_label: {label} ({meaning})")
    ids = item["input_ids"].copy()
    if spans[0] < 0:  # packed sequences: the text is the instance itself, unmasked
        original = ids.copy()
        if ds.static_masking:
            original[item["masked_positions"]] = item["masked_ids"]
        lines.append("original text (documents separated by [SEP]):")
        lines.append(_wrap(tok.decode([int(t) for t in original[1:-1]])))
    if ds.static_masking:
        positions, originals = item["masked_positions"], item["masked_ids"]
    else:
        batch = ds.collator(return_masked_positions=True)([item])  # the positions: the collator's reading of labels
        ids = batch["input_ids"][0].numpy()
        positions = batch["masked_positions"][0].numpy()[batch["masked_weights"][0].numpy() > 0]
        originals = batch["labels"][0].numpy()[positions]
    lines.append("model input (masked):")
    lines.append(_wrap(" ".join(tok.convert_ids_to_tokens([int(t) for t in ids]))))
    pairs = [f"{p}:{tok.convert_ids_to_tokens([int(o)])[0]}" + (
        "" if ids[p] == tok.mask_token_id else f" (shown as {tok.convert_ids_to_tokens([int(ids[p])])[0]})")
        for p, o in zip(positions, originals)]
    lines.append(f"labels ({len(pairs)} positions to predict, position:original token):")
    lines.append(_wrap(", ".join(pairs)))
    return "\n".join(lines)

"""Pre-training data: preparation throughput and peak memory, and the batch collator vs transformers.

Two measurements, one run:

1. `prepare` on a corpus (default: the WHOLE shared Gutenberg corpus, 102 books,
   51 MB) with the default settings for books (`--documents file`, NSP, static
   token masking, dupe factor 10): wall time per stage, corpus tokens/s, and the
   peak memory of the job (PSS of the main process + its workers, sampled every
   0.2 s from /proc; PSS, unlike RSS, does not count pages shared after fork twice) over time, to show that it stays flat rather than growing
   with the corpus. No peer: transformers no longer ships a data preparer.
2. The collator on the same tokenised instances (dynamic masking, batches of
   32, max length 128), ours vs transformers' DataCollatorForLanguageModeling
   (token masking) and DataCollatorForLanguageModeling(whole_word_mask=True)
   (transformers 5.x folded DataCollatorForWholeWordMask into it), interleaved
   in one process (bench/harness.py). Both get their inputs prepared outside
   the timing in their natural form: ours the dataset's numpy dicts, theirs
   lists of ids with a precomputed special_tokens_mask (their fastest path);
   their whole-word path also needs offset_mapping, which their pad() cannot
   pad, so its inputs are pre-padded to 128 (a favour: no padding to time).

    python bench/bench_pretraining_data.py                 # both, whole corpus
    python bench/bench_pretraining_data.py --books 5       # a quick run on 5 books
    python bench/bench_pretraining_data.py --write         # also write docs/benchmarks.md
"""

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import SHARED_DATA, interleaved, machine_line, report, table  # noqa: E402


def pss_kb(pid: int) -> int:
    """Proportional set size: private pages plus a share of shared ones, so forked
    workers' shared pages are not counted twice (RSS would)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def children(pid: int) -> list:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


class MemorySampler(threading.Thread):
    """Total PSS of this process and its children, sampled until stopped."""

    def __init__(self, stage_marker: Path, every=0.2):
        super().__init__(daemon=True)
        self.every, self.samples, self._halt = every, [], threading.Event()
        self.marker = stage_marker  # exists once tokenising is over

    def run(self):
        me = os.getpid()
        t0 = time.perf_counter()
        while not self._halt.is_set():
            total = pss_kb(me) + sum(pss_kb(c) for c in children(me))
            stage = "instances" if self.marker.exists() else "tokenise"
            self.samples.append((time.perf_counter() - t0, total / 1024, stage))
            self._halt.wait(self.every)

    def stop(self):
        self._halt.set()
        self.join()


def _cpu_seconds() -> float:
    import resource

    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        total += r.ru_utime + r.ru_stime
    return total


def _maxrss(who: str) -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF if who == "self" else resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def bench_prepare(corpus_files, out: Path, workers: int):
    from bertkit.pretraining.prepare import PrepareConfig, format_summary, prepare

    cfg = PrepareConfig(documents="file", workers=workers)
    sampler = MemorySampler(out / "corpus")
    sampler.start()
    cpu0 = _cpu_seconds()
    t0 = time.perf_counter()
    summary = prepare(corpus_files, out, cfg, progress=True)
    seconds = time.perf_counter() - t0
    cpu = _cpu_seconds() - cpu0
    sampler.stop()
    load = os.getloadavg()[1]
    print(format_summary(summary, cfg))
    mb = [m for _, m, _ in sampler.samples]
    quarters = np.array_split(np.array(mb), 4)

    def stage_peaks(stage):
        # peak memory in the first and second half of one stage: flat means they match
        m = np.array([x for _, x, st in sampler.samples if st == stage])
        halves = np.array_split(m, 2) if len(m) > 1 else [m, m]
        return " / ".join(f"{h.max():,.0f}" for h in halves) + " MB"
    c = summary.corpus
    lines = [
        "### Preparing the corpus (`bertkit pretrain prepare`)",
        "",
        f"{c.files} files, {c.bytes / 1e6:.1f} MB, {c.documents} documents, {c.sentences:,} sentences, "
        f"{c.tokens:,} tokens -> {summary.instances:,} instances (NSP, static token masking, "
        f"dupe factor {cfg.passes}, max length 128, `--documents file`), {workers} worker processes.",
        "",
        "| measure | value |",
        "| --- | ---: |",
        f"| wall time | {seconds:.1f} s |",
        f"| CPU time, main + workers | {cpu:.1f} s (load average {load:.1f} on {os.cpu_count()} cores) |",
        f"| corpus tokens / s (whole job, wall clock) | {c.tokens / seconds:,.0f} |",
        f"| corpus tokens / CPU second | {c.tokens / cpu:,.0f} |",
        f"| instance tokens written / s | {summary.instance_tokens / seconds:,.0f} |",
        f"| peak memory (PSS), main + workers | {max(mb):,.0f} MB |",
        f"| peak RSS (ru_maxrss): main process / largest worker | {_maxrss('self'):,.0f} / {_maxrss('children'):,.0f} MB |",
        "| peak memory in each quarter of the run | " + " / ".join(f"{q.max():,.0f}" for q in quarters if len(q)) + " MB |",
        f"| peak memory, tokenising: first / second half | {stage_peaks('tokenise')} |",
        f"| peak memory, instances (workers import torch): first / second half | {stage_peaks('instances')} |",
        f"| output on disk | {sum(f.stat().st_size for f in out.rglob('*') if f.is_file()) / 1e6:,.0f} MB |",
        "",
    ]
    return "\n".join(lines)


def bench_collator(data_dir: Path, n_batches: int, batch_size: int = 32):
    import transformers

    from bertkit.default_model import default_model_dir
    from bertkit.pretraining.dataset import PretrainingDataset

    ds = PretrainingDataset(data_dir, seed=0)
    n = min(len(ds), n_batches * batch_size)
    ours_items = [ds[ds.index_at(p)] for p in range(n)]
    for x in ours_items:
        x.pop("next_sentence_label", None)  # the peers have no pair objective: compare like with like
    batches = [ours_items[i:i + batch_size] for i in range(0, n - batch_size + 1, batch_size)]
    tokens = sum(len(x["input_ids"]) for x in ours_items[: len(batches) * batch_size])

    hf_tok = transformers.BertTokenizerFast.from_pretrained(str(default_model_dir()))
    special = set(hf_tok.all_special_ids)
    tok = ds.tokenizer()
    cont = np.array([t.startswith("##") for t in tok.ids_to_tokens])

    def hf_example(x, pad_to=None):
        ids = x["input_ids"].tolist()
        ex = {"input_ids": ids, "token_type_ids": x["token_type_ids"].tolist(),
              "special_tokens_mask": [int(t in special) for t in ids]}
        if pad_to:
            # word boundaries as character offsets: a "##" piece touches the previous token
            offsets, pos = [], 0
            for t in ids:
                if t in special:
                    offsets.append((0, 0))
                    continue
                start = pos if cont[t] else pos + 1
                offsets.append((start, start + 1))
                pos = start + 1
            k = pad_to - len(ids)
            ex = {"input_ids": ids + [hf_tok.pad_token_id] * k, "token_type_ids": ex["token_type_ids"] + [0] * k,
                  "attention_mask": [1] * len(ids) + [0] * k, "special_tokens_mask": ex["special_tokens_mask"] + [1] * k,
                  "offset_mapping": offsets + [(0, 0)] * k}
        return ex

    hf_batches = [[hf_example(x) for x in b] for b in batches]
    hf_ww_batches = [[hf_example(x, pad_to=ds.max_seq_length) for x in b] for b in batches]

    from bertkit.pretraining.collate import PretrainingCollator
    from bertkit.pretraining.masking import MaskingConfig, MaskVocab

    vocab = MaskVocab.from_tokens(tok.ids_to_tokens)
    ours_token = PretrainingCollator(vocab, tok.pad_token_id, MaskingConfig("token"))
    ours_ww = PretrainingCollator(vocab, tok.pad_token_id, MaskingConfig("whole-word"))
    hf_token = transformers.DataCollatorForLanguageModeling(hf_tok, mlm_probability=0.15, seed=0)
    hf_ww = transformers.DataCollatorForLanguageModeling(hf_tok, mlm_probability=0.15, whole_word_mask=True, seed=0)
    g = torch.Generator().manual_seed(0)

    def run(collate, data, *extra):
        def go():
            for b in data:
                collate(b, *extra)
        return go

    # sanity: both produce the same tensors' shapes and about 15% labels
    for name, out in (("ours", ours_token(batches[0], g)), ("hf", hf_token(hf_batches[0]))):
        lab = out["labels"]
        print(f"{name}: input_ids {tuple(out['input_ids'].shape)}, labelled {(lab != -100).float().sum() / out['attention_mask'].sum():.3f}")

    results = []
    times = interleaved({"bertkit token masking": run(ours_token, batches, g),
                         "transformers DataCollatorForLanguageModeling": run(hf_token, hf_batches)}, rounds=5)
    results.append(table("Collator, dynamic token masking (batches of 32)", tokens, "tokens", times,
                         "bertkit token masking"))
    times = interleaved({"bertkit whole-word masking": run(ours_ww, batches, g),
                         "transformers whole_word_mask=True (inputs pre-padded)": run(hf_ww, hf_ww_batches)}, rounds=5)
    results.append(table("Collator, dynamic whole-word masking (batches of 32)", tokens, "tokens", times,
                         "bertkit whole-word masking"))
    return "\n".join(results)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--books", type=int, default=0, help="use only the first N books (0: all)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batches", type=int, default=60, help="collator batches per round")
    ap.add_argument("--skip-prepare", action="store_true", help="only the collator benchmark")
    ap.add_argument("--write", action="store_true", help="write the tables into docs/benchmarks.md")
    args = ap.parse_args(argv)
    if args.books == 1:  # each book is one document, and NSP draws its random next segment from another one
        ap.error("--books 1: next-sentence prediction needs 2 or more documents (books); use --books 2 or more")

    from bertkit.pretraining.prepare import PrepareConfig, prepare

    books = sorted((SHARED_DATA / "pretrain_corpus" / "gutenberg").glob("*.txt"))
    if not books:
        sys.exit(f"shared corpus not found under {SHARED_DATA}")
    if args.books:
        books = books[: args.books]
    parts = [f"Machine: {machine_line('transformers')}", ""]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if not args.skip_prepare:
            parts.append(bench_prepare(books, tmp / "full", args.workers))
        # collator data: 5 books, dynamic masking (unmasked instances)
        prepare(books[:5], tmp / "dyn", PrepareConfig(documents="file", dynamic_masking=True), progress=False)
        parts.append(bench_collator(tmp / "dyn", args.batches))
    cmd = "python bench/bench_pretraining_data.py" + "".join(f" {a}" for a in (argv or sys.argv[1:]) if a != "--write")
    parts.append(f"Command: `{cmd}`")
    report("pretraining_data", "\n".join(parts), args.write)


if __name__ == "__main__":
    main()

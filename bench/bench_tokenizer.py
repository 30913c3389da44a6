"""Tokenizer throughput: bertkit against the pure-Python and the Rust BERT tokenizers.

Text: lines of the Gutenberg pre-training corpus (../shared/data), a fixed
sample spread over all 102 books (every k-th non-empty line, about --mb MB).
Each contender turns text into [CLS] ... [SEP] ids with the same vocabulary
(the default model's, uncased), in one process, interleaved, median of
--rounds rounds after a warm-up round (see harness.py).

- one text per call, single thread: bertkit `encode` (ids, offsets, word ids),
  transformers' pure-Python tokenizer (BertTokenizerLegacy, formerly
  BertTokenizer), `tokenizers.BertWordPieceTokenizer.encode` (Rust) and
  `BertTokenizerFast.encode` (Rust behind the transformers wrapper);
  "bertkit, cold cache" empties the word cache before every round;
- batched: bertkit `encode_batch` (2 worker processes, and 1), Rust
  `encode_batch` (rayon threads on all cores), BertTokenizerFast(batch).

    python bench/bench_tokenizer.py [--mb 4] [--rounds 3] [--write]
"""

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import SHARED_DATA, interleaved, machine_line, report, table  # noqa: E402


def sample_lines(megabytes: float) -> list[str]:
    books = sorted((SHARED_DATA / "pretrain_corpus" / "gutenberg").glob("*.txt"))
    if not books:
        sys.exit(f"no corpus at {SHARED_DATA}/pretrain_corpus/gutenberg")
    lines = [line for b in books for line in b.read_text(encoding="utf-8").split("\n") if line.strip()]
    total = sum(len(line.encode()) for line in lines)
    step = max(1, round(total / (megabytes * 1e6)))
    return lines[::step]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=4.0, help="size of the text sample in MB")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--write", action="store_true", help="write the tables into docs/benchmarks.md")
    args = ap.parse_args()

    import transformers
    from tokenizers import BertWordPieceTokenizer

    from bertkit.default_model import default_model_dir
    from bertkit.text.tokenizer import Tokenizer

    model_dir = default_model_dir()
    lines = sample_lines(args.mb)
    nbytes = sum(len(line.encode()) for line in lines)
    print(f"{len(lines)} lines, {nbytes / 1e6:.2f} MB", file=sys.stderr)

    ours = Tokenizer.from_pretrained(model_dir)
    legacy_cls = getattr(transformers, "BertTokenizerLegacy", None) or transformers.BertTokenizer
    legacy = legacy_cls.from_pretrained(str(model_dir))
    fast = transformers.BertTokenizerFast.from_pretrained(str(model_dir))
    rust = BertWordPieceTokenizer(str(model_dir / "vocab.txt"), lowercase=True)
    assert len(legacy) == len(fast) == len(ours) == 30522, "a peer did not load the real vocabulary"
    fast.backend_tokenizer.no_truncation()
    fast.backend_tokenizer.no_padding()

    probe = lines[:2000]
    expect = [ours.encode(t, truncation=False).input_ids for t in probe]
    assert expect == [rust.encode(t).ids for t in probe], "peers disagree: not the same work"
    assert expect == [fast.encode(t) for t in probe]

    def each(fn):
        # one call per line; results dropped as a streaming user would (holding
        # them all would time the garbage collector rather than the tokenizer)
        def run():
            for t in lines:
                fn(t)
        return run

    def cold():
        ours._cache.clear()
        for t in lines:
            ours.encode(t, truncation=False)

    single = {
        "bertkit encode": each(lambda t: ours.encode(t, truncation=False)),
        "bertkit encode, cold cache": cold,
        "tokenizers BertWordPieceTokenizer (Rust)": each(rust.encode),
        "BertTokenizerFast (Rust)": each(fast.encode),
        f"{legacy_cls.__name__} (pure Python)": each(legacy.encode),
    }
    times = interleaved(single, rounds=args.rounds)
    note = (
        f"{len(lines):,} lines ({nbytes / 1e6:.2f} MB) sampled from the 102 Gutenberg books; "
        "[CLS] text [SEP] ids with the default model's uncased vocabulary; one call per line, one thread. "
        f"Machine: {machine_line('transformers', 'tokenizers')}; load average {os.getloadavg()[0]:.1f} at the start "
        "(other jobs sharing the cores slow every contender; compare the ratios). "
        "Command: `python bench/bench_tokenizer.py --write`."
    )
    md = table("Tokenizer, one text per call (single thread)", nbytes / 1e6, "MB", times, "bertkit encode", note)

    batch = {
        "bertkit encode_batch, 2 processes": lambda: ours.encode_batch(
            lines, padding=False, return_tensors=None, num_workers=2, truncation=False),
        "bertkit encode_batch, 1 process": lambda: ours.encode_batch(
            lines, padding=False, return_tensors=None, num_workers=1, truncation=False),
        "tokenizers BertWordPieceTokenizer.encode_batch (Rust, all cores)": lambda: rust.encode_batch(lines),
        "BertTokenizerFast(batch) (Rust, all cores)": lambda: fast(lines),
    }
    times = interleaved(batch, rounds=args.rounds)
    note = (
        f"Same {len(lines):,} lines in one call; {os.cpu_count()} cores. bertkit spreads the batch over "
        "worker processes (forked once, kept); the Rust peers use rayon threads."
    )
    md += "\n" + table("Tokenizer, batched", nbytes / 1e6, "MB", times, "bertkit encode_batch, 2 processes", note)
    ours.close()
    report("tokenizer", md, args.write)


if __name__ == "__main__":
    main()

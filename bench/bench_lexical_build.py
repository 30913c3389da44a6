"""BM25 build time and size at 100k to 1M passages: the lexical part `bertkit index` builds.

    nice -n 5 python bench/bench_lexical_build.py --passages 100000 --work /tmp/lexical
    nice -n 5 python bench/bench_lexical_build.py --passages 1000000 --work /tmp/lexical

Passages: the Gutenberg books of `shared/data/pretrain_corpus` (MANIFEST.tsv order), split at white space
into one stream of W words; passage i is the `--words` words (default 64) starting at word i x floor(W / N),
so that N passages spread over every book whatever N is (at 1M, about 9 words apart: each word is in about
7 passages; at 100k, 90 apart: the passages do not overlap). The build is
`bertkit.retrieval.lexical.build_lexical` (bm25s, Lucene idf, k1 1.5, b 0.75, English stop words,
PyStemmer's English stemmer), the step `bertkit index` runs after the vectors; timed in this process, its
peak memory read from /proc/self/status (VmHWM, before and after the build: the books' word list is the
peak before), the folder's bytes summed. One JSON line per run is
appended to `--work/results.jsonl`.
"""

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import bm25s
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import machine_line  # noqa: E402

from bertkit.retrieval.config import LexicalOptions  # noqa: E402
from bertkit.retrieval.lexical import LEXICAL_DIR, build_lexical  # noqa: E402

CORPUS = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "pretrain_corpus"


def passages(n: int, words: int) -> list[str]:
    books = [line.split("\t")[0] for line in (CORPUS / "MANIFEST.tsv").read_text().splitlines()[1:]]
    stream = [w for book in books for w in (CORPUS / book).read_text(encoding="utf-8").split()]
    step = max(1, (len(stream) - words) // n)
    return [" ".join(stream[i * step : i * step + words]) for i in range(n)], len(stream), step


def peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passages", type=int, required=True)
    ap.add_argument("--words", type=int, default=64)
    ap.add_argument("--work", type=Path, required=True)
    args = ap.parse_args()
    t0 = time.perf_counter()
    texts, total, step = passages(args.passages, args.words)
    read_s = time.perf_counter() - t0
    out = args.work / f"n{args.passages}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    load, peak_before = os.getloadavg(), peak_rss_mib()  # the peak so far: reading the books
    t0 = time.perf_counter()
    made = build_lexical(out, texts, LexicalOptions())
    build_s = time.perf_counter() - t0
    files = list((out / LEXICAL_DIR).iterdir())
    result = {"passages": args.passages, "words_per_passage": args.words, "corpus_words": total, "step": step,
              "read_s": round(read_s, 1), "build_s": round(build_s, 1), "passages_per_s": round(args.passages / build_s),
              "bytes": sum(f.stat().st_size for f in files), "files": {f.name: f.stat().st_size for f in files},
              "vocabulary": made["vocabulary"], "peak_rss_mib": round(peak_rss_mib()),
              "peak_rss_before_build_mib": round(peak_before), "load_before": load,
              "load_after": os.getloadavg(), "machine": machine_line(),
              "bm25s": bm25s.__version__, "numpy": np.__version__}
    print(json.dumps(result))
    with open(args.work / "results.jsonl", "a") as f:
        f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()

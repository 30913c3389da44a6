"""The texts `bertkit distill static --fit` was measured with (docs/distill.md, "Fitting the table first"):

    python bench/static_fit_texts.py OUT.txt [--paragraphs 25000] [--seed 0]

General text only, **no SciFact** (its test is the goal, its train claims the dev set), no STS-B dev,
no SQuAD (held out), one text per line:

- the 60,000 sentences `distill layers` trains on (bench/layers_sentences.py: COCO captions, SNLI,
  SST-2 and STS-B train sentences) less its SciFact abstracts' first sentences: 54,825;
- --paragraphs Gutenberg paragraphs of at least 80 characters (a seeded draw over all 102 books; the
  model reads their first 256 tokens);
- the distinct MRPC and RTE train sentences and CoNLL-2003 train sentences of at least 5 tokens (news),
  those not already above.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import SHARED_DATA  # noqa: E402
from layers_sentences import draw, first_sentence  # noqa: E402
from static_pairs import clean, paragraphs, table  # noqa: E402


def scifact_first_sentences() -> set[str]:
    lines = (SHARED_DATA / "retrieval" / "scifact" / "corpus.jsonl").read_text(encoding="utf-8").split("\n")
    return {first_sentence(json.loads(x)["text"]).strip() for x in lines if x.strip()}


def conll_sentences(path: Path, shortest: int = 5) -> list[str]:
    out, words = [], []
    for line in path.read_text(encoding="utf-8").split("\n") + [""]:
        parts = line.split()
        if not parts:
            if len(words) >= shortest:
                out.append(" ".join(words))
            words = []
        elif parts[0] != "-DOCSTART-":
            words.append(parts[0])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--paragraphs", type=int, default=25000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    scifact = scifact_first_sentences()
    sentences, _ = draw(60000, 0)
    base = [s for s in sentences if s not in scifact]
    found = []
    for book in sorted((SHARED_DATA / "pretrain_corpus" / "gutenberg").glob("*.txt")):
        found += [p for p in paragraphs(book) if len(p) >= 80]
    random.Random(args.seed).shuffle(found)
    other = [clean(r[c]) for name in ("mrpc", "rte") for r in table(SHARED_DATA / name / "train.tsv")
             for c in ("sentence1", "sentence2")]
    other += conll_sentences(SHARED_DATA / "conll2003" / "train.txt")
    seen = set(sentences)
    other = [t for t in dict.fromkeys(other) if t and t not in seen]
    texts = base + found[: args.paragraphs] + other
    Path(args.out).write_text("\n".join(texts) + "\n", encoding="utf-8")
    print(json.dumps({"texts": len(texts), "sentences": len(base), "paragraphs": min(args.paragraphs, len(found)),
                      "mrpc_rte_conll": len(other)}))


if __name__ == "__main__":
    main()

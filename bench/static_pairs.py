"""General training pairs for `finetune embed --static`, made from the shared data (docs/distill.md).

    python bench/static_pairs.py OUT_DIR [--ict 100000] [--seed 0]

Writes, as TSV tables `finetune embed` reads (anchor, positive[, negative], group_id):

    shared.tsv    the shared pairs: COCO caption pairs (group_id: the picture, so two captions of one
                  picture never meet in a batch) and SNLI entailment pairs
    triplets.tsv  SNLI (premise, entailment, contradiction): the contradiction a hard negative
    ict.tsv       inverse-cloze pairs (Lee et al. 2019, "Latent Retrieval for Weakly Supervised Open
                  Domain Question Answering", section 5): a sentence of a Gutenberg paragraph and the
                  paragraph around it, the sentence removed 90% of the time (so the pair is not only
                  word overlap), --per-paragraph sentences of each paragraph (group_id: the paragraph),
                  at most --ict pairs, seeded
    general.tsv   shared.tsv + ict.tsv

No SciFact, STS-B or SQuAD text is used (the evaluations).
"""

from __future__ import annotations

import argparse
import random
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import SHARED_DATA  # noqa: E402

SENTENCE_END = re.compile(r"(?<=[.!?])[\"'”’]?\s+(?=[A-Z“\"'])")


def table(path: Path) -> list[dict]:
    lines = path.read_text(encoding="utf-8").split("\n")
    names = lines[0].split("\t")
    return [dict(zip(names, row.split("\t"))) for row in lines[1:] if row.strip()]


def clean(text: str) -> str:
    return " ".join(text.replace("\t", " ").split())


def shared_pairs() -> list[tuple[str, str, str]]:
    coco = [(clean(r["anchor"]), clean(r["positive"]), f"coco{r['group_id']}")
            for r in table(SHARED_DATA / "pairs" / "coco_captions" / "pairs_all.tsv")]
    snli = [(clean(r["anchor"]), clean(r["positive"]), "")
            for r in table(SHARED_DATA / "pairs" / "snli_devtest" / "pairs_entailment.tsv")]
    return coco + snli


def paragraphs(book: Path):
    for block in book.read_text(encoding="utf-8").split("\n\n"):
        text = clean(block)
        if text:
            yield text


def ict_pairs(limit: int, per_paragraph: int, rng: random.Random) -> list[tuple[str, str, str]]:
    """Up to `per_paragraph` (sentence, its paragraph) pairs from each paragraph of 3-15 sentences and
    30-300 words (sentences of 5+ words), grouped by paragraph (one paragraph's pairs never share a batch)."""
    pairs = []
    for book in sorted((SHARED_DATA / "pretrain_corpus" / "gutenberg").glob("*.txt")):
        for n, text in enumerate(paragraphs(book)):
            if not 30 <= len(text.split()) <= 300:
                continue
            sentences = SENTENCE_END.split(text)
            if not 3 <= len(sentences) <= 15:
                continue
            long = [k for k, s in enumerate(sentences) if len(s.split()) >= 5]
            for k in rng.sample(long, min(per_paragraph, len(long))):
                rest = sentences if rng.random() < 0.1 else sentences[:k] + sentences[k + 1:]
                pairs.append((sentences[k], " ".join(rest), f"{book.stem}:{n}"))
    rng.shuffle(pairs)
    return pairs[:limit]


def write(path: Path, header: tuple, rows) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write("\t".join(header) + "\n")
        for row in rows:
            f.write("\t".join(row) + "\n")
    print(f"{path}: {len(rows)} rows")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--ict", type=int, default=1_000_000, help="at most this many inverse-cloze pairs")
    ap.add_argument("--per-paragraph", type=int, default=3, help="inverse-cloze pairs per paragraph")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shared = shared_pairs()
    ict = ict_pairs(args.ict, args.per_paragraph, random.Random(args.seed))
    header = ("anchor", "positive", "group_id")
    write(out / "shared.tsv", header, shared)
    write(out / "ict.tsv", header, ict)
    write(out / "general.tsv", header, shared + ict)
    triplets = [(clean(r["anchor"]), clean(r["positive"]), clean(r["negative"]))
                for r in table(SHARED_DATA / "pairs" / "snli_devtest" / "triplets.tsv")]
    write(out / "triplets.tsv", ("anchor", "positive", "negative"), triplets)


if __name__ == "__main__":
    main()

"""The unlabelled sentences `distill layers` trains a sentence model's student on (docs/distill.md).

    python bench/layers_sentences.py OUT.txt [--total 60000] [--seed 0] [--packed]

From the shared data, as the issue lists them: COCO captions, SNLI sentences (premises and
hypotheses), SST-2 train sentences, STS-B train sentences, SciFact abstracts' first sentences.
Each source's distinct sentences are shuffled (seeded) and cut to its share of --total (the five
sources in equal shares; a source with fewer sentences gives them all and the rest is shared
out), then all are shuffled together: one sentence per line. None of STS-B dev or SciFact's test
queries is among them (the evaluations).

--packed appends the same sentences packed into longer texts, so that the student also learns the
teacher on inputs as long as the documents it will embed (SciFact's abstracts run to 256 tokens and
more; the sentences average about 20): each source's sentences in a seeded order, joined with spaces
until a drawn length of 40-200 words is reached (5,236 texts of 127 words on average from the 60,000).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import SHARED_DATA  # noqa: E402


def column(path: Path, name: str) -> list[str]:
    lines = path.read_text(encoding="utf-8").split("\n")
    at = lines[0].split("\t").index(name)
    return [row.split("\t")[at] for row in lines[1:] if row.strip()]


def first_sentence(text: str) -> str:
    cut = text.find(". ")
    return text if cut < 0 else text[: cut + 1]


def sources() -> dict[str, list[str]]:
    snli = SHARED_DATA / "pairs" / "snli_devtest" / "original"
    stsb = SHARED_DATA / "stsb" / "train.tsv"
    scifact = SHARED_DATA / "retrieval" / "scifact" / "corpus.jsonl"
    return {
        "captions": column(SHARED_DATA / "pairs" / "coco_captions" / "captions_val2017.tsv", "caption"),
        "nli": [s for f in ("s1.dev", "s2.dev", "s1.test", "s2.test") for s in
                (snli / f).read_text(encoding="utf-8").split("\n")],
        "sst2": column(SHARED_DATA / "sst2" / "train.tsv", "sentence"),
        "stsb": column(stsb, "sentence1") + column(stsb, "sentence2"),
        "scifact": [first_sentence(json.loads(x)["text"]) for x in scifact.read_text(encoding="utf-8").split("\n")
                    if x.strip()],
    }


def draw(total: int = 60000, seed: int = 0) -> tuple[list[str], dict]:
    """The sentences (shuffled) and how many each source gave: each source's distinct sentences shuffled and cut to
    its share of `total`, the smallest source first (the rest share what it leaves)."""
    rng = random.Random(seed)
    pools = {}
    for name, texts in sources().items():
        distinct = list(dict.fromkeys(t.strip() for t in texts if t.strip()))
        rng.shuffle(distinct)
        pools[name] = distinct
    taken, left = {}, total
    for name in sorted(pools, key=lambda n: len(pools[n])):  # the smallest first; the rest share what it leaves
        share = left // (len(pools) - len(taken))
        taken[name] = pools[name][:share]
        left -= len(taken[name])
    out = [t for texts in taken.values() for t in texts]
    rng.shuffle(out)
    return out, {k: len(v) for k, v in taken.items()}


def packed(sentences: list[str], seed: int = 0) -> list[str]:
    """`sentences` packed into longer texts, never mixing sources: per source (by name), its sentences shuffled,
    then joined until each text holds at least a drawn 40-200 words; the texts shuffled together."""
    source = {}
    for name, texts in sources().items():
        for t in texts:
            source.setdefault(t.strip(), name)
    by = {}
    for t in sentences:
        by.setdefault(source.get(t.strip(), "?"), []).append(t)
    rng, out = random.Random(seed), []
    for name in sorted(by):
        pool = list(by[name])
        rng.shuffle(pool)
        text, words, target = [], 0, rng.randint(40, 200)
        for t in pool:
            text.append(t.strip())
            words += len(t.split())
            if words >= target:
                out.append(" ".join(text))
                text, words, target = [], 0, rng.randint(40, 200)
    rng.shuffle(out)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--total", type=int, default=60000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--packed", action="store_true", help="append the sentences packed into texts of 40-200 words")
    args = ap.parse_args()
    out, per_source = draw(args.total, args.seed)
    if args.packed:
        out += packed(out, args.seed)
    Path(args.out).write_text("\n".join(out) + "\n", encoding="utf-8")
    print(json.dumps({"sentences": len(out), "per_source": per_source}))


if __name__ == "__main__":
    main()

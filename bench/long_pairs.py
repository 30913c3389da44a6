"""Long pairs and long /search queries: the seconds spent reading text the model or the limit never needs.

    python bench/long_pairs.py

Four cases, each timed in this one process, interleaved (medians of 3, fresh texts each time): as the tree reads them now, and
as it read them before (every text tokenized whole: the tokenizer's `head` made the identity):

- `encode(question, passage, max_length=256)`, a pair cut longest first (what /predict and /rerank run, and
  fine-tuning a cross-encoder), the passage 400 KB of unique words;
- the same pair the other way round, and two texts of 200 KB and 201 KB (both cut to halves of an odd
  budget, where the longer one must be found: read to the shorter one's end);
- /search's count of a 4 MB lexical query against --max-request-tokens 16,384 (`bertkit.serve.app.whole_tokens`).
Every word is made unique by a number, so no word cache helps.
"""

import os
import platform
import random
import time

from bertkit.serve.app import whole_tokens
from bertkit.text.tokenizer import Tokenizer


def text(rng: random.Random, chars: int) -> str:
    words = ["protein", "folding", "cell", "naïve", "漢字", "signalling", "lymphocytes", "the", "of"]
    out, n = [], 0
    while n < chars:
        out.append(rng.choice(words) + str(rng.randint(0, 99999)))
        n += len(out[-1]) + 1
    return " ".join(out)


def timed(run, tok, texts: list, whole: bool):
    """(seconds, result) of one run; whole: as before, every text read whole (`head` the identity)."""
    if whole:
        tok.head = lambda t, n: t
    try:
        start = time.perf_counter()
        result = run(*texts)
        return time.perf_counter() - start, result
    finally:
        if whole:
            del tok.head


def main() -> None:
    rng = random.Random(0)
    tok = Tokenizer.from_pretrained()
    question = "what does a folded protein do ?"
    cases = [("question + 400 KB passage", lambda: [question, text(rng, 400_000)],
              lambda a, b: tok.encode(a, b, max_length=256).input_ids),
             ("400 KB passage + question", lambda: [text(rng, 400_000), question],
              lambda a, b: tok.encode(a, b, max_length=256).input_ids),
             ("200 KB + 201 KB (halves, odd budget)", lambda: [text(rng, 200_000), text(rng, 201_000)],
              lambda a, b: tok.encode(a, b, max_length=256).input_ids),
             ("/search count, 4 MB query, limit 16,384", lambda: [text(rng, 4_000_000)],
              lambda q: whole_tokens(tok, [q], 16384)[0] > 16384)]
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    for name, make, run in cases:
        now, before = [], []
        for _ in range(3):  # interleaved, each timing on texts no cache has seen
            now.append(timed(run, tok, make(), whole=False)[0])
            before.append(timed(run, tok, make(), whole=True)[0])
        texts = make()
        assert timed(run, tok, texts, False)[1] == timed(run, tok, texts, True)[1], name  # the same ids, or refusal
        now, before = sorted(now)[1], sorted(before)[1]
        print(f"{name}: {before:.3f} s before, {now:.4f} s now (medians of 3; {before / now:.0f}x)")
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

"""The feature-based NER experiment of the BERT paper (Table 7), at our scale.

Devlin et al. 2019, section 5.3: instead of fine-tuning, take the activations
of a frozen BERT for each CoNLL-2003 word (its first word piece) and train a
small tagger on them, once per layer strategy. The paper (BERT-Base, a 2-layer
768-dim BiLSTM, document context) reports dev F1:

    first (embeddings) 91.0, last 94.9, sum_all 95.5, second_to_last 95.6,
    sum_last_four 95.9, concat_last_four 96.1.

Here: the default model (all-MiniLM-L6-v2: 6 layers, hidden 384), each sentence
on its own (no document context), the hidden states of all L+1 layers computed
once by `bertkit.embeddings.features.embed` and reused for every strategy, the same small
tagger for each (a 2-layer MLP per word over standardised features, fixed
seed; the BiLSTM of the paper was too slow for this shared 2-core machine),
trained on a subset of the training sentences, scored on the full dev set with
conlleval's entity-level F1 (bertkit.metrics.tasks). Tags are converted to
IOB2 for training; chunks are the same either way.

    python bench/feature_ner.py                 # print the table
    python bench/feature_ner.py --write         # also put it into docs/features.md
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import ROOT, SHARED_DATA, load_line, machine_line  # noqa: E402

from bertkit.embeddings.features import embed, load_encoder  # noqa: E402
from bertkit.embeddings.pooling import combine_layers  # noqa: E402
from bertkit.embeddings.settings import PAPER_NER_F1, STRATEGIES, resolve_layers  # noqa: E402
from bertkit.data.tables import read_conll  # noqa: E402
from bertkit.metrics.tasks import entity_scores, iob1_to_iob2  # noqa: E402

DOC = ROOT / "docs" / "features.md"


def all_layer_features(sentences, model, batch_size: int) -> list:
    """Per sentence an array [W, L+1, H] float16: every layer's vector of each word's first piece."""
    net = model.model
    L, H = net.config.num_hidden_layers, net.config.hidden_size
    words = [s.words for s in sentences]
    rows = embed(words, model, layers=list(range(L + 1)), combine="concat", pooling="words",
                 word_pooling="first", batch_size=batch_size, progress=True)
    return [r.reshape(len(r), L + 1, H).astype(np.float16) for r in rows]


def strategy_features(per_layer: list, name: str, num_layers: int) -> list:
    """Apply a layer strategy to the stored layers: [W, L+1, H] -> [W, D] float32."""
    spec = resolve_layers(name, num_layers)
    out = []
    for x in per_layer:
        states = torch.from_numpy(x.astype(np.float32)).unbind(dim=1)  # L+1 x [W, H]
        out.append(combine_layers([s[None] for s in states], spec)[0].numpy())
    return out


class Tagger(nn.Module):
    """The small tagger on top of frozen features: one word at a time, a 2-layer MLP.

    The context comes from the frozen encoder alone, so the comparison is of
    the features themselves. (The paper's 2-layer BiLSTM was tried first: on this
    shared 2-core machine it took minutes per strategy and epoch.)
    """

    def __init__(self, dim: int, num_tags: int, hidden: int = 256, dropout: float = 0.2):
        super().__init__()
        self.net = nn.Sequential(
            nn.Dropout(dropout), nn.Linear(dim, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, num_tags)
        )

    def forward(self, x):  # x [W, D] -> logits [W, num_tags]
        return self.net(x)


def standardize(train: np.ndarray, dev: np.ndarray) -> tuple:
    """z-scores with the training words' mean and spread, per dimension (the layers' scales differ)."""
    mean, std = train.mean(0), train.std(0) + 1e-6
    return (train - mean) / std, (dev - mean) / std


def train_and_score(train_x, train_y, dev_x, dev_tags, tag_names, epochs: int, seed: int) -> float:
    """Train on the words of train_x (a list of [W_i, D]) and return the dev entity F1 in percent."""
    # small matrices: one thread is faster, and far faster when other jobs share the cores
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train_and_score(train_x, train_y, dev_x, dev_tags, tag_names, epochs, seed)
    finally:
        torch.set_num_threads(threads)


def _train_and_score(train_x, train_y, dev_x, dev_tags, tag_names, epochs: int, seed: int) -> float:
    torch.manual_seed(seed)  # nn.Linear initialises from the global generator
    gen = torch.Generator().manual_seed(seed)
    x, xd = standardize(np.concatenate(train_x), np.concatenate(dev_x))
    x, xd = torch.from_numpy(x.astype(np.float32)), torch.from_numpy(xd.astype(np.float32))
    y = torch.tensor([t for tags in train_y for t in tags])
    model = Tagger(x.shape[1], len(tag_names))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-5)
    for _ in range(epochs):
        model.train()
        for idx in torch.randperm(len(x), generator=gen).split(256):
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        best = model(xd).argmax(-1).tolist()
    preds, k = [], 0
    for tags in dev_tags:
        preds.append([tag_names[t] for t in best[k : k + len(tags)]])
        k += len(tags)
    return 100 * entity_scores(preds, dev_tags)["f1"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train-sentences", type=int, default=4000, help="first N training sentences (default 4000)")
    ap.add_argument("--dev-sentences", type=int, default=None, help="first N dev sentences (default: all 3,250)")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--seeds", default="13,14,15", help="tagger seeds; the table gives the mean and the range")
    ap.add_argument("--batch-size", type=int, default=64, help="sentences per forward pass of the encoder")
    ap.add_argument("--model", help="a model directory (default: the embedded model)")
    ap.add_argument("--cache", help="an .npz file to keep the extracted features in between runs")
    ap.add_argument("--write", action="store_true", help="write the table into docs/features.md")
    args = ap.parse_args(argv)

    data = SHARED_DATA / "conll2003"
    train, _ = read_conll(data / "train.txt", max_sentences=args.train_sentences)
    dev, _ = read_conll(data / "dev.txt", max_sentences=args.dev_sentences)
    model = load_encoder(args.model)
    num_layers = model.model.config.num_hidden_layers
    t0 = time.perf_counter()
    cache = Path(args.cache) if args.cache else None
    from_cache = cache is not None and cache.is_file()
    if from_cache:
        with np.load(cache) as stored:
            train_layers = np.split(stored["train"], stored["train_splits"])
            dev_layers = np.split(stored["dev"], stored["dev_splits"])
        assert len(train_layers) == len(train) and len(dev_layers) == len(dev), "stale --cache: delete it"
    else:
        train_layers = all_layer_features(train, model, args.batch_size)
        dev_layers = all_layer_features(dev, model, args.batch_size)
        if cache is not None:
            np.savez(cache, train=np.concatenate(train_layers), dev=np.concatenate(dev_layers),
                     train_splits=np.cumsum([len(x) for x in train_layers])[:-1],
                     dev_splits=np.cumsum([len(x) for x in dev_layers])[:-1])
    extract_s = time.perf_counter() - t0

    train_tags = [iob1_to_iob2(s.tags) for s in train]
    dev_tags = [iob1_to_iob2(s.tags) for s in dev]
    tag_names = sorted({t for tags in train_tags + dev_tags for t in tags})
    tag_id = {t: i for i, t in enumerate(tag_names)}
    train_y = [[tag_id[t] for t in tags] for tags in train_tags]

    seeds = [int(x) for x in args.seeds.split(",")]
    scores = {}
    for name in STRATEGIES:
        t1 = time.perf_counter()
        train_x = strategy_features(train_layers, name, num_layers)
        dev_x = strategy_features(dev_layers, name, num_layers)
        scores[name] = [train_and_score(train_x, train_y, dev_x, dev_tags, tag_names, args.epochs, seed)
                        for seed in seeds]
        print(f"{name:18s} dev F1 {np.mean(scores[name]):5.1f} {scores[name]} ({time.perf_counter() - t1:.0f} s)",
              file=sys.stderr)
    results = {name: float(np.mean(f1s)) for name, f1s in scores.items()}

    shown = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--write"]
    if "--cache" in shown:  # a local file: not part of what produced the numbers
        k = shown.index("--cache")
        del shown[k : k + 2]
    command = " ".join(["python bench/feature_ner.py", *shown])
    n_words = sum(len(s.words) for s in train)
    rank = {name: k + 1 for k, name in enumerate(sorted(results, key=results.get, reverse=True))}
    lines = [
        f"| layer strategy | paper: BERT-Base dev F1 | ours: all-MiniLM-L6-v2 dev F1 (mean of {len(seeds)} seeds) "
        "| our range (min-max) | our rank | paper rank |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    paper_rank = {name: k + 1 for k, name in enumerate(sorted(PAPER_NER_F1, key=PAPER_NER_F1.get, reverse=True))}
    for name in STRATEGIES:
        lines.append(
            f"| `{name}` | {PAPER_NER_F1[name]:.1f} | {results[name]:.1f} | "
            f"{min(scores[name]):.1f}-{max(scores[name]):.1f} | {rank[name]} | {paper_rank[name]} |"
        )
    table = "\n".join(lines)
    setup = (
        f"Command: `{command}`  \n"
        f"Training: the first {len(train):,} CoNLL-2003 training sentences ({n_words:,} words); "
        f"scored on {len(dev):,} dev sentences; {args.epochs} epochs, tagger seeds {args.seeds}; "
        f"feature extraction ({str(model.dtype).removeprefix('torch.')}) took {extract_s:.0f} s"
        f"{' (read from the cache)' if from_cache else ''}.  \n"
        f"Machine: {machine_line()}; {load_line()}"
    )
    print(table)
    print()
    print(setup)
    if args.write:
        write_doc_section("ner-table", table + "\n\n" + setup)
        print(f"wrote the table into {DOC.relative_to(ROOT)}", file=sys.stderr)
    return 0


def write_doc_section(name: str, markdown: str) -> None:
    """Replace the `<!-- NAME -->` ... `<!-- /NAME -->` block of docs/features.md."""
    start, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    text = DOC.read_text()
    if start not in text or end not in text:
        raise SystemExit(f"{DOC} has no {start} ... {end} block to fill")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    DOC.write_text(head + start + "\n" + markdown.rstrip() + "\n" + end + tail)


if __name__ == "__main__":
    sys.exit(main())

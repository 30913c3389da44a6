"""What int8 costs in accuracy on real data (issue 19): float32 against int8 on the same model.

- STS-B dev: Spearman correlation of the cosine between the default model's mean-pooled
  sentence vectors and the gold scores (no training), `bertkit.embed(..., int8=)`.
- SST-2 dev accuracy of a classifier fine-tuned on the first --train-examples rows of
  SST-2 train (float32 training), scored by `predict_file(..., int8=)`.
- CoNLL-2003 dev entity F1 of a tagger fine-tuned the same way on the first sentences of
  CoNLL-2003 train.

Each fine-tuned model is trained once, in float32, then scored twice: the difference is
the quantization alone. Goal (issue 19): at most 0.005 Spearman and 0.5 points of
accuracy/F1 lost.

    python bench/int8_accuracy.py                       # all three, ~10 min on 2 cores
    python bench/int8_accuracy.py --tasks stsb          # the cheap one
    python bench/int8_accuracy.py --train-examples 200 --epochs 0.2 --dev-examples 100   # smoke run

Prints the machine, the load average before and after, and a markdown table.
"""

import argparse
import csv
import os
import sys
import tempfile
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from harness import SHARED_DATA, machine_line  # noqa: E402


def spearman(x, y) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(x, y).correlation)


def stsb(limit: int | None) -> dict:
    import bertkit

    with open(SHARED_DATA / "stsb" / "dev.tsv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[:limit]
    a, b = [r["sentence1"] for r in rows], [r["sentence2"] for r in rows]
    gold = [float(r["score"]) for r in rows]
    out = {}
    for name, int8 in (("float32", False), ("int8", True)):
        va = bertkit.embed(a, normalize=True, batch_size=64, int8=int8, device="cpu")
        vb = bertkit.embed(b, normalize=True, batch_size=64, int8=int8, device="cpu")
        out[name] = spearman((va * vb).sum(axis=1), gold)
    return {"metric": f"STS-B dev Spearman ({len(rows)} pairs, cosine, no training)", **out, "scale": 1.0}


def _slice(src: Path, dst: Path, n: int | None) -> Path:
    """The header and the first n rows of a TSV file (all when n is None)."""
    lines = src.read_text(encoding="utf-8").splitlines(keepends=True)
    dst.write_text("".join(lines[: None if n is None else n + 1]), encoding="utf-8")
    return dst


def _conll_slice(src: Path, dst: Path, n: int | None) -> Path:
    """The first n sentences of a CoNLL file (sentences end at a blank line)."""
    if n is None:
        dst.write_text(src.read_text(encoding="utf-8"), encoding="utf-8")
        return dst
    kept, count = [], 0
    for line in src.read_text(encoding="utf-8").splitlines(keepends=True):
        kept.append(line)
        if not line.strip():
            count += 1
            if count >= n:
                break
    dst.write_text("".join(kept), encoding="utf-8")
    return dst


def _training(args):
    from bertkit.finetune.trainer import TrainConfig
    from bertkit.training.optim import OptimConfig

    return TrainConfig(epochs=args.epochs, batch_size=32, seed=0, progress=False,
                       optim=OptimConfig(learning_rate=args.learning_rate, warmup_ratio=0.1))


def _score(model_dir: Path, dev: Path, key: str, work: Path) -> dict:
    from bertkit.finetune.predict import predict_file

    out = {}
    for name, int8 in (("float32", False), ("int8", True)):
        result = predict_file(model_dir, dev, work / f"{name}.tsv", evaluate=True, device="cpu", int8=int8)
        out[name] = result.metrics[key]
    return out


def sst2(args, work: Path) -> dict:
    from bertkit.finetune.classification import TextTaskConfig, finetune_text

    train = _slice(SHARED_DATA / "sst2" / "train.tsv", work / "sst2_train.tsv", args.train_examples)
    dev = _slice(SHARED_DATA / "sst2" / "dev.tsv", work / "sst2_dev.tsv", args.dev_examples)
    cfg = TextTaskConfig(train=str(train), output=str(work / "sst2"), max_length=args.max_length,
                         training=_training(args))
    finetune_text(cfg, log=lambda s: None)
    return {"metric": f"SST-2 dev accuracy (fine-tuned on {args.train_examples} rows, {args.epochs:g} epochs)",
            **_score(work / "sst2", dev, "accuracy", work), "scale": 100.0}


def conll(args, work: Path) -> dict:
    from bertkit.finetune.ner import NerConfig, finetune_ner

    train = _conll_slice(SHARED_DATA / "conll2003" / "train.txt", work / "conll_train.txt", args.train_examples)
    dev = _conll_slice(SHARED_DATA / "conll2003" / "dev.txt", work / "conll_dev.txt", args.dev_examples)
    training = _training(args)
    training.metric = "f1"
    cfg = NerConfig(train=str(train), output=str(work / "conll"), tag_scheme="iob1", max_length=args.max_length,
                    stride=16, training=training)
    finetune_ner(cfg, log=lambda s: None)
    return {"metric": f"CoNLL-2003 dev entity F1 (fine-tuned on {args.train_examples} sentences, "
                      f"{args.epochs:g} epochs)", **_score(work / "conll", dev, "f1", work), "scale": 100.0}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", nargs="+", default=["stsb", "sst2", "conll"], choices=["stsb", "sst2", "conll"])
    p.add_argument("--train-examples", type=int, default=2000)
    p.add_argument("--dev-examples", type=int, default=None, help="default: the whole dev set")
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--learning-rate", type=float, default=5e-5)
    p.add_argument("--max-length", type=int, default=64)
    args = p.parse_args(argv)

    from bertkit.devices import cpu_features

    print(machine_line("onnxruntime"))
    print(cpu_features().describe())
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for task in args.tasks:
            start = time.perf_counter()
            row = {"stsb": lambda: stsb(args.dev_examples), "sst2": lambda: sst2(args, Path(tmp)),
                   "conll": lambda: conll(args, Path(tmp))}[task]()
            row["seconds"] = time.perf_counter() - start
            rows.append(row)
            print(f"  {task}: float32 {row['float32']:.4f}, int8 {row['int8']:.4f} ({row['seconds']:.0f} s)", flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    print("| measure | float32 | int8 | int8 - float32 |")
    print("| --- | ---: | ---: | ---: |")
    for r in rows:
        s = r["scale"]
        digits = 4 if s == 1.0 else 2
        print(f"| {r['metric']} | {r['float32'] * s:.{digits}f} | {r['int8'] * s:.{digits}f} | "
              f"{(r['int8'] - r['float32']) * s:+.{digits}f} |")


if __name__ == "__main__":
    main()

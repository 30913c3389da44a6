"""What bfloat16 and int8 cost in accuracy on real data (issues 19, 26): float32 against both, same model.

- STS-B dev: Spearman correlation of the cosine between the default model's mean-pooled
  sentence vectors and the gold scores (no training), `bertkit.embed(..., dtype=, int8=)`.
- SST-2 dev accuracy of a classifier fine-tuned on the first --train-examples rows of
  SST-2 train (float32 training), scored by `predict_file(..., dtype=, int8=)`.
- CoNLL-2003 dev entity F1 of a tagger fine-tuned the same way on the first sentences of
  CoNLL-2003 train.
- SQuAD v1.1 exact match and F1 of an extractive QA model fine-tuned on the first
  --train-examples questions of articles 0-39 of the dev file (the only SQuAD file here:
  no train set), scored on the first --dev-examples questions of articles 40-47.

Each fine-tuned model is trained once, in float32, then scored three times: float32,
bfloat16 (`dtype="bfloat16"`, the whole model cast) and int8 (`int8=True`, float32
activations): the differences are the precision alone. Goal (issue 19): at most 0.005
Spearman and 0.5 points of accuracy/F1 lost.

    python bench/int8_accuracy.py                       # stsb, sst2, conll: ~10 min on 2 cores
    python bench/int8_accuracy.py --tasks stsb          # the cheap one
    python bench/int8_accuracy.py --tasks squad --train-examples 2000 --epochs 1 --dev-examples 500
    python bench/int8_accuracy.py --train-examples 200 --epochs 0.2 --dev-examples 100   # smoke run

--max-length defaults to 64 for the sentence tasks and 256 for SQuAD (window overlap: a
quarter of the window). bfloat16 is emulated (slow, same numbers) where the CPU has no
native bf16. Prints the machine, the load average before and after, and a markdown table.
"""

import argparse
import csv
import json
import os
import sys
import tempfile
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from harness import SHARED_DATA, machine_line  # noqa: E402

from bertkit.errors import BertkitError  # noqa: E402

# how each precision is asked for, the same keywords for bertkit.embed and predict_file
PRECISIONS = {"float32": {"dtype": "float32"}, "bfloat16": {"dtype": "bfloat16"}, "int8": {"int8": True}}
SQUAD = SHARED_DATA / "squad_v1.1" / "dev-v1.1.json"
SQUAD_TRAIN_ARTICLES, SQUAD_DEV_ARTICLES = "0:40", "40:48"


def spearman(x, y) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(x, y).correlation)


def stsb(args, work: Path) -> list[dict]:
    import bertkit

    with open(SHARED_DATA / "stsb" / "dev.tsv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[:args.dev_examples]
    a, b = [r["sentence1"] for r in rows], [r["sentence2"] for r in rows]
    gold = [float(r["score"]) for r in rows]
    out = {}
    for name, how in PRECISIONS.items():
        va = bertkit.embed(a, normalize=True, batch_size=64, device="cpu", **how)
        vb = bertkit.embed(b, normalize=True, batch_size=64, device="cpu", **how)
        out[name] = spearman((va * vb).sum(axis=1), gold)
    return [{"metric": f"STS-B dev Spearman ({len(rows)} pairs, cosine, no training)", **out,
             "scale": 1.0, "digits": 4}]


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


def _squad_slice(src: Path, dst: Path, articles: str, n: int | None) -> tuple[Path, int]:
    """SQuAD JSON holding the first n questions (all when None) of a START:END slice of the articles."""
    start, end = (int(x) for x in articles.split(":"))
    data, kept = json.loads(src.read_text(encoding="utf-8"))["data"][start:end], 0
    for article in data:
        for para in article["paragraphs"]:
            para["qas"] = para["qas"][: None if n is None else max(0, n - kept)]
            kept += len(para["qas"])
        article["paragraphs"] = [p for p in article["paragraphs"] if p["qas"]]
    dst.write_text(json.dumps({"version": "1.1", "data": [a for a in data if a["paragraphs"]]}), encoding="utf-8")
    return dst, kept


def _training(args):
    from bertkit.tasks.config import TrainConfig
    from bertkit.training.optim import OptimConfig

    return TrainConfig(epochs=args.epochs, batch_size=32, seed=0, progress=False,
                       optim=OptimConfig(learning_rate=args.learning_rate, warmup_ratio=0.1))


def _score(model_dir: Path, dev: Path, work: Path) -> dict:
    """{precision: the task's metrics dict} of the same fine-tuned model on `dev`."""
    from bertkit.tasks.predict import predict_file

    return {name: predict_file(model_dir, dev, work / f"{name}.tsv", evaluate=True, device="cpu", **how).metrics
            for name, how in PRECISIONS.items()}


def _rows(scores: dict, metrics: dict, scale: float) -> list[dict]:
    """One table row per (metric key, label) in `metrics`, the three precisions side by side, in percent."""
    return [{"metric": label, **{p: scores[p][key] for p in PRECISIONS}, "scale": scale, "digits": 2}
            for key, label in metrics.items()]


def sst2(args, work: Path) -> list[dict]:
    from bertkit.tasks.classification import TextTaskConfig, finetune_text

    train = _slice(SHARED_DATA / "sst2" / "train.tsv", work / "sst2_train.tsv", args.train_examples)
    dev = _slice(SHARED_DATA / "sst2" / "dev.tsv", work / "sst2_dev.tsv", args.dev_examples)
    cfg = TextTaskConfig(train=str(train), output=str(work / "sst2"), max_length=args.max_length or 64,
                         training=_training(args))
    finetune_text(cfg, log=lambda s: None)
    what = f"SST-2 dev accuracy (fine-tuned on {args.train_examples} rows, {args.epochs:g} epochs)"
    return _rows(_score(work / "sst2", dev, work), {"accuracy": what}, 100.0)


def conll(args, work: Path) -> list[dict]:
    from bertkit.tasks.ner import NerConfig, finetune_ner

    train = _conll_slice(SHARED_DATA / "conll2003" / "train.txt", work / "conll_train.txt", args.train_examples)
    dev = _conll_slice(SHARED_DATA / "conll2003" / "dev.txt", work / "conll_dev.txt", args.dev_examples)
    training = _training(args)
    training.metric = "f1"
    cfg = NerConfig(train=str(train), output=str(work / "conll"), tag_scheme="iob1", max_length=args.max_length or 64,
                    stride=16, training=training)
    finetune_ner(cfg, log=lambda s: None)
    what = f"CoNLL-2003 dev entity F1 (fine-tuned on {args.train_examples} sentences, {args.epochs:g} epochs)"
    return _rows(_score(work / "conll", dev, work), {"f1": what}, 100.0)


def squad(args, work: Path) -> list[dict]:
    from bertkit.tasks.config import QAConfig
    from bertkit.tasks.qa import finetune_qa

    max_length = args.max_length or 256
    dev, n_dev = _squad_slice(SQUAD, work / "squad_dev.json", SQUAD_DEV_ARTICLES, args.dev_examples)
    cfg = QAConfig(train=str(SQUAD), train_articles=SQUAD_TRAIN_ARTICLES, max_train_examples=args.train_examples,
                   output=str(work / "squad"), max_length=max_length, doc_stride=max_length // 4,
                   training=_training(args))
    finetune_qa(cfg, log=lambda s: None)
    what = (f"SQuAD v1.1 {{}} ({n_dev} questions of articles 40-47; fine-tuned on {args.train_examples} of "
            f"articles 0-39, {args.epochs:g} epochs, max_length {max_length})")
    return _rows(_score(work / "squad", dev, work),
                 {"exact_match": what.format("exact match"), "f1": what.format("F1")}, 1.0)


TASKS = {"stsb": stsb, "sst2": sst2, "conll": conll, "squad": squad}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", nargs="+", default=["stsb", "sst2", "conll"], choices=list(TASKS))
    p.add_argument("--train-examples", type=int, default=2000)
    p.add_argument("--dev-examples", type=int, default=None, help="default: the whole dev set")
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--learning-rate", type=float, default=5e-5)
    p.add_argument("--max-length", type=int, default=None, help="default: 64, SQuAD 256")
    args = p.parse_args(argv)

    from bertkit.runtime.devices import cpu_features

    print(machine_line("onnxruntime"))
    print(cpu_features().describe())
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for task in args.tasks:
            start = time.perf_counter()
            work = Path(tmp) / task
            work.mkdir()
            try:
                done = TASKS[task](args, work)
            except BertkitError as e:  # settings the task refuses (a --max-length too short, a label only dev has)
                sys.exit(f"int8_accuracy.py --tasks {task}: {e} "
                         "(this script sets it from --train-examples, --dev-examples, --max-length)")
            for row in done:
                print(f"  {row['metric']}: " + ", ".join(f"{p} {row[p]:.4f}" for p in PRECISIONS), flush=True)
            print(f"  {task}: {time.perf_counter() - start:.0f} s, load {os.getloadavg()[0]:.2f}", flush=True)
            rows += done
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    print("| measure | float32 | bfloat16 | int8 | bf16 - float32 | int8 - float32 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        s, digits = r["scale"], r["digits"]
        print(f"| {r['metric']} | {r['float32'] * s:.{digits}f} | {r['bfloat16'] * s:.{digits}f} | "
              f"{r['int8'] * s:.{digits}f} | {(r['bfloat16'] - r['float32']) * s:+.{digits}f} | "
              f"{(r['int8'] - r['float32']) * s:+.{digits}f} |")


if __name__ == "__main__":
    main()

"""Transfer learning shown: fine-tune a pre-trained model and the same architecture from random init on SST-2.

Both models go through bertkit's fine-tuning loop (`bertkit.finetune.finetune`)
with the same training subset (the first N rows of SST-2 train), the same
hyper-parameters, seeds and budget, and are scored on the full SST-2 dev set (872
sentences) after the last epoch (no picking the best epoch on dev). The
random-init model is the pre-trained model's config.json and vocabulary with
freshly drawn weights (a new draw per seed), so the only difference is
pre-training. It is drawn at the standard deviation the pre-training run
started from (the config's `initializer_range`) and at BERT's 0.02 when that
differs, and the better of the two counts. Each model is run at every learning
rate of a small grid and every seed, so neither side is judged at a learning
rate (or initial scale) that suits only the other.

    python bench/transfer_sst2.py --pretrained runs/l4h256 --out runs/transfer \
        --train-examples 4000 --epochs 4 --learning-rates 1e-4 3e-4 --seeds 1 2 3

prints a markdown table and writes OUT/transfer.json and OUT/transfer.png
(dev accuracy per epoch of each model at its best learning rate, mean over the
seeds); `--docs` also copies the PNG to docs/pretraining_transfer.png. With
`--pooling mean` both models' classifier reads the mean of the token vectors
instead of the pooled [CLS] vector (what an MLM-only model's tokens carry; see
docs/pretraining.md).
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from harness import SHARED_DATA, machine_line  # noqa: E402


def model_copy(pretrained: Path, out: Path, dropout: float, seed: int | None, std: float | None = None) -> Path:
    """The pre-trained model (seed None) or its architecture and vocabulary with fresh random
    weights (N(0, std), drawn from `seed`), with the fine-tuning dropout in config.json.
    A pre-training run may have used dropout 0 (cheaper learning when under-trained); both
    fine-tuning runs get the same `dropout`."""
    import torch

    from bertkit.config import BertConfig
    from bertkit.heads import BertForMaskedLM, BertForPreTraining
    from bertkit.modeling import BertModel
    from bertkit.tokenizer import Tokenizer

    saved = BertConfig.from_json_file(pretrained / "config.json")
    config = saved.replace(
        architectures=None, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    if std is not None:
        config = config.replace(initializer_range=std)
    if seed is None:
        # an MLM-only run (objective none, or continued with --init-from on MLM data) has no NSP
        # head; a bare encoder (the default model) has no pre-training heads at all
        cls = {"BertForMaskedLM": BertForMaskedLM, "BertModel": BertModel}.get((saved.architectures or [""])[0],
                                                                               BertForPreTraining)
        model = cls.from_pretrained(pretrained, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    else:
        model = BertForPreTraining(config, generator=torch.Generator().manual_seed(seed))
    model.save_pretrained(out, tokenizer=Tokenizer.from_pretrained(pretrained))
    return out


def finetune_once(model_dir: Path, out: Path, args, learning_rate: float, seed: int) -> dict:
    from bertkit.finetune import finetune
    from bertkit.finetune.trainer import TrainConfig

    training = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, seed=seed, progress=not args.quiet)
    training.optim.learning_rate = learning_rate
    sst2 = SHARED_DATA / "sst2"
    return finetune("classify", train=str(sst2 / "train.tsv"), dev=str(sst2 / "dev.tsv"), output=str(out),
                    model=str(model_dir), max_length=args.max_length, max_train_examples=args.train_examples,
                    pooling=args.pooling,
                    training=training, log=lambda *a: None)


def plot(curves: dict, png: Path) -> None:
    """Dev accuracy per epoch: one line per model (its best learning rate), mean over seeds,
    the seeds' spread shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, (lr, runs) in curves.items():
        acc = np.array([[e["accuracy"] for e in r["epochs"]] for r in runs])
        epochs = [e["epoch"] for e in runs[0]["epochs"]]
        ax.plot(epochs, acc.mean(0), "o-", label=f"{name} (lr {lr:g}, mean of {len(runs)} seeds)")
        ax.fill_between(epochs, acc.min(0), acc.max(0), alpha=0.2)
    ax.axhline(444 / 872, color="grey", linestyle="--", label="majority class")
    ax.set_xlabel("epoch")
    ax.set_ylabel("SST-2 dev accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pretrained", required=True, type=Path, help="output directory of `bertkit pretrain run`")
    p.add_argument("--out", required=True, type=Path, help="where the fine-tuning runs go")
    p.add_argument("--train-examples", type=int, default=4000, help="the first N rows of SST-2 train")
    p.add_argument("--epochs", type=float, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--learning-rates", type=float, nargs="+", default=[1e-4, 3e-4],
                   help="each model is fine-tuned with each; the table shows all, the plot each model's best")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="fine-tuning seeds (and random-init draws)")
    p.add_argument("--dropout", type=float, default=0.1, help="dropout while fine-tuning, both models")
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--pooling", choices=["cls", "mean"], default="cls",
                   help="what the classifier reads, both models: the pooled [CLS] vector or the mean of the tokens")
    p.add_argument("--random-stds", type=float, nargs="+",
                   help="initial scales of the random-init models (default: the config's initializer_range and 0.02)")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--docs", action="store_true", help="copy the PNG to docs/pretraining_transfer.png")
    args = p.parse_args(argv)

    import numpy as np

    from bertkit.config import BertConfig

    args.out.mkdir(parents=True, exist_ok=True)
    start_std = BertConfig.from_json_file(args.pretrained / "config.json").initializer_range
    stds = sorted(set(args.random_stds or (start_std, 0.02)))
    randoms = {std: f"random init N(0, {std:g})" for std in stds}
    runs = {"pre-trained": {}, **{name: {} for name in randoms.values()}}  # name -> lr -> [result per seed]
    pretrained = model_copy(args.pretrained, args.out / "pretrained_model", args.dropout, None)  # one copy, every seed
    for seed in args.seeds:
        models = {"pre-trained": pretrained}
        for std, name in randoms.items():
            models[name] = model_copy(args.pretrained, args.out / f"random_init_std{std:g}_model_{seed}",
                                      args.dropout, seed, std)
        for lr in args.learning_rates:
            for name, model_dir in models.items():
                print(f"fine-tuning {name}, lr {lr:g}, seed {seed}", file=sys.stderr)
                out = args.out / f"{name.replace(' ', '_').replace(',', '')}_lr{lr:g}_seed{seed}"
                runs[name].setdefault(lr, []).append(finetune_once(model_dir, out, args, lr, seed))

    def final(r):
        return r["epochs"][-1]["accuracy"]

    summary = {name: {str(lr): {"final_dev_accuracy": [final(r) for r in rs],
                                "epochs": [[{k: e[k] for k in ("epoch", "step", "train_loss", "accuracy")}
                                            for e in r["epochs"]] for r in rs]}
                      for lr, rs in by_lr.items()} for name, by_lr in runs.items()}
    (args.out / "transfer.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                        "results": summary}, indent=2))

    def mean_final(lr_runs):
        return np.mean([final(r) for r in lr_runs[1]])

    best = {name: max(by_lr.items(), key=mean_final) for name, by_lr in runs.items()}
    best_random = max(randoms.values(), key=lambda name: mean_final(best[name]))
    plot({"pre-trained": best["pre-trained"], best_random: best[best_random]}, args.out / "transfer.png")
    if args.docs:
        shutil.copyfile(args.out / "transfer.png", ROOT / "docs" / "pretraining_transfer.png")

    print(f"machine: {machine_line()}\n")
    print(f"SST-2: first {args.train_examples} training rows, full dev set (872); {args.epochs:g} epochs, "
          f"batch {args.batch_size}, max_length {args.max_length}, dropout {args.dropout:g}, classifier on {args.pooling}, "
          f"seeds {args.seeds}\n")
    print("| model | learning rate | dev accuracy after the last epoch, mean (min-max) | per seed |")
    print("| --- | ---: | ---: | --- |")
    for name, by_lr in runs.items():
        for lr, rs in by_lr.items():
            acc = [final(r) for r in rs]
            print(f"| {name} | {lr:g} | {np.mean(acc):.4f} ({min(acc):.4f}-{max(acc):.4f}) | "
                  f"{', '.join(f'{a:.4f}' for a in acc)} |")
    lr_p, lr_r = best["pre-trained"][0], best[best_random][0]
    margin = mean_final(best["pre-trained"]) - mean_final(best[best_random])
    print(f"\neach at its best learning rate: pre-trained {mean_final(best['pre-trained']):.4f} (lr {lr_p:g}) vs "
          f"the better {best_random} {mean_final(best[best_random]):.4f} (lr {lr_r:g}): {margin * 100:+.1f} points")
    return 0


if __name__ == "__main__":
    sys.exit(main())

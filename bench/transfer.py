"""Transfer learning shown: fine-tune pre-trained models and the same architecture from random init.

Every model goes through bertkit's fine-tuning loop (`bertkit.tasks.finetune`)
with the same training subset (the first N rows of the task's train file), the
same hyper-parameters, seeds and budget, and is scored on the task's full dev set
after the last epoch (no picking the best epoch on dev). Tasks:

- sst2: SST-2 sentiment, accuracy on the 872 dev sentences;
- stsb: STS-B sentence-pair similarity, a regression on the 0-5 score, Pearson
  correlation on the 1,500 dev pairs.

Several pre-trained models can be compared in one table (`--pretrained NAME=DIR
...`): BERT pre-training outputs (BertForPreTraining, BertForMaskedLM) and ELECTRA
discriminators. All of them are fine-tuned as BERT encoders with the same head
(`BertForSequenceClassification`, the pooled [CLS] vector or with `--pooling mean`
the tokens' mean), so the only difference between the rows is the encoder's
weights: an ELECTRA discriminator whose embedding size equals its hidden size is
a BERT encoder, weight for weight (`electra_as_bert`); its replaced-token head is
left behind, as BERT's MLM head is.

The random-init model is the first pre-trained model's architecture and
vocabulary with freshly drawn weights (a new draw per seed), so the only
difference is pre-training. It is drawn at the standard deviation the
pre-training run started from (the config's `initializer_range`) and at BERT's
0.02 when that differs (or at `--random-stds`), and the better counts. Each
model is run at every learning rate of a small grid and every seed, so no side
is judged at a learning rate (or initial scale) that suits only another.

    python bench/transfer.py --pretrained runs/l4h256 --out runs/transfer \\
        --train-examples 4000 --epochs 4 --learning-rates 1e-4 3e-4 --seeds 1 2 3
    python bench/transfer.py --task stsb --pretrained electra=runs/electra bert-mlm=runs/mlm \\
        --out runs/transfer_stsb --train-examples 2000 --pooling mean --seeds 1 2 3 4 5

prints a markdown table and writes OUT/transfer.json and OUT/transfer.png (the
dev metric per epoch of each model at its best learning rate, mean over the
seeds, the seeds' spread shaded); `--png` also copies the PNG there (e.g. into
docs/).
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from harness import SHARED_DATA, load_line, machine_line  # noqa: E402

# task -> (bertkit fine-tuning task, data folder, columns, dev metric, its name, the trivial predictor's value)
TASKS = {
    "sst2": ("classify", "sst2", dict(text_column="sentence", label_column="label"), "accuracy",
             "SST-2 dev accuracy", (444 / 872, "majority class")),
    "stsb": ("regression", "stsb", dict(text_column="sentence1", text_pair_column="sentence2", label_column="score"),
             "pearson", "STS-B dev Pearson r", (0.0, "a constant")),
}
SHAPE = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
         "max_position_embeddings", "type_vocab_size")


def electra_as_bert(model_dir: Path, dropout: float):
    """An ELECTRA discriminator as a BertModel (no pooler) with the same weights: with
    embedding_size == hidden_size the two encoders have the same parameters under the same names."""
    from bertkit.model.config import BertConfig
    from bertkit.model.electra import ElectraModel
    from bertkit.model.modeling import BertModel

    electra = ElectraModel.from_pretrained(model_dir, strict=False)  # the replaced-token head is not needed
    values = electra.config.to_dict()
    if values.pop("embedding_size") != electra.config.hidden_size:
        sys.exit(f"{model_dir}: embedding_size differs from hidden_size, so its encoder is not a BERT encoder")
    values.pop("model_type")
    config = BertConfig.from_dict({**values, "architectures": ["BertModel"]}).replace(
        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    bert = BertModel(config, add_pooling_layer=False)
    bert.load_state_dict(electra.state_dict(), strict=True)
    return bert


def model_copy(pretrained: Path, out: Path, dropout: float, seed: int | None, std: float | None = None) -> Path:
    """The pre-trained model (seed None) or its architecture and vocabulary with fresh random
    weights (N(0, std), drawn from `seed`), with the fine-tuning dropout in config.json.
    A pre-training run may have used dropout 0 (cheaper learning when under-trained); all
    fine-tuning runs get the same `dropout`."""
    import torch

    from bertkit.model.config import BertConfig
    from bertkit.model.checkpoint import model_type
    from bertkit.model.heads import BertForMaskedLM, BertForPreTraining
    from bertkit.model.modeling import BertModel
    from bertkit.text.tokenizer import Tokenizer

    if seed is None and model_type(pretrained) == "electra":
        model = electra_as_bert(pretrained, dropout)
    elif seed is None:
        saved = BertConfig.from_json_file(pretrained / "config.json")
        # an MLM-only run (objective none, or continued with --init-from on MLM data) has no NSP
        # head; a bare encoder (the default model) has no pre-training heads at all
        cls = {"BertForMaskedLM": BertForMaskedLM, "BertModel": BertModel}.get((saved.architectures or [""])[0],
                                                                               BertForPreTraining)
        model = cls.from_pretrained(pretrained, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    else:
        config = bert_config(pretrained).replace(
            architectures=None, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
        if std is not None:
            config = config.replace(initializer_range=std)
        model = BertForPreTraining(config, generator=torch.Generator().manual_seed(seed))
    model.save_pretrained(out, tokenizer=Tokenizer.from_pretrained(pretrained))
    return out


def bert_config(model_dir: Path):
    """The BERT encoder config of a BERT or ELECTRA (embedding size = hidden size) directory."""
    from bertkit.model.config import BertConfig

    values = json.loads((model_dir / "config.json").read_text())
    for key in ("model_type", "embedding_size", "summary_type", "summary_use_proj", "summary_activation",
                "summary_last_dropout"):
        values.pop(key, None)
    return BertConfig.from_dict(values)


def finetune_once(model_dir: Path, out: Path, args, learning_rate: float, seed: int) -> dict:
    from bertkit.tasks import finetune
    from bertkit.tasks.config import TrainConfig

    task, folder, columns, _, _, _ = TASKS[args.task]
    training = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, seed=seed, progress=not args.quiet)
    training.optim.learning_rate = learning_rate
    data = SHARED_DATA / folder
    return finetune(task, train=str(data / "train.tsv"), dev=str(data / "dev.tsv"), output=str(out),
                    model=str(model_dir), max_length=args.max_length, max_train_examples=args.train_examples,
                    pooling=args.pooling, training=training, log=lambda *a: None, **columns)


def plot(curves: dict, png: Path, task: str) -> None:
    """The dev metric per epoch: one line per model (its best learning rate), mean over seeds,
    the seeds' spread shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    _, _, _, metric, label, (trivial, trivial_name) = TASKS[task]
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, (lr, runs) in curves.items():
        values = np.array([[e[metric] for e in r["epochs"]] for r in runs])
        epochs = [e["epoch"] for e in runs[0]["epochs"]]
        ax.plot(epochs, values.mean(0), "o-", label=f"{name} (lr {lr:g}, mean of {len(runs)} seeds)")
        ax.fill_between(epochs, values.min(0), values.max(0), alpha=0.2)
    ax.axhline(trivial, color="grey", linestyle="--", label=trivial_name)
    ax.set_xlabel("epoch")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def named_dirs(specs: list[str]) -> dict:
    """NAME=DIR pairs (a bare DIR is named "pre-trained", or after its folder when there are several)."""
    out = {}
    for spec in specs:
        name, _, path = spec.rpartition("=")
        path = Path(path)
        out[name or ("pre-trained" if len(specs) == 1 else path.name)] = path
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pretrained", required=True, nargs="+", metavar="[NAME=]DIR",
                   help="output directories of `bertkit pretrain run` (BERT or ELECTRA), all of one encoder shape")
    p.add_argument("--task", choices=sorted(TASKS), default="sst2")
    p.add_argument("--out", required=True, type=Path, help="where the fine-tuning runs go")
    p.add_argument("--train-examples", type=int, default=4000, help="the first N rows of the task's train file")
    p.add_argument("--epochs", type=float, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--learning-rates", type=float, nargs="+", default=[1e-4, 3e-4],
                   help="each model is fine-tuned with each; the table shows all, the plot each model's best")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="fine-tuning seeds (and random-init draws)")
    p.add_argument("--dropout", type=float, default=0.1, help="dropout while fine-tuning, every model")
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--pooling", choices=["cls", "mean"], default="cls",
                   help="what the classifier reads, every model: the pooled [CLS] vector or the mean of the tokens")
    p.add_argument("--random-stds", type=float, nargs="+",
                   help="initial scales of the random-init models (default: the config's initializer_range and 0.02)")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--png", type=Path, help="also copy the plot here (e.g. docs/pretraining_transfer.png)")
    args = p.parse_args(argv)

    import numpy as np

    _, _, _, metric, label, _ = TASKS[args.task]
    pretrained_dirs = named_dirs(args.pretrained)
    first = next(iter(pretrained_dirs.values()))
    shape = {k: getattr(bert_config(first), k) for k in SHAPE}
    for name, d in pretrained_dirs.items():
        other = {k: getattr(bert_config(d), k) for k in SHAPE}
        if other != shape:
            sys.exit(f"{d} has another encoder shape than {first}: {other} vs {shape}; one random init serves all")
    args.out.mkdir(parents=True, exist_ok=True)
    stds = sorted(set(args.random_stds or (bert_config(first).initializer_range, 0.02)))
    randoms = {std: f"random init N(0, {std:g})" for std in stds}
    runs = {**{name: {} for name in pretrained_dirs}, **{name: {} for name in randoms.values()}}  # name -> lr -> [results]
    copies = {name: model_copy(d, args.out / f"{name}_model", args.dropout, None)  # one copy, every seed
              for name, d in pretrained_dirs.items()}
    for seed in args.seeds:
        models = dict(copies)
        for std, name in randoms.items():
            models[name] = model_copy(first, args.out / f"random_init_std{std:g}_model_{seed}", args.dropout, seed, std)
        for lr in args.learning_rates:
            for name, model_dir in models.items():
                print(f"fine-tuning {name}, lr {lr:g}, seed {seed}", file=sys.stderr)
                out = args.out / f"{name.replace(' ', '_').replace(',', '')}_lr{lr:g}_seed{seed}"
                runs[name].setdefault(lr, []).append(finetune_once(model_dir, out, args, lr, seed))

    def final(r):
        return r["epochs"][-1][metric]

    summary = {name: {str(lr): {f"final_dev_{metric}": [final(r) for r in rs],
                                "epochs": [[{k: e[k] for k in ("epoch", "step", "train_loss", metric)}
                                            for e in r["epochs"]] for r in rs]}
                      for lr, rs in by_lr.items()} for name, by_lr in runs.items()}
    (args.out / "transfer.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                        "results": summary}, indent=2))

    def mean_final(lr_runs):
        return np.mean([final(r) for r in lr_runs[1]])

    best = {name: max(by_lr.items(), key=mean_final) for name, by_lr in runs.items()}
    best_random = max(randoms.values(), key=lambda name: mean_final(best[name]))
    plot({**{name: best[name] for name in pretrained_dirs}, best_random: best[best_random]},
         args.out / "transfer.png", args.task)
    if args.png:
        shutil.copyfile(args.out / "transfer.png", args.png)

    print(f"machine: {machine_line()}; {load_line()}\n")
    print(f"{args.task}: first {args.train_examples} training rows, the full dev set; {args.epochs:g} epochs, "
          f"batch {args.batch_size}, max_length {args.max_length}, dropout {args.dropout:g}, "
          f"classifier on {args.pooling}, seeds {args.seeds}\n")
    print(f"| model | learning rate | {label} after the last epoch, mean (min-max) | per seed |")
    print("| --- | ---: | ---: | --- |")
    for name, by_lr in runs.items():
        for lr, rs in by_lr.items():
            values = [final(r) for r in rs]
            print(f"| {name} | {lr:g} | {np.mean(values):.4f} ({min(values):.4f}-{max(values):.4f}) | "
                  f"{', '.join(f'{v:.4f}' for v in values)} |")
    print(f"\neach at its best learning rate, against the better random init ({best_random}, "
          f"{mean_final(best[best_random]):.4f} at lr {best[best_random][0]:g}):")
    for name in pretrained_dirs:
        margin = mean_final(best[name]) - mean_final(best[best_random])
        print(f"- {name}: {mean_final(best[name]):.4f} (lr {best[name][0]:g}), {margin * 100:+.1f} points")
    return 0


if __name__ == "__main__":
    sys.exit(main())

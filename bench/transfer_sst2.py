"""Transfer learning shown: fine-tune a pre-trained model and the same architecture from random init on SST-2.

Both runs use bertkit's fine-tuning loop (`bertkit.finetune.finetune`) with the
same training subset (the first N rows of SST-2 train), the same hyper-parameters,
seed and budget, and are scored on the full SST-2 dev set (872 sentences). The
random-init model is the pre-trained model's config.json and vocabulary with
freshly drawn weights (BERT's N(0, 0.02) initialisation), so the only
difference is pre-training.

    python bench/transfer_sst2.py --pretrained runs/l4h128 --out runs/transfer \
        --train-examples 4000 --epochs 4 --learning-rate 1e-4

prints a markdown table and writes OUT/transfer.json and OUT/transfer.png
(dev accuracy per epoch, both runs); `--docs` also copies the PNG to
docs/pretraining_transfer.png.
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from harness import SHARED_DATA, machine_line  # noqa: E402


def random_init_copy(pretrained: Path, out: Path, seed: int) -> Path:
    """The pre-trained model's architecture and vocabulary with fresh random weights."""
    import torch

    from bertkit.config import BertConfig
    from bertkit.heads import BertForPreTraining
    from bertkit.tokenizer import Tokenizer

    config = BertConfig.from_json_file(pretrained / "config.json").replace(architectures=None)
    model = BertForPreTraining(config, generator=torch.Generator().manual_seed(seed))
    model.save_pretrained(out, tokenizer=Tokenizer.from_pretrained(pretrained))
    return out


def finetune_once(model_dir: Path, out: Path, args) -> dict:
    from bertkit.finetune import finetune
    from bertkit.finetune.trainer import TrainConfig

    training = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, seed=args.seed, progress=not args.quiet)
    training.optim.learning_rate = args.learning_rate
    sst2 = SHARED_DATA / "sst2"
    return finetune("classify", train=str(sst2 / "train.tsv"), dev=str(sst2 / "dev.tsv"), output=str(out),
                    model=str(model_dir), max_length=args.max_length, max_train_examples=args.train_examples,
                    training=training, log=lambda *a: None)


def plot(results: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, res in results.items():
        epochs = [r["epoch"] for r in res["epochs"]]
        ax.plot(epochs, [r["accuracy"] for r in res["epochs"]], "o-", label=name)
    ax.axhline(444 / 872, color="grey", linestyle="--", label="majority class")
    ax.set_xlabel("epoch")
    ax.set_ylabel("SST-2 dev accuracy")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pretrained", required=True, type=Path, help="output directory of `bertkit pretrain run`")
    p.add_argument("--out", required=True, type=Path, help="where the two fine-tuning runs go")
    p.add_argument("--train-examples", type=int, default=4000, help="the first N rows of SST-2 train")
    p.add_argument("--epochs", type=float, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--learning-rate", type=float, default=1e-4)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--docs", action="store_true", help="copy the PNG to docs/pretraining_transfer.png")
    args = p.parse_args(argv)

    args.out.mkdir(parents=True, exist_ok=True)
    random_dir = random_init_copy(args.pretrained, args.out / "random_init_model", args.seed)
    results = {}
    for name, model_dir in (("pre-trained", args.pretrained), ("random init", random_dir)):
        print(f"fine-tuning {name} ({model_dir})", file=sys.stderr)
        results[name] = finetune_once(model_dir, args.out / name.replace(" ", "_"), args)

    summary = {name: {"final_dev_accuracy": r["epochs"][-1]["accuracy"],
                      "best_dev_accuracy": max(e["accuracy"] for e in r["epochs"]),
                      "epochs": [{k: e[k] for k in ("epoch", "step", "train_loss", "accuracy")} for e in r["epochs"]]}
               for name, r in results.items()}
    (args.out / "transfer.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                        "results": summary}, indent=2))
    plot(summary, args.out / "transfer.png")
    if args.docs:
        shutil.copyfile(args.out / "transfer.png", ROOT / "docs" / "pretraining_transfer.png")

    print(f"machine: {machine_line()}\n")
    print(f"SST-2: first {args.train_examples} training rows, full dev set (872); {args.epochs:g} epochs, "
          f"batch {args.batch_size}, lr {args.learning_rate:g}, max_length {args.max_length}, seed {args.seed}\n")
    print("| model | dev accuracy, last epoch | best epoch | per epoch |")
    print("| --- | ---: | ---: | --- |")
    for name, s in summary.items():
        per = ", ".join(f"{e['accuracy']:.3f}" for e in s["epochs"])
        print(f"| {name} | {s['final_dev_accuracy']:.4f} | {s['best_dev_accuracy']:.4f} | {per} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Pre-training runs side by side: held-out curves of several `bertkit pretrain run` outputs in one PNG.

For comparing methods at equal compute (docs/pretraining.md, "ELECTRA against
BERT-MLM"): each run's held-out records (metrics.jsonl, `"split": "eval"`) against
the optimizer step and against the budget spent, where the budget of step s is
s x that method's measured seconds per step (`bench/pretrain_cost.py --json`), so
both methods share one compute axis however loaded the machine was while they ran.
Panels: masked-LM accuracy (BERT's own; for ELECTRA its generator's, which only
feeds the discriminator), and ELECTRA's discriminator accuracy and recall on the
replaced tokens.

    python bench/pretrain_compare.py electra=runs/electra bert=runs/bert_mlm --cost OUT/cost.json --png curves.png
"""

import argparse
import json
import sys
from pathlib import Path

from bertkit.training.metrics_log import read_metrics

PANELS = (("mlm_acc", "held-out MLM accuracy\n(ELECTRA: its generator's)"),
          ("disc_acc", "held-out discriminator accuracy"),
          ("disc_recall", "held-out recall on replaced tokens"))


def eval_records(run: Path) -> list[dict]:
    return [r for r in read_metrics(run / "metrics.jsonl") if r["split"] == "eval"]


def method_of(run: Path) -> str:
    return json.loads((run / "run_config.json").read_text())["method"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", metavar="NAME=DIR", help="pre-training output directories")
    p.add_argument("--cost", type=Path, help="bench/pretrain_cost.py's JSON: seconds per step of each method")
    p.add_argument("--png", type=Path, required=True)
    args = p.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cost = json.loads(args.cost.read_text())["methods"] if args.cost else None
    axes_x = [("optimizer step", None)] + ([("budget spent (minutes at the measured s/step)", cost)] if cost else [])
    fig, axes = plt.subplots(len(axes_x), len(PANELS), figsize=(4.2 * len(PANELS), 3.4 * len(axes_x)), squeeze=False)
    for spec in args.runs:
        name, _, path = spec.rpartition("=")
        run = Path(path)
        records, method = eval_records(run), method_of(run)
        for row, (xlabel, per_step) in enumerate(axes_x):
            for col, (key, title) in enumerate(PANELS):
                points = [(r["step"], r[key]) for r in records if key in r]
                if not points:
                    continue
                scale = per_step[method]["s_per_step"] / 60 if per_step else 1.0
                ax = axes[row][col]
                ax.plot([s * scale for s, _ in points], [v for _, v in points], "o-", ms=3, label=name or run.name)
                ax.set_xlabel(xlabel)
                ax.set_title(title, fontsize=9)
                ax.grid(alpha=0.3)
                ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.png, dpi=100)
    print(f"wrote {args.png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

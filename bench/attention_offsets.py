"""The masked-LM plateau, seen in the attention: previous/next-token heads across a pre-training run.

For each checkpoint of a `bertkit pretrain run` (and the final model), runs the
first sentences of SST-2 dev through the encoder and prints, per layer, the
largest share of attention any head gives the previous and the next token
(`bertkit.explain.attention_view.offset_attention`). Uniform attention gives 1/length;
a run still on the plateau stays there, and the plateau ends when such heads
appear (docs/pretraining.md).

    python bench/attention_offsets.py runs/l4h128s64 [more checkpoint .pt files]
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from harness import SHARED_DATA  # noqa: E402


def main(argv=None) -> int:
    import torch

    from bertkit.explain.attention_view import offset_attention
    from bertkit.model.heads import BertForPreTraining
    from bertkit.text.tokenizer import Tokenizer
    from bertkit.training.state import checkpoint_paths, load_checkpoint

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path, help="a finished pre-training run (its config.json, vocab.txt, checkpoints)")
    p.add_argument("checkpoints", type=Path, nargs="*", help="more checkpoint files (copies of earlier steps)")
    p.add_argument("--sentences", type=int, default=64, help="the first N sentences of SST-2 dev")
    args = p.parse_args(argv)

    lines = (SHARED_DATA / "sst2" / "dev.tsv").read_text().splitlines()[1 : args.sentences + 1]
    tok = Tokenizer.from_pretrained(args.run)
    enc = tok.encode_batch([line.split("\t")[0] for line in lines], padding=True, return_tensors="pt")
    model = BertForPreTraining.from_pretrained(args.run).eval()
    uniform = (1 / enc["attention_mask"].sum(1).float()).mean().item()
    print(f"{len(lines)} SST-2 dev sentences; uniform attention would give {uniform:.3f}")
    print("| step | " + " | ".join(f"layer {i}: prev / next" for i in range(model.config.num_hidden_layers)) + " |")
    print("| ---: |" + " ---: |" * model.config.num_hidden_layers)
    paths = sorted({q.name: q for q in [*checkpoint_paths(args.run), *args.checkpoints]}.values(), key=lambda q: q.name)
    for path in [*paths, None]:  # None: the final model
        if path is None:
            model, label = BertForPreTraining.from_pretrained(args.run).eval(), "final"
        else:
            model.load_state_dict(load_checkpoint(path)["model"])
            label = f"{int(path.stem.removeprefix('step-')):,}"
        with torch.no_grad():
            att = model.bert(enc["input_ids"], attention_mask=enc["attention_mask"], output_attentions=True).attentions
        prev = offset_attention(att, enc["attention_mask"], -1).max(axis=1)
        nxt = offset_attention(att, enc["attention_mask"], +1).max(axis=1)
        print(f"| {label} | " + " | ".join(f"{a:.2f} / {b:.2f}" for a, b in zip(prev, nxt)) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Sentence-embedding throughput on the whole SST-2 dev set (872 sentences).

Contenders, all producing the same thing (the default model's mean-pooled,
L2-normalised sentence vectors), timed interleaved in one process:

- ours: `bertkit.embed(texts, normalize=True)`: batches of 32 texts sorted by
  length, so a batch carries little padding;
- transformers pipeline: `pipeline("feature-extraction")` with batch_size 32,
  then the masked mean and normalisation over its per-token output;
- plain padded batches: transformers' BertModel on batches of 32 in input
  order, padded to the longest in each batch, masked mean, normalise (what
  most hand-written feature extractors do).

Goal: at least 1.5x the peers. The vectors are compared too (max abs difference).

    python bench/bench_features.py [--rounds 3] [--write]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import SHARED_DATA, interleaved, load_line, machine_line, report, table  # noqa: E402


def sst2_dev() -> list:
    lines = (SHARED_DATA / "sst2" / "dev.tsv").read_text(encoding="utf-8").split("\n")[1:]
    return [line.split("\t")[0] for line in lines if line.strip()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--texts", type=int, default=0, help="only the first N dev sentences (0: all 872; a quick check)")
    ap.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    args = ap.parse_args(argv)

    import transformers

    from bertkit.default_model import default_model_dir
    from bertkit.embeddings.features import embed, load_encoder

    texts = sst2_dev()[: args.texts or None]
    bs = args.batch_size
    model_dir = str(default_model_dir())
    ours_model = load_encoder(None)
    hf_model = transformers.BertModel.from_pretrained(model_dir).eval()
    hf_tok = transformers.BertTokenizerFast.from_pretrained(model_dir)
    pipe = transformers.pipeline("feature-extraction", model=hf_model, tokenizer=hf_tok, device="cpu")

    def ours():
        return embed(texts, ours_model, normalize=True, batch_size=bs)

    def plain():
        out = []
        with torch.inference_mode():
            for i in range(0, len(texts), bs):
                batch = hf_tok(texts[i : i + bs], padding=True, truncation=True, return_tensors="pt")
                h = hf_model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).float()
                mean = (h * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out.append(torch.nn.functional.normalize(mean, dim=1).numpy())
        return np.concatenate(out)

    lengths = [len(ids) for ids in hf_tok(texts)["input_ids"]]

    def via_pipeline():
        # per text a [1, T, H] nested list; with batch_size > 1 it keeps the batch's
        # padding, so the mean runs over the text's own `lengths[i]` tokens
        rows = pipe(texts, batch_size=bs)
        means = np.stack([np.asarray(r[0][:n], dtype=np.float32).mean(0) for r, n in zip(rows, lengths)])
        return means / np.linalg.norm(means, axis=1, keepdims=True)

    results = {"ours": ours(), "plain padded batches": plain(), "transformers pipeline": via_pipeline()}
    diffs = {name: float(np.abs(v - results["ours"]).max()) for name, v in results.items()}
    times = interleaved(
        {"ours": ours, "transformers pipeline": via_pipeline, "plain padded batches": plain},
        rounds=args.rounds, warmup=0,  # the first calls above were the warm-up
    )
    n_tokens = sum(lengths)
    note = (
        f"Default model (all-MiniLM-L6-v2), mean pooling + L2 normalisation, ours in "
        f"{str(ours_model.dtype).removeprefix('torch.')} (dtype auto), the peers in float32, batch size {bs}, the "
        f"{len(texts)} SST-2 dev sentences ({n_tokens:,} tokens with [CLS]/[SEP]); median of {args.rounds} "
        f"interleaved rounds after 1 warm-up call each. Max |difference| from ours: "
        + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items() if k != "ours")
        + f".  \nCommand: `python bench/bench_features.py --rounds {args.rounds}"
        + (f" --texts {args.texts}" if args.texts else "") + "`.  \n"
        f"Machine: {machine_line('transformers')}; {load_line()}"
    )
    md = table("Sentence embeddings, SST-2 dev (bertkit.embed)", len(texts), "sentences", times, "ours", note)
    report("features", md, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())

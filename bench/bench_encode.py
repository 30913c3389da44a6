"""Corpus encoding for retrieval evaluation: bertkit against sentence-transformers' `encode`.

The work `bertkit evaluate retrieval` spends its time on: SciFact abstracts (title
and text joined, a sample of --docs of the 5,183, fixed seed) embedded with the
default model at its 256-token max_seq_length, mean pooled, L2-normalised, batch
32. Both sides sort the texts by length before batching (sentence-transformers'
`encode` does too), so the ratio measures the encoder and the pipeline around it.

- ours: `bertkit.retrieval.encoding.encode` (what evaluation runs), float32 and bf16;
- peer: `SentenceTransformer(default model).encode(texts, batch_size=32,
  normalize_embeddings=True)`, float32, and the same model cast to bf16
  (`model.to(torch.bfloat16)`) where the CPU multiplies bf16 natively.

One process, interleaved rounds (bench/harness.py), median; ratios ours/peer in
texts per second. The vectors are compared too (max |difference|).

A third row bounds what any implementation on torch's kernels can reach here: "the
kernels alone" runs only the work that cannot be skipped, on the same batches (texts
sorted by length, 32 a batch, each padded to its longest): for every layer the four
products (each on the faster of torch's two kernels for its shape, MKL's `F.linear` or
oneDNN's on packed weights, timed first; no GELU or bias add after them) and the attention
kernel (`scaled_dot_product_attention`, no mask), on random inputs of the batches' shapes;
no tokenizing, embedding, LayerNorm, GELU, residual add, pooling or copying. Both
pipelines call these kernels; neither can be faster than this row.

    python bench/bench_encode.py [--docs 256] [--rounds 3] [--dtypes float32,bfloat16] [--write]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import SHARED_DATA, interleaved, load_line, machine_line, report, table  # noqa: E402


def scifact_texts(n: int, seed: int = 0) -> list[str]:
    rows = (SHARED_DATA / "retrieval" / "scifact" / "corpus.jsonl").read_text(encoding="utf-8").split("\n")
    docs = [json.loads(r) for r in rows if r.strip()]
    sample = random.Random(seed).sample(docs, min(n, len(docs)))
    return [f"{d.get('title', '')} {d['text']}".strip() for d in sample]


def kernels_alone(lengths: list[int], config, dtype: torch.dtype, batch: int = 32):
    """A callable that runs the encoder's unavoidable kernels for texts of these token counts
    (see the module docstring): per batch and layer, the four products and the attention."""
    import torch.nn.functional as F

    H, N, I, L = config.hidden_size, config.num_attention_heads, config.intermediate_size, config.num_hidden_layers
    g = torch.Generator().manual_seed(0)
    shapes = [(H, 3 * H), (H, H), (H, I), (I, H)]  # (in, out): q/k/v, attention output, FFN up, FFN down
    plain = [[(torch.randn(o, i, generator=g) / i ** 0.5).to(dtype) for i, o in shapes] for _ in range(L)]
    packed = [[torch.ops.mkldnn._reorder_linear_weight(w) for w in layer] for layer in plain]

    def onednn(x, w):
        return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")

    lengths = sorted(lengths, reverse=True)
    work = []
    for start in range(0, len(lengths), batch):
        B, T = len(lengths[start:start + batch]), lengths[start]
        xs = [torch.randn(B * T, i, generator=g).to(dtype) for i, _ in shapes]
        qkv = torch.randn(3, B, N, T, H // N, generator=g).to(dtype)
        work.append((xs, qkv))

    def seconds(product, x, w, repeat=3):
        product(x, w)  # the kernel's preparation is not its time
        start = time.perf_counter()
        for _ in range(repeat):
            product(x, w)
        return time.perf_counter() - start

    with torch.inference_mode():  # per shape, the faster kernel at the largest batch
        choice = [min((seconds(F.linear, x, plain[0][j]), F.linear, plain),
                      (seconds(onednn, x, packed[0][j]), onednn, packed), key=lambda c: c[0])[1:]
                  for j, x in enumerate(work[0][0])]

    def run():
        with torch.inference_mode():
            for xs, (q, k, v) in work:
                for i in range(L):
                    for j, x in enumerate(xs):
                        product, weights = choice[j]
                        product(x, weights[i][j])
                    F.scaled_dot_product_attention(q, k, v)
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=256, help="abstracts sampled from SciFact's corpus")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--write", action="store_true", help="write the tables into docs/benchmarks.md")
    args = ap.parse_args(argv)

    from sentence_transformers import SentenceTransformer

    from bertkit.default_model import default_model_dir
    from bertkit.retrieval.encoding import encode, encoder_and_settings

    texts = scifact_texts(args.docs)
    sections = []
    for dtype in args.dtypes.split(","):
        loaded, settings = encoder_and_settings(None, dtype=dtype)
        peer = SentenceTransformer(str(default_model_dir()), device="cpu")
        if dtype == "bfloat16":
            peer = peer.to(torch.bfloat16)

        def ours():
            return encode(texts, loaded, settings)

        def theirs():
            return peer.encode(texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True)

        diff = float(np.abs(ours() - np.asarray(theirs(), dtype=np.float32)).max())  # also the warm-up
        lengths = [min(len(ids), settings.max_length) for ids in peer.tokenizer(texts)["input_ids"]]
        bound = kernels_alone(lengths, loaded.model.config, getattr(torch, dtype))
        bound()  # oneDNN prepares a kernel per shape on first use
        times = interleaved({"ours": ours, "sentence-transformers encode": theirs,
                             "the kernels alone (a bound, see the docstring)": bound}, rounds=args.rounds, warmup=0)
        tokens = sum(lengths)
        note = (f"{len(texts)} SciFact abstracts (title + text, {tokens:,} tokens at max length "
                f"{settings.max_length}), default model, {dtype}, batch 32, both length-sorted; median of "
                f"{args.rounds} interleaved rounds. Max |difference| of the unit vectors: {diff:.1e}.  \n"
                f"Command: `python bench/bench_encode.py --docs {args.docs} --rounds {args.rounds} "
                f"--dtypes {dtype}`.  \nMachine: {machine_line('sentence-transformers')}; {load_line()}")
        sections.append(table(f"Corpus encoding for evaluation, {dtype}", len(texts), "texts", times, "ours", note))
        print(sections[-1], flush=True)
    report("encode", "\n\n".join(sections), args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where int8 loses accuracy: each int8 product of the encoder against float32, layer by layer.

On the SST-2 dev sentences (batches of 32 sorted by length, as `bertkit embed` and
bench_model.py feed them), with the default model:

- per product (isolated): the float32 model runs once with hooks that keep every
  dense layer's input; each int8 product is then applied to that same float input
  and compared with the float32 product: minimum per-token cosine and relative
  error ||y_int8 - y|| / ||y|| over the real tokens (padding excluded). This says
  which products lose the accuracy, without the errors of the layers before.
- end to end: the int8 model's hidden state after every layer against float32's,
  minimum per-token cosine.

Both for each way of quantizing the activations (`bertkit.runtime.fast` rule 5): "per call"
(FBGEMM's dynamic int8, one 7-bit scale per call, the kernel where the CPU has no
VNNI) and "per token" (one 8-bit scale per token on oneDNN's int8 matmul, where it has).

    python bench/int8_layers.py [--every 1] [--write]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_model import batches, sst2_dev  # noqa: E402
from harness import machine_line, report  # noqa: E402

PRODUCTS = ("attention.qkv", "attention.output", "intermediate", "output")
LABELS = {"attention.qkv": "Q/K/V", "attention.output": "attention output", "intermediate": "FFN up (W1)",
          "output": "FFN down (W2, after GELU)"}
MODES = {"per call, 7 bits (FBGEMM)": False, "per token, 8 bits (oneDNN int8 matmul)": True}


def token_cosines(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return F.cosine_similarity(a[mask], b[mask], dim=-1)


def per_product(float_model, int8_model, data) -> dict:
    """(layer, product) -> (min per-token cosine, relative error) of the int8 product on float inputs."""
    modules, int8_modules = dict(float_model.named_modules()), dict(int8_model.named_modules())
    names = [f"encoder.layers.{i}.{p}" for i in range(float_model.config.num_hidden_layers) for p in PRODUCTS]
    worst = {n: 1.0 for n in names}
    err, norm = {n: 0.0 for n in names}, {n: 0.0 for n in names}
    for batch in data:
        seen = {}
        hooks = [modules[n].register_forward_hook(lambda m, a, o, n=n: seen.__setitem__(n, (a[0], o)))
                 for n in names]
        with torch.inference_mode():
            float_model(**batch)
            mask = batch["attention_mask"].bool()
            for n in names:
                x, y = seen[n]
                got = int8_modules[n](x)
                worst[n] = min(worst[n], token_cosines(got, y, mask).min().item())
                err[n] += (got - y)[mask].square().sum().item()
                norm[n] += y[mask].square().sum().item()
        for h in hooks:
            h.remove()
    return {n: (worst[n], (err[n] / norm[n]) ** 0.5) for n in names}


def end_to_end(float_model, int8_model, data) -> list[float]:
    """Minimum per-token cosine of each layer's output (embeddings first), int8 against float32."""
    worst = None
    for batch in data:
        with torch.inference_mode():
            a = float_model(**batch, output_hidden_states=True).hidden_states
            b = int8_model(**batch, output_hidden_states=True).hidden_states
        mask = batch["attention_mask"].bool()
        cos = [token_cosines(x, y, mask).min().item() for x, y in zip(a, b)]
        worst = cos if worst is None else [min(u, v) for u, v in zip(worst, cos)]
    return worst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--every", type=int, default=1, help="use every N-th batch (1: the whole dev set)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--write", action="store_true", help="write the tables into docs/benchmarks.md")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from bertkit import BertModel
    from bertkit.runtime.fast import decide
    from bertkit.runtime.quantization import Int8Linear, quantize
    from bertkit.text.tokenizer import Tokenizer

    data = batches(Tokenizer.from_pretrained(), sst2_dev(), 32, sort=True)[::args.every]
    float_model = BertModel.from_pretrained().eval()
    int8_model = quantize(BertModel.from_pretrained().eval())
    products, layers = {}, {}
    for mode, per_token in MODES.items():
        for m in int8_model.modules():
            if isinstance(m, Int8Linear):
                m.per_token = decide(per_token=per_token).int8_per_token
        products[mode] = per_product(float_model, int8_model, data)
        layers[mode] = end_to_end(float_model, int8_model, data)

    tokens = sum(int(b["attention_mask"].sum()) for b in data)
    lines = [f"Machine: {machine_line()}. Load average at the end: {os.getloadavg()[0]:.1f}. "
             f"SST-2 dev, {len(data)} batches of up to 32 sentences sorted by length, {tokens:,} real tokens; "
             f"command: `python bench/int8_layers.py {' '.join(argv or sys.argv[1:])}`.", "",
             "Each int8 product on the float32 model's own input (isolated): minimum per-token cosine to "
             "the float32 product / relative error.", "",
             "| layer | product | " + " | ".join(MODES) + " |", "| --- | --- |" + " ---: |" * len(MODES)]
    for name in products[next(iter(MODES))]:
        layer, product = name.split(".")[2], name.split(".", 3)[3]
        cells = [f"{products[m][name][0]:.4f} / {products[m][name][1]:.3f}" for m in MODES]
        lines.append(f"| {layer} | {LABELS[product]} | " + " | ".join(cells) + " |")
    lines += ["", "End to end: minimum per-token cosine of each layer's output, int8 model against float32.", "",
              "| after layer | " + " | ".join(MODES) + " |", "| --- |" + " ---: |" * len(MODES)]
    for i in range(1, float_model.config.num_hidden_layers + 1):
        lines.append(f"| {i - 1} | " + " | ".join(f"{layers[m][i]:.4f}" for m in MODES) + " |")
    report("int8-layers", "\n".join(lines) + "\n", args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())

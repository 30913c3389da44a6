"""Before and after a change, in one process: the same forward passes on bertkit at another commit.

A refactor must not cost speed. This benchmark extracts `bertkit/` at `--rev` (git archive) into a
temporary folder as the package `bertkit_before` (its `bertkit` imports rewritten), loads the
default model through each version's own inference entry point, and times both interleaved on
the same inputs (`harness.interleaved`), so the ratio is not a comparison across processes:

    32 x 128   one padded batch of real text cut to 128 tokens (the encoder's forward)
    1 x 128    one sequence (the batch-1 latency)
    SST-2 dev  `embed` over the 872 dev sentences (tokenizing, length-sorted batches, pooling)

each in float32, bfloat16 and int8 (the encoder's dense layers quantized), or the precisions
--precisions names. Both sides load through their public `load` (`bertkit.load`, head
"encoder") and embed through `bertkit.embed`, so `--rev` must be a commit that has them (the
package layout of "The house, step 1" or later). Ratios are after/before in throughput: above
1.0 the change is faster.

    python bench/before_after.py --rev main --rounds 3 --sst-rounds 3 [--precisions float32 bfloat16] [--write]
"""

from __future__ import annotations

import argparse
import io
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import ROOT, SHARED_DATA, interleaved, machine_line, table, write_section  # noqa: E402

IMPORT = re.compile(r"\b(from|import) bertkit\b")
PRECISIONS = {"float32": ("float32", False), "bfloat16": ("bfloat16", False), "int8": ("float32", True)}  # dtype, int8


def extract(rev: str, into: Path) -> None:
    """`bertkit/` at `rev` as the package `bertkit_before` under `into`."""
    data = subprocess.run(["git", "archive", rev, "bertkit"], cwd=ROOT, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    (into / "bertkit").rename(into / "bertkit_before")
    for path in (into / "bertkit_before").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        text = IMPORT.sub(lambda m: f"{m.group(1)} bertkit_before", text)
        text = text.replace('"bertkit.', '"bertkit_before.')  # the lazy public names of __init__
        path.write_text(text, encoding="utf-8")


def sst2_dev() -> list[str]:
    lines = (SHARED_DATA / "sst2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return [line.split("\t")[0] for line in lines]


def batch(tok, texts: list[str], rows: int, length: int):
    import torch

    enc = tok.encode_batch((texts * rows)[:rows], max_length=length, truncation=True, padding="max_length",
                           return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]


def forward(model, inputs):
    import torch

    def run():
        with torch.inference_mode():
            model(*inputs)

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", default="main", help="the commit to compare with (default: main)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sst-rounds", type=int, default=2)
    ap.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=list(PRECISIONS))
    ap.add_argument("--write", action="store_true", help="write the tables into docs/benchmarks.md")
    args = ap.parse_args()

    import bertkit

    tmp = tempfile.TemporaryDirectory()
    rev = subprocess.run(["git", "rev-parse", "--short", args.rev], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout.strip()
    extract(rev, Path(tmp.name))
    sys.path.insert(0, tmp.name)
    import bertkit_before

    texts = sst2_dev()
    sections = [f"Machine: {machine_line()}; before = `{args.rev}` ({rev}), after = the working tree; "
                f"load average at the start: {os.getloadavg()[0]:.1f}."]
    for name in args.precisions:
        dtype, int8 = PRECISIONS[name]
        after = bertkit.load(None, head="encoder", device="cpu", dtype=dtype, int8=int8)
        before = bertkit_before.load(None, head="encoder", device="cpu", dtype=dtype, int8=int8)
        for rows, length in ((32, 128), (1, 128)):
            inputs = batch(after.tokenizer, texts, rows, length)
            times = interleaved({"after": forward(after.model, inputs), "before": forward(before.model, inputs)},
                                rounds=args.rounds)
            sections.append(table(f"{name}, {rows} x {length}", rows, "seq", times, "after"))
        options = dict(layers="last", pooling="mean", normalize=True, batch_size=32, int8=int8, device="cpu",
                       dtype=dtype, truncate=False, max_length=512)
        times = interleaved({
            "after": lambda: bertkit.embed(texts, None, **options),
            "before": lambda: bertkit_before.embed(texts, None, **options),
        }, rounds=args.sst_rounds)
        sections.append(table(f"{name}, SST-2 dev embed ({len(texts)} sentences)", len(texts), "sent", times,
                              "after"))
    sections.append(f"Load average at the end: {os.getloadavg()[0]:.1f}.")
    text = "\n\n".join(sections)
    print(text)
    if args.write:
        write_section("before_after", text)


if __name__ == "__main__":
    main()

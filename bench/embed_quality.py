"""Does contrastive training help, and as much as sentence-transformers'? (issue 27's table)

On a BEIR set (default: the shared SciFact), fine-tune the default model (all-MiniLM-L6-v2) on the
train split's (claim, relevant abstract) pairs with multiple-negatives ranking -- and again with one
mined hard negative per pair -- once with `bertkit finetune embed` and once with
sentence-transformers' `SentenceTransformerTrainer`, for each seed, in the same settings (1 epoch,
batch 32, lr 2e-5, linear schedule with 10% warm-up, no weight decay, no duplicate text in a batch,
max length 256, float32). Every model, theirs too, is then scored by the same evaluator
(`bertkit evaluate retrieval`, float32, the test split; it reproduces sentence-transformers' and MTEB's
figure for the frozen model), so the table compares training, not evaluation. With --matryoshka, one
more bertkit run (seed 1 unless --matryoshka-seeds) trains with the Matryoshka loss (384, 256, 128, 64) and the plain and
Matryoshka models are scored at 64 and 128 dimensions.

Each cell runs in its own process and leaves OUT/<cell>/result.json: a killed run starts again where
it stopped. The table (mean and sample standard deviation over the seeds) is printed and written to
OUT/table.md.

With --update-parity N, only the update itself is compared: one batch of 32 mined triplets with no
text twice, the default model with dropout off, N updates by each trainer; the losses, gradient norms
and trained weights of the two are printed side by side.

    python bench/embed_quality.py --out /tmp/eq --seeds 1 2 3 --matryoshka
    python bench/embed_quality.py --out /tmp/eq --update-parity 4
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness import SHARED_DATA, load_line, machine_line

THEIRS = r"""
import csv, json, sys, time
from datasets import Dataset
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
from sentence_transformers.sentence_transformer.training_args import BatchSamplers
train, out, seed, model_dir, max_length = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
epochs, logging_steps = (int(sys.argv[6]), int(sys.argv[7])) if len(sys.argv) > 7 else (1, 10)
with open(train, encoding="utf-8", newline="") as f:
    rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
columns = {name: [r[i] for r in rows[1:]] for i, name in enumerate(rows[0])}
model = SentenceTransformer(model_dir, device="cpu")
model.max_seq_length = max_length
args = SentenceTransformerTrainingArguments(
    output_dir=out + "/trainer", num_train_epochs=epochs, per_device_train_batch_size=32, learning_rate=2e-5,
    warmup_ratio=0.1, weight_decay=0.0, lr_scheduler_type="linear", batch_sampler=BatchSamplers.NO_DUPLICATES,
    seed=seed, save_strategy="no", report_to="none", use_cpu=True, logging_steps=logging_steps, disable_tqdm=True)
trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=Dataset.from_dict(columns),
                                     loss=MultipleNegativesRankingLoss(model))
started = time.perf_counter()
trainer.train()
seconds = time.perf_counter() - started
model.save(out + "/model")
json.dump({"train_seconds": seconds, "log": trainer.state.log_history}, open(out + "/train.json", "w"))
"""


def write_tsv(path: Path, header: list, rows) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        for cells in [header, *rows]:
            f.write("\t".join(" ".join(c.split()) for c in cells) + "\n")
    tmp.replace(path)


def training_files(data: Path, out: Path, env: dict) -> dict:
    """pairs.tsv (every positive judgment of the train split) and hard.tsv (the mined triplets, the
    hardest negative kept): the same files for both libraries."""
    from bertkit.data.beir import training_pairs

    pairs = out / "pairs.tsv"
    if not pairs.exists():
        write_tsv(pairs, ["anchor", "positive"], training_pairs(data, "train"))
    mined, hard = out / "mined.tsv", out / "hard.tsv"
    if not mined.exists():
        run([sys.executable, "-m", "bertkit.cli", "mine", str(data), "--split", "train", "-o", str(mined),
             "--num-negatives", "3", "--dtype", "float32"], out / "mine.log", env)
    if not hard.exists():
        with open(mined, encoding="utf-8", newline="") as f:
            rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
        write_tsv(hard, ["anchor", "positive", "negative"], [r[:3] for r in rows[1:]])
    return {"mnrl": pairs, "hard": hard, "matryoshka": pairs}


def run(command: list, log: Path, env: dict) -> float:
    started = time.perf_counter()
    with open(log, "a", encoding="utf-8") as f:
        done = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, env=env)
    if done.returncode:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(command)}; see {log}")
    return time.perf_counter() - started


def train(lib: str, kind: str, seed: int, train_file: Path, cell: Path, env: dict, max_length: int) -> float:
    from bertkit.default_model import default_model_dir

    log = cell / "train.log"
    if lib == "st":
        run([sys.executable, "-c", THEIRS, str(train_file), str(cell), str(seed), str(default_model_dir()),
             str(max_length)], log, env)
        return json.loads((cell / "train.json").read_text())["train_seconds"]
    command = [sys.executable, "-m", "bertkit.cli", "finetune", "embed", "--train", str(train_file), "--output",
               str(cell / "model"), "--batch-size", "32", "--learning-rate", "2e-5", "--warmup-ratio", "0.1",
               "--weight-decay", "0", "--max-length", str(max_length), "--seed", str(seed), "--epochs", "1",
               "--precision", "fp32", "--no-progress"]
    if kind == "matryoshka":
        command += ["--matryoshka-dims", "384,256,128,64"]
    return run(command, log, env)  # the process's wall time: model loading and saving included


def evaluate(model: str | None, data: Path, cell: Path, env: dict, dimensions: bool) -> dict:
    output = cell / "eval.json"
    command = [sys.executable, "-m", "bertkit.cli", "evaluate", "retrieval", str(data), "--split", "test",
               "--dtype", "float32", "--output", str(output), "--quiet"]
    command += ["--model", model] if model else []
    command += ["--dimensions", "64", "128"] if dimensions else []
    run(command, cell / "eval.log", env)
    return json.loads(output.read_text())


def cell_result(out: Path, lib: str, kind: str, seed: int, files: dict, data: Path, env: dict, args) -> dict:
    cell = out / f"{kind}-{lib}-seed{seed}" if kind != "frozen" else out / "frozen"
    done = cell / "result.json"
    if done.exists():
        return json.loads(done.read_text())
    cell.mkdir(parents=True, exist_ok=True)
    print(f"{time.strftime('%H:%M:%S')} {cell.name} ...", flush=True)
    seconds = None
    if kind != "frozen":
        seconds = train(lib, kind, seed, files[kind], cell, env, args.max_length)
    figures = evaluate(None if kind == "frozen" else str(cell / "model"), data, cell, env,
                       dimensions=args.matryoshka and kind in ("frozen", "mnrl", "matryoshka"))
    result = {"lib": lib, "kind": kind, "seed": seed, "train_seconds": seconds, **figures}
    done.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{time.strftime('%H:%M:%S')} {cell.name}: nDCG@10 {result['ndcg@10']:.4f}"
          + (f", trained in {seconds:.0f} s" if seconds else ""), flush=True)
    return result


def update_parity(out: Path, hard: Path, env: dict, updates: int, max_length: int) -> None:
    """--update-parity N: the training update itself, against sentence-transformers' trainer. One batch
    of 32 mined triplets with no text twice (both no-duplicate samplers take it whole; the loss does
    not depend on the order of its rows), the default model with dropout off, N epochs of one update
    each, the table's other settings: the two logs' losses and gradient norms, and how far apart the
    trained weights are (against how far the updates moved them)."""
    import torch
    from safetensors.torch import load_file

    from bertkit.default_model import default_model_dir

    cell = out / f"update-parity-{updates}"
    model = cell / "model-without-dropout"
    if not model.exists():
        shutil.copytree(default_model_dir(), model)
        config = json.loads((model / "config.json").read_text())
        config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        (model / "config.json").write_text(json.dumps(config, indent=2))
    with open(hard, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    batch, seen = [], set()
    for row in rows:
        if not seen & set(row):
            batch.append(row)
            seen |= set(row)
    write_tsv(cell / "batch.tsv", ["anchor", "positive", "negative"], batch[:32])
    run([sys.executable, "-c", THEIRS, str(cell / "batch.tsv"), str(cell / "st"), "1", str(model), str(max_length),
         str(updates), "1"], cell / "st.log", env)
    run([sys.executable, "-m", "bertkit.cli", "finetune", "embed", "--train", str(cell / "batch.tsv"), "--output",
         str(cell / "bertkit"), "--model", str(model), "--batch-size", "32", "--learning-rate", "2e-5",
         "--warmup-ratio", "0.1", "--weight-decay", "0", "--max-length", str(max_length), "--seed", "1", "--epochs",
         str(updates), "--precision", "fp32", "--no-progress"], cell / "bertkit.log", env)
    theirs = [r for r in json.loads((cell / "st" / "train.json").read_text())["log"] if "loss" in r]
    ours = [json.loads(line) for line in (cell / "bertkit" / "metrics.jsonl").read_text().splitlines()]
    ours = [r for r in ours if r["split"] == "train"]
    print("update | bertkit loss | sentence-transformers loss | bertkit grad norm | sentence-transformers grad norm")
    for i, (a, b) in enumerate(zip(ours, theirs), 1):
        print(f"{i} | {a['loss']:.6f} | {float(b['loss']):.6f} | {a['grad_norm']:.4f} | {float(b['grad_norm']):.4f}")
    start = load_file(model / "model.safetensors")
    a, b = load_file(cell / "bertkit" / "model.safetensors"), load_file(cell / "st" / "model" / "model.safetensors")
    moved = max((a[k] - start[k]).abs().max().item() for k in a)
    gap = max((a[k] - b[k]).abs().max().item() for k in a)
    print(f"largest weight update {moved:.2e}; largest difference between the two trained models {gap:.2e} "
          f"({len(batch[:32])} triplets, {updates} updates, torch {torch.__version__})")


def spread(values: list) -> str:
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def table(results: list, seeds: list) -> str:
    names = {("frozen", "bertkit"): "frozen all-MiniLM-L6-v2",
             ("mnrl", "bertkit"): "bertkit, MNRL (in-batch negatives)",
             ("mnrl", "st"): "sentence-transformers, MNRL (in-batch negatives)",
             ("hard", "bertkit"): "bertkit, MNRL + 1 mined hard negative",
             ("hard", "st"): "sentence-transformers, MNRL + 1 mined hard negative",
             ("matryoshka", "bertkit"): "bertkit, Matryoshka MNRL (384, 256, 128, 64)"}
    lines = [f"| model | seeds | nDCG@10 | MRR@10 | Recall@10 | Recall@100 | training s |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for (kind, lib), name in names.items():
        rows = [r for r in results if r["kind"] == kind and r["lib"] == lib]
        if not rows:
            continue
        secs = [r["train_seconds"] for r in rows if r["train_seconds"]]
        figures = " | ".join(spread([r[m] for r in rows]) for m in ("ndcg@10", "mrr@10", "recall@10", "recall@100"))
        lines.append(f"| {name} | {len(rows) if secs else '—'} | {figures} | "
                     f"{statistics.mean(secs):.0f} |" if secs else f"| {name} | — | {figures} | |")
    cut = [r for r in results if "dimensions" in r]
    if cut:
        lines += ["", "| model | nDCG@10 at 64 | at 128 | at 384 | 64 / 384 | 128 / 384 |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for (kind, lib), name in names.items():
            rows = [r for r in cut if r["kind"] == kind and r["lib"] == lib]
            if not rows:
                continue
            at = {d: [r["dimensions"][d]["ndcg@10"] for r in rows] for d in ("64", "128")}
            full = [r["ndcg@10"] for r in rows]
            lines.append(f"| {name} | {spread(at['64'])} | {spread(at['128'])} | {spread(full)} | "
                         f"{statistics.mean(a / f for a, f in zip(at['64'], full)):.3f} | "
                         f"{statistics.mean(a / f for a, f in zip(at['128'], full)):.3f} |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(SHARED_DATA / "retrieval" / "scifact"))
    p.add_argument("--out", required=True, help="working folder (cells are kept: a rerun resumes)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--kinds", nargs="+", default=["mnrl", "hard"], choices=["mnrl", "hard"])
    p.add_argument("--libs", nargs="+", default=["bertkit", "st"], choices=["bertkit", "st"])
    p.add_argument("--matryoshka", action="store_true", help="also a Matryoshka-trained bertkit model")
    p.add_argument("--matryoshka-seeds", type=int, nargs="+", default=[1], help="its seeds (default 1)")
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--update-parity", type=int, metavar="N",
                   help="only compare N training updates on one batch with sentence-transformers' (dropout off)")
    args = p.parse_args()
    out, data = Path(args.out), Path(args.data)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    print(f"{machine_line()}; {load_line()}", flush=True)
    files = training_files(data, out, env)
    if args.update_parity:
        update_parity(out, files["hard"], env, args.update_parity, args.max_length)
        return
    results = [cell_result(out, "bertkit", "frozen", 0, files, data, env, args)]
    # seed by seed, so that a run cut short still leaves every row with the same seeds
    for seed in args.seeds:
        for kind in args.kinds + (["matryoshka"] if args.matryoshka and seed in args.matryoshka_seeds else []):
            for lib in (["bertkit"] if kind == "matryoshka" else args.libs):
                results.append(cell_result(out, lib, kind, seed, files, data, env, args))
    text = table(results, args.seeds)
    (out / "table.md").write_text(machine_line() + "\n\n" + text + "\n")
    print(text)


if __name__ == "__main__":
    main()

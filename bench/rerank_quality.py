"""Does a cross-encoder trained by bertkit improve on the bi-encoder? (issue 28's rerank table)

On a BEIR set (default: the shared SciFact) and an index of its corpus (`bertkit index`), everything
through bertkit's own commands, each in its own process, as a user runs them:

1. pairs: from triplets mined on the train split (`bertkit mine DIR --split train --num-negatives 3`:
   columns anchor, positive, negative_1..n), one (claim, abstract) pair per positive (label 1) and per
   mined hard negative (label 0), written as JSONL with columns query, passage, label;
2. the cross-encoder: `bertkit finetune pair` on those pairs from the default model
   (all-MiniLM-L6-v2: no pretrained cross-encoder ships), its two labels read as a relevance
   probability by `bertkit.tasks.rerank`;
3. `bertkit evaluate retrieval DIR --index INDEX` on the test split: the bi-encoder alone, with
   `--rerank CROSS --rerank-top N` for each N, and the bi-encoder with `--bm25` (whose BM25 row is
   the lexical baseline); one markdown table of nDCG@10, MRR@10, MAP@100, Recall@10, Recall@100 and
   seconds.

Every step leaves its output in --work (pairs.jsonl, cross/, eval_<name>.json with its wall time and
load average): a rerun skips what exists, and a killed training continues with --resume.
--train-rows and --test-queries take a slice (the first rows of the mined file; the first queries of
the split's qrels, in a folder of links next to the real corpus) to check the whole path quickly.

    python bench/rerank_quality.py --work /tmp/rq_tiny --train-rows 40 --test-queries 10
    OMP_NUM_THREADS=1 python bench/rerank_quality.py --work rq --dtype bfloat16   # mines and indexes first
    python bench/rerank_quality.py --work rq --mined mined.tsv --index scifact.index   # reuse them
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from harness import SHARED_DATA, machine_line

MEASURES = (("ndcg@10", "nDCG@10"), ("mrr@10", "MRR@10"), ("map@100", "MAP@100"), ("recall@10", "Recall@10"),
            ("recall@100", "Recall@100"))
CLI = [sys.executable, "-m", "bertkit.cli"]


def read_triplets(path: Path, limit: int | None) -> list[list[str]]:
    """The mined rows (anchor, positive, negative_1..n) of a TSV as `bertkit mine` writes it (tabs and
    newlines inside texts already replaced by spaces, so a line is a row)."""
    lines = path.read_text(encoding="utf-8").split("\n")
    header = lines[0].rstrip("\r").split("\t")
    if header[:2] != ["anchor", "positive"] or not all(h.startswith("negative_") for h in header[2:]):
        sys.exit(f"{path}: expected the columns anchor, positive, negative_1..n of bertkit mine, got {header}")
    rows = [line.rstrip("\r").split("\t") for line in lines[1:] if line.strip()]
    bad = [i for i, r in enumerate(rows, 2) if len(r) != len(header)]
    if bad:
        sys.exit(f"{path}: lines {bad[:5]} do not have {len(header)} fields")
    return rows[:limit] if limit else rows


def write_pairs(rows: list[list[str]], path: Path) -> dict:
    """One labelled (query, passage) pair per positive (1) and per negative (0), anchor by anchor."""
    counts = {"rows": len(rows), "positives": 0, "negatives": 0}
    with open(path.with_suffix(".tmp"), "w", encoding="utf-8") as f:
        for anchor, positive, *negatives in rows:
            for passage, label in [(positive, "1")] + [(n, "0") for n in negatives]:
                f.write(json.dumps({"query": anchor, "passage": passage, "label": label}) + "\n")
                counts["positives" if label == "1" else "negatives"] += 1
    path.with_suffix(".tmp").replace(path)
    return counts


def sliced_beir(data: Path, split: str, queries: int, folder: Path) -> Path:
    """A BEIR folder holding the first `queries` queries of `split`'s qrels; corpus and queries linked."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("corpus.jsonl", "queries.jsonl"):
        if not (folder / name).exists():
            (folder / name).symlink_to((data / name).resolve())
    lines = (data / "qrels" / f"{split}.tsv").read_text(encoding="utf-8").splitlines()
    header, kept, seen = lines[0], [], []
    for line in lines[1:]:
        qid = line.split("\t")[0]
        if qid not in seen:
            if len(seen) == queries:
                break
            seen.append(qid)
        kept.append(line)
    (folder / "qrels").mkdir(exist_ok=True)
    (folder / "qrels" / f"{split}.tsv").write_text("\n".join([header] + kept) + "\n", encoding="utf-8")
    return folder


def run_logged(command: list[str], log: Path) -> dict:
    """Run `command` with its output in `log`; its wall time and the load average around it."""
    print("$ " + " ".join(command), flush=True)
    before = os.getloadavg()
    started = time.perf_counter()
    with open(log, "w", encoding="utf-8") as f:
        code = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT).returncode
    seconds = time.perf_counter() - started
    if code != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").replace("\r", "\n").splitlines()[-15:]
        sys.exit(f"exit status {code}: {' '.join(command)}\n  (log {log})\n" + "\n".join(tail))
    return {"command": " ".join(command), "wall_seconds": round(seconds, 1),
            "load_before": [round(x, 2) for x in before], "load_after": [round(x, 2) for x in os.getloadavg()]}


def train(args, pairs: Path) -> dict:
    """`bertkit finetune pair` on the pairs; resumed if a run in --work/cross was cut short."""
    out, done = args.work / "cross", args.work / "cross.json"
    if done.is_file():
        return json.loads(done.read_text())
    command = CLI + ["finetune", "pair", "--train", str(pairs), "-o", str(out),
                     "--text-column", "query", "--text-pair-column", "passage", "--label-column", "label",
                     "--max-length", str(args.max_length), "--epochs", str(args.epochs),
                     "--batch-size", str(args.batch_size), "--learning-rate", str(args.learning_rate),
                     "--warmup-ratio", "0.1", "--seed", str(args.seed), "--precision", args.precision,
                     "--save-every", "50", "--no-progress"]
    if out.exists():
        command.append("--resume")
    record = run_logged(command, args.work / "cross.log")
    done.write_text(json.dumps(record, indent=2) + "\n")
    return record


def evaluate(args, data: Path, name: str, extra: list[str], dtype: str) -> dict:
    """One `bertkit evaluate retrieval --index` run, its figures and its timing in eval_<name>.json."""
    out = args.work / f"eval_{name}.json"
    if out.is_file():
        return json.loads(out.read_text())
    figures = args.work / f"eval_{name}.figures.json"
    command = CLI + ["evaluate", "retrieval", str(data), "--split", args.split, "--index", str(args.index),
                     "--dtype", dtype, "--batch-size", str(args.eval_batch_size), "--output", str(figures)]
    record = run_logged(command + extra, args.work / f"eval_{name}.log")
    record["figures"] = json.loads(figures.read_text())
    out.write_text(json.dumps(record, indent=2) + "\n")
    return record


def table(rows: list[tuple[str, dict, str, str]]) -> str:
    lines = ["| ranker | " + " | ".join(label for _, label in MEASURES) + " | search s | command wall s |",
             "|---" * (len(MEASURES) + 3) + "|"]
    for name, figures, search_s, wall_s in rows:
        lines.append(f"| {name} | " + " | ".join(f"{figures[m]:.4f}" for m, _ in MEASURES)
                     + f" | {search_s} | {wall_s} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, required=True, help="every step's output; a rerun skips what exists")
    p.add_argument("--data", type=Path, default=SHARED_DATA / "retrieval" / "scifact", help="a BEIR folder")
    p.add_argument("--mined", type=Path, help="bertkit mine's triplets of the train split (copied into --work; "
                   "default: mined into --work with --num-negatives 3, float32)")
    p.add_argument("--index", type=Path, help="bertkit index of --data's corpus (default: built into --work, "
                   "float32)")
    p.add_argument("--split", default="test", help="the qrels split evaluated (default test)")
    p.add_argument("--train-rows", type=int, help="only the first N mined rows (a quick check)")
    p.add_argument("--test-queries", type=int, help="only the first N queries of --split (a quick check)")
    p.add_argument("--max-length", type=int, default=320, help="tokens of claim + abstract (default 320)")
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--learning-rate", type=float, default=5e-5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--precision", default="bf16", choices=["fp32", "bf16"], help="training (autocast)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="evaluation: the query encoder's and the cross-encoder's (default float32)")
    p.add_argument("--eval-batch-size", type=int, default=32)
    p.add_argument("--rerank-top", type=int, nargs="+", default=[50, 100])
    args = p.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    print(machine_line(), flush=True)
    print(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')}; load average {os.getloadavg()}")

    mined = args.work / "mined.tsv"
    if not mined.is_file() and args.mined is not None:
        shutil.copyfile(args.mined, mined)
    elif not mined.is_file():
        run_logged(CLI + ["mine", str(args.data), "--split", "train", "-o", str(mined), "--num-negatives", "3",
                          "--dtype", "float32", "--quiet"], args.work / "mine.log")
    if args.index is None:
        args.index = args.work / "index"
        if not (args.index / "index.json").is_file():
            run_logged(CLI + ["index", str(args.data), "-o", str(args.index), "--dtype", "float32"]
                       + (["--resume"] if args.index.exists() else []), args.work / "index.log")
    pairs, counts_file = args.work / "pairs.jsonl", args.work / "pairs.json"
    if not counts_file.is_file():
        counts = write_pairs(read_triplets(mined, args.train_rows), pairs)
        counts_file.write_text(json.dumps(counts, indent=2) + "\n")
    counts = json.loads(counts_file.read_text())
    print(f"pairs: {counts['rows']} mined rows -> {counts['positives']} positives, {counts['negatives']} "
          f"negatives (1:{counts['negatives'] / counts['positives']:.2f})", flush=True)

    trained = train(args, pairs)
    print(f"cross-encoder: {args.work / 'cross'} ({trained['wall_seconds']} s wall, load "
          f"{trained['load_before'][0]} -> {trained['load_after'][0]})", flush=True)

    data = args.data if not args.test_queries else sliced_beir(args.data, args.split, args.test_queries,
                                                                 args.work / "data")
    cross = str(args.work / "cross")
    # (name, row label, flags, dtype), cheapest first. Reranking in bfloat16 (for time) also scores the
    # bi-encoder alone in bfloat16, so each reranked row has its own first stage next to it
    runs = [("bi-encoder", f"the index alone (bi-encoder), {args.dtype}", [], args.dtype)]
    if args.dtype != "float32":
        runs.insert(0, ("bi-encoder-float32", "the index alone (bi-encoder), float32", [], "float32"))
    runs += [("bm25", "BM25 (bm25s)", ["--bm25"], args.dtype)]
    runs += [(f"rerank{n}", f"the index + cross-encoder rerank of the top {n}, {args.dtype}",
              ["--rerank", cross, "--rerank-top", str(n)], args.dtype) for n in args.rerank_top]
    records = {}
    for name, _, extra, dtype in runs:
        records[name] = evaluate(args, data, name, extra, dtype)
        r = records[name]
        print(f"  {name}: nDCG@10 {r['figures']['ndcg@10']:.4f} ({r['wall_seconds']} s wall, load "
              f"{r['load_before'][0]} -> {r['load_after'][0]})", flush=True)

    rows = []
    for name, label, _, _ in runs:
        r = records[name]
        if name == "bm25":  # the --bm25 command also runs the bi-encoder: BM25's time is the difference
            bm25_s = r["wall_seconds"] - records["bi-encoder"]["wall_seconds"]
            rows.append((label, r["figures"]["bm25"], "", f"~{bm25_s:.1f}"))
        else:
            rows.append((label, r["figures"], f"{r['figures']['search_seconds']:.1f}", f"{r['wall_seconds']:.1f}"))
    first = records["bi-encoder"]["figures"]
    heading = (f"{first['dataset']} split {args.split}: {first['queries']} queries, {first['documents']} documents; "
               f"index {args.index} ({first['index']['passages']} passages of {first['index']['passage_tokens']} "
               f"tokens); cross-encoder {cross}: {counts['positives']} positive and "
               f"{counts['negatives']} negative pairs, max length {args.max_length}, {args.epochs:g} epochs, batch "
               f"{args.batch_size}, lr {args.learning_rate:g}, seed {args.seed}, {args.precision} "
               f"({trained['wall_seconds']} s)")
    text = heading + "\n\n" + table(rows) + "\n"
    (args.work / "table.md").write_text(text, encoding="utf-8")
    print("\n" + text)


if __name__ == "__main__":
    main()

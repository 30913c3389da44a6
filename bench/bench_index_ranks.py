"""Index encoding past one process: 1 rank x 2 threads against 2 torchrun ranks x 1 thread.

`bertkit index` on a sample of --docs SciFact abstracts (fixed seed), the default model
(all-MiniLM-L6-v2: passages of 256 tokens sharing 127 word pieces), batch 32, saved in parts
of --part-size passages (small enough that the ranks are dealt many parts each), each
--dtypes entry once per round:

- 1 rank x 2 threads: `python -m bertkit.cli index ...` with OMP_NUM_THREADS=2;
- 2 ranks x 1 thread: `torchrun --nproc_per_node 2 -m bertkit.cli index ...` with
  OMP_NUM_THREADS=1 (gloo on the CPU).

The figure is encoding throughput: passages / the encoding time of the slowest rank, as each
rank logs it (`bertkit.retrieval.index`, from the barrier after the folder is prepared to its
last part written: the model loading, passage cutting and assembly that every run does once are
left out; the whole command's wall time is shown beside it). The ratio is 2 ranks / 1 rank in
throughput: above 1.0 the ranks are faster. The two indexes are compared too (max |difference|
of the vectors; float32 differs only in summation order).

On one 2-core machine this measures whether two processes of one thread use the cores better
than one process of two (the same cores either way); across machines, N ranks add N machines'
cores and the rate grows with them as long as the parts outnumber the ranks.

    python bench/bench_index_ranks.py [--docs 512] [--dtypes float32,auto] [--part-size 64] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import ROOT, SHARED_DATA, machine_line, report  # noqa: E402

# bertkit.cli with each rank's encoding log (INFO) on stdout
LOGGED_CLI = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout, format='%(message)s'); "
              "from bertkit.cli import main; sys.exit(main(sys.argv[1:]))")
RANK_LINE = re.compile(r"rank (\d+) of (\d+): encoded (\d+) passages \((\d+) parts\) in ([\d.]+) s")


def sample_corpus(n: int, path: Path, seed: int = 0) -> Path:
    lines = [r for r in (SHARED_DATA / "retrieval" / "scifact" / "corpus.jsonl").read_text(encoding="utf-8").split("\n")
             if r.strip()]
    path.write_text("\n".join(random.Random(seed).sample(lines, min(n, len(lines)))) + "\n", encoding="utf-8")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_index(ranks: int, threads: int, corpus: Path, out: Path, dtype: str, part_size: int, batch_size: int) -> dict:
    """One `bertkit index` run; its ranks' encoding logs and the command's wall time."""
    script = out.parent / "logged_cli.py"
    script.write_text(LOGGED_CLI)
    args = ["index", str(corpus), "-o", str(out), "--dtype", dtype, "--device", "cpu", "--part-size", str(part_size),
            "--batch-size", str(batch_size), "--quiet"]
    launch = [sys.executable, str(script)] if ranks == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(ranks),
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(script)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    res = subprocess.run([*launch, *args], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"bertkit index failed ({ranks} ranks, {dtype}):\n{res.stderr[-3000:]}")
    logs = [(int(r), int(n), float(s)) for r, _, n, _, s in RANK_LINE.findall(res.stdout)]
    assert len(logs) == ranks, res.stdout
    info = json.loads((out / "index.json").read_text())
    passages = sum(n for _, n, _ in logs)
    assert passages == info["passages"], (passages, info["passages"])
    seconds = max(s for _, _, s in logs)
    return {"passages": passages, "seconds": seconds, "rate": passages / seconds, "wall": wall,
            "per_rank": [n / s for _, n, s in sorted(logs)], "precision": info["model"]["precision"]}


def max_difference(a: Path, b: Path) -> float:
    from bertkit.retrieval.index import open_index

    return float(abs(open_index(a).vectors - open_index(b).vectors).max())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=512, help="abstracts sampled from SciFact's corpus")
    ap.add_argument("--dtypes", default="float32,auto", help="--dtype of each run (auto: bf16 on a CPU with native "
                    "bf16)")
    ap.add_argument("--part-size", type=int, default=64, help="passages per part (the unit the ranks are dealt)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=1, help="runs of each contender, interleaved; the median is shown")
    ap.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    args = ap.parse_args(argv)

    contenders = {"1 rank x 2 threads": (1, 2), "2 ranks x 1 thread": (2, 1)}
    load_before = os.getloadavg()
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_index_ranks_") as tmp:
        tmp = Path(tmp)
        corpus = sample_corpus(args.docs, tmp / "corpus.jsonl")
        for r in range(args.rounds):  # interleaved: 1 rank, 2 ranks, 1 rank, ... (the load drifts)
            for dtype in args.dtypes.split(","):
                for name, (ranks, threads) in contenders.items():
                    out = tmp / f"{dtype}-{ranks}-{r}"
                    run = run_index(ranks, threads, corpus, out, dtype, args.part_size, args.batch_size)
                    results.setdefault((dtype, name), []).append(run)
                    print(f"round {r} {dtype} {name}: {run['rate']:.2f} passages/s (load {os.getloadavg()[0]:.1f})",
                          file=sys.stderr)
                diff = max_difference(tmp / f"{dtype}-1-{r}", tmp / f"{dtype}-2-{r}")
                results.setdefault((dtype, "diff"), []).append(diff)
    load_after = os.getloadavg()

    first = results[(args.dtypes.split(",")[0], "1 rank x 2 threads")][0]
    lines = ["### Index encoding: 1 rank x 2 threads against 2 torchrun ranks x 1 thread", "",
             f"{machine_line()}; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after; "
             f"{args.docs} SciFact abstracts, {first['passages']} passages, default model, parts of "
             f"{args.part_size}, batch {args.batch_size}, median of {args.rounds} round(s)", "",
             "| dtype | contender | encoding s | passages/s | per rank passages/s | command wall s | "
             "2 ranks / 1 rank | max abs diff of vectors |",
             "| --- | --- | ---: | ---: | --- | ---: | ---: | ---: |"]
    for dtype in args.dtypes.split(","):
        runs = {name: results[(dtype, name)] for name in contenders}
        rate = {name: statistics.median(x["rate"] for x in rs) for name, rs in runs.items()}
        for name, rs in runs.items():
            mid = sorted(rs, key=lambda x: x["rate"])[len(rs) // 2]
            ratio = rate[name] / rate["1 rank x 2 threads"]
            diff = f"{max(results[(dtype, 'diff')]):.2e}" if name != "1 rank x 2 threads" else ""
            lines.append(f"| {dtype} ({mid['precision']}) | {name} | {mid['seconds']:.1f} | {rate[name]:.2f} | "
                         f"{', '.join(f'{v:.2f}' for v in mid['per_rank'])} | {mid['wall']:.1f} | {ratio:.2f}x | "
                         f"{diff} |")
    report("index_ranks", "\n".join(lines) + "\n", args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())

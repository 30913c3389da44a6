"""Steps/s of a whole `bertkit pretrain run`: two source trees, interleaved.

bench_pretraining.py times one training step of the model; this times what a
user waits for: the run around the loop (bertkit.training.harness: resume
checks, metrics.jsonl, checkpoints, evaluation) plus the loop itself, by
running the command as a user does, once per tree per round, alternating the
trees so that both see the same machine load. Per run it reports

- the loop's steps/s: the median over steps of tokens_per_s / tokens per step
  (metrics.jsonl; the loop's own clock, one update without logging or saving),
- the run's steps/s: --max-steps / the process's wall time (start-up, data,
  checkpoints and the final save included, so a fixed cost is in it).

    python bench/bench_pretrain_run.py DATA --tree A=/path/to/checkout --tree B=/other/checkout \\
        [--config mini] [--batch-size 16] [--max-steps 30] [--rounds 3] [--precision fp32]

DATA is a folder made by `bertkit pretrain prepare`.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import load_line, machine_line  # noqa: E402


def one_run(tree: Path, data: Path, out: Path, args) -> dict:
    cmd = [sys.executable, "-m", "bertkit.cli", "pretrain", "run", str(data), "-o", str(out), "--config", args.config,
           "--max-steps", str(args.max_steps), "--batch-size", str(args.batch_size), "--save-every",
           str(args.save_every), "--eval-every", str(args.max_steps), "--eval-sequences", "32", "--seed", "1",
           "--device", "cpu", "--precision", args.precision]
    t0 = time.perf_counter()
    subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(tree)}, check=True, capture_output=True)
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    return {"wall_steps_per_s": args.max_steps / wall, "tokens_per_s": statistics.median(r["tokens_per_s"] for r in train)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", type=Path)
    p.add_argument("--tree", action="append", required=True, help="NAME=PATH of a bertkit checkout (two or more)")
    p.add_argument("--config", default="mini")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-steps", type=int, default=30)
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="pretrain run's --precision")
    args = p.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree)
    results = {name: [] for name in trees}
    print(f"Machine: {machine_line()}; {load_line()}; precision {args.precision}, config {args.config}, "
          f"batch {args.batch_size}, {args.max_steps} steps", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, path in (trees.items() if r % 2 == 0 else reversed(trees.items())):
                res = one_run(Path(path), args.data.resolve(), Path(tmp) / f"{name}-{r}", args)
                results[name].append(res)
                print(f"round {r + 1} {name}: {res['wall_steps_per_s']:.3f} steps/s (run), "
                      f"{res['tokens_per_s']:.0f} tokens/s (loop); load {os.getloadavg()[0]:.1f}", flush=True)
    first = next(iter(trees))
    for name in trees:
        wall = statistics.median(x["wall_steps_per_s"] for x in results[name])
        loop = statistics.median(x["tokens_per_s"] for x in results[name])
        base_wall = statistics.median(x["wall_steps_per_s"] for x in results[first])
        base_loop = statistics.median(x["tokens_per_s"] for x in results[first])
        print(f"{name}: median {wall:.3f} steps/s (run, {wall / base_wall:.3f}x {first}), "
              f"{loop:.0f} tokens/s (loop, {loop / base_loop:.3f}x {first})")


if __name__ == "__main__":
    main()

"""Beside another job: how much a training step and an embedding pass slow down next to one busy process.

A machine runs more than one job. This benchmark times each contender alone and
then beside one busy process, and reports the slowdown (time beside / time
alone) for bertkit and for plain torch, so that bertkit degrades no worse than
the libraries people compare it with (issue 41 item 2).

The busy process is a plain torch inference loop of an MLP (6 x Linear(384, 1536)
+ GELU + Linear(1536, 384), batch 8,192 rows, torch's default threads): many short
parallel regions, the kind of neighbour that exposes threads spinning at the end
of a region (a bare `x @ x` loop hides it).

Contenders, each in a fresh child process (the OpenMP runtime reads its
environment once, when torch loads, so a setting is a property of the process):

- train: one pre-training step (forward, backward, fused AdamW) of BertForPreTraining
  (MLM + NSP), preset tiny (2 layers, hidden 128), batch 32 x 128 random tokens,
  15% of them masked;
  - "bertkit (CLI default)": bertkit's model through `accelerate(training=True)` in
    a process set up as the `bertkit` command sets its own
    (`bertkit.cli.process_settings`: OMP_WAIT_POLICY=PASSIVE);
  - "bertkit, torch's default wait policy": the same in a process left as torch
    leaves it (what `bertkit pretrain run` was before);
  - "transformers (plain torch)": transformers' BertForPreTraining, same config,
    same batches, torch's defaults;
- embed: one pass over 64 SciFact abstracts (batch 32, at most 256 tokens; where the
  shared data is missing, 64 of the demo's short sentences) with the default model (all-MiniLM-L6-v2): bertkit.embed as `bertkit embed` runs it
  (dtype auto, CLI settings; and with torch's default wait policy) against
  sentence-transformers' encode (plain torch, float32).

Each child builds its model, takes one warm-up step, then times `--steps` steps
and prints the median. Rounds run interleaved: every contender alone, then beside
a freshly started busy process (given 3 s to warm up), contender after contender;
a round's slowdown is its beside/alone ratio, and the table gives the median of
the rounds. The load average before and after is printed: on a shared machine the
"alone" runs are beside whatever else runs too, which the ratios do not remove.

    python bench/bench_contention.py [--rounds 3] [--steps 5] [--only train|embed] [--write]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from harness import SHARED_DATA, machine_line, report  # noqa: E402

# contender -> (workload, library, whether the child takes the CLI's process settings)
CONTENDERS = {
    "train: bertkit (CLI default)": ("train", "bertkit", True),
    "train: bertkit, torch's default wait policy": ("train", "bertkit", False),
    "train: transformers (plain torch)": ("train", "transformers", False),
    "embed: bertkit (CLI default)": ("embed", "bertkit", True),
    "embed: bertkit, torch's default wait policy": ("embed", "bertkit", False),
    "embed: sentence-transformers (plain torch)": ("embed", "sentence-transformers", False),
}
BATCH, LENGTH, TEXTS = 32, 128, 64
SCIFACT = SHARED_DATA / "retrieval" / "scifact" / "corpus.jsonl"


# --- the children ----------------------------------------------------------------------------

def busy() -> None:
    """The neighbour: an MLP inference loop with torch's default threads, until killed."""
    import torch

    layers = []
    for _ in range(6):
        layers += [torch.nn.Linear(384, 1536), torch.nn.GELU(), torch.nn.Linear(1536, 384)]
    mlp = torch.nn.Sequential(*layers).eval()
    x = torch.randn(8192, 384, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        while True:
            mlp(x)


def pretraining_batch(vocab_size: int):
    """Random tokens, 15% masked with labels, NSP labels: the same for both libraries (seeded)."""
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, vocab_size, (BATCH, LENGTH), generator=g)
    labels = torch.full((BATCH, LENGTH), -100)
    masked = torch.rand(BATCH, LENGTH, generator=g) < 0.15
    labels[masked] = ids[masked]
    ids[masked] = 103  # [MASK]
    types = torch.zeros_like(ids)
    types[:, LENGTH // 2:] = 1
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": torch.ones_like(ids),
            "labels": labels, "next_sentence_label": torch.randint(0, 2, (BATCH,), generator=g)}


def train_step(library: str):
    import torch

    from bertkit.model.config import BertConfig

    config = BertConfig.preset("tiny")
    batch = pretraining_batch(config.vocab_size)
    if library == "bertkit":
        from bertkit.model.heads import BertForPreTraining
        from bertkit.runtime.fast import accelerate

        model = accelerate(BertForPreTraining(config, generator=torch.Generator().manual_seed(0)).train(),
                           training=True)
    else:
        import transformers

        model = transformers.BertForPreTraining(transformers.BertConfig(**config.to_dict())).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step():
        model(**batch).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def texts_to_embed() -> tuple[list[str], str]:
    """64 SciFact abstracts, or where the shared data is missing 64 of the demo's made-up sentences."""
    if SCIFACT.is_file():
        from bench_encode import scifact_texts

        return scifact_texts(TEXTS), f"{TEXTS} SciFact abstracts"
    import random

    from bertkit.cli.demo import TRAIN_FRAMES, TRAIN_WORDS, make_examples

    rows = make_examples(TRAIN_WORDS, TRAIN_FRAMES, random.Random(0), TEXTS // 2)
    return [text for text, _ in rows], f"{TEXTS} short sentences (the demo's; no shared data here)"


def embed_pass(library: str):
    from bertkit.default_model import default_model_dir

    texts, _ = texts_to_embed()
    if library == "bertkit":
        import bertkit
        from bertkit.runtime.loading import load

        loaded = load(None, head="encoder", dtype="auto")  # what `bertkit embed` runs: --dtype auto
        return lambda: bertkit.embed(texts, loaded, batch_size=32)
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(default_model_dir()), device="cpu")
    return lambda: st.encode(texts, batch_size=32)


def child(workload: str, library: str, cli_settings: bool, steps: int) -> None:
    if cli_settings:
        from bertkit.cli import process_settings

        process_settings()  # before torch loads, as the `bertkit` command does
    run = train_step(library) if workload == "train" else embed_pass(library)
    run()  # warm-up
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    import torch

    print(json.dumps({"seconds": statistics.median(times), "threads": torch.get_num_threads(),
                      "wait_policy": os.environ.get("OMP_WAIT_POLICY", "(unset)")}))


# --- the parent ------------------------------------------------------------------------------

def run_child(name: str, steps: int) -> dict:
    workload, library, cli = CONTENDERS[name]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, __file__, "--child", name, "--steps", str(steps)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def beside_busy(name: str, steps: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    neighbour = subprocess.Popen([sys.executable, __file__, "--busy"], env=env)
    try:
        time.sleep(3)  # torch loaded and the loop running
        return run_child(name, steps)
    finally:
        neighbour.kill()
        neighbour.wait()


def measure(names: list, rounds: int, steps: int) -> dict:
    """name -> {"alone": [s], "beside": [s], "ratio": [beside/alone per round], ...}."""
    found = {name: {"alone": [], "beside": [], "ratio": []} for name in names}
    for r in range(rounds):
        for name in names:
            alone = run_child(name, steps)
            beside = beside_busy(name, steps)
            row = found[name]
            row["alone"].append(alone["seconds"])
            row["beside"].append(beside["seconds"])
            row["ratio"].append(beside["seconds"] / alone["seconds"])
            row["threads"], row["wait_policy"] = alone["threads"], alone["wait_policy"]
            print(f"round {r + 1} {name}: alone {alone['seconds']:.3f} s, beside {beside['seconds']:.3f} s, "
                  f"{row['ratio'][-1]:.1f}x (load {os.getloadavg()[0]:.1f})", flush=True)
    return found


def table(found: dict, rounds: int, steps: int, loads: tuple) -> str:
    lines = ["### Beside another job", "",
             f"Machine: {machine_line('transformers', 'sentence-transformers')}.", "",
             f"Load average (1 min) {loads[0]:.1f} before and {loads[1]:.1f} after the run: other jobs shared "
             "the CPU, so \"alone\" means beside them, and only the ratios, measured interleaved, compare. "
             f"{rounds} rounds, median of {steps} timed steps per child after one warm-up; the slowdown is the "
             "median over rounds of (beside / alone). The embedding pass reads "
             f"{'SciFact abstracts' if SCIFACT.is_file() else 'the demo sentences (no shared data there)'}.", "",
             "| contender | threads | OMP_WAIT_POLICY | alone s/step | beside s/step | slowdown |",
             "| --- | ---: | --- | ---: | ---: | ---: |"]
    for name, row in found.items():
        lines.append(f"| {name} | {row['threads']} | {row['wait_policy']} | {statistics.median(row['alone']):.3f} | "
                     f"{statistics.median(row['beside']):.3f} | {statistics.median(row['ratio']):.1f}x |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=5, help="timed steps per child (after one warm-up)")
    p.add_argument("--only", choices=("train", "embed"), help="one workload only")
    p.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--busy", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.busy:
        busy()
        return 0
    if args.child:
        child(*CONTENDERS[args.child], args.steps)
        return 0
    names = [n for n, (workload, _, _) in CONTENDERS.items() if args.only in (None, workload)]
    before = os.getloadavg()[0]
    found = measure(names, args.rounds, args.steps)
    text = table(found, args.rounds, args.steps, (before, os.getloadavg()[0]))
    report("contention", text, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())

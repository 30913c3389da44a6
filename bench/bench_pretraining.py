"""Pre-training throughput and memory: bertkit against transformers, same shape, batch and data.

One training step = collate (dynamic masking) + forward + backward + AdamW step,
on the same instances (prepared by `bertkit pretrain prepare` from a slice of
the shared Gutenberg corpus, length 128, NSP pairs):

- ours: `bertkit.model.heads.BertForPreTraining` + our collator; the MLM head projects
  onto the 30,522-word vocabulary only at the masked positions (~15%), and the
  model goes through `bertkit.runtime.fast.accelerate(model, training=True)`, so its float32 matmuls run
  where `bertkit.runtime.fast` rule 2 says (MKL on Intel CPUs, oneDNN elsewhere), forward and backward;
- ours, oneDNN / MKL matmuls: accelerated with `bertkit.runtime.fast.decide(onednn=True / False)`, either kernel
  forced, to measure the rule;
- peer: `transformers.BertForPreTraining` + `DataCollatorForLanguageModeling`
  (15% masking, 80/10/10), which projects every position onto the vocabulary.

Both take the same optimizer, torch's fused AdamW: what each trainer runs by default
(`bertkit.training.optim.build_optimizer`; transformers' Trainer, `optim="adamw_torch_fused"`
since torch 2.8). Until 2026-11-25 20:00 UTC both took torch's default (foreach) AdamW.

Both models have the same config (default: 4 layers, hidden 256, 4 heads,
intermediate 1024; the "mini" preset), dropout on, the same batches, and the same
precision: fp32, or with `--precision bf16` the forward and loss under
torch.autocast(bfloat16) for both (ours through `bertkit.training.loop.autocast_for`);
times are interleaved in one process (bench/harness.py) and reported as
tokens/s of real (non-padding) tokens. Peak memory is measured in a fresh child
process per contender (peak RSS after a few steps, minus the RSS before the
first step).

    python bench/bench_pretraining.py [--write] [--rounds 3] [--batch-size 32] [--precision bf16] [--no-memory]
"""

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from harness import SHARED_DATA, interleaved, machine_line, report, table  # noqa: E402

BOOKS = 12  # a slice of the corpus: enough instances for a few dozen batches


def prepared_data(tmp: Path) -> Path:
    from bertkit.pretraining.prepare import PrepareConfig, prepare

    books = sorted((SHARED_DATA / "pretrain_corpus" / "gutenberg").glob("*.txt"))[:BOOKS]
    cfg = PrepareConfig(max_seq_length=128, objective="nsp", dynamic_masking=True, dupe_factor=1, documents="file")
    prepare(books, tmp / "data", cfg, progress=False)
    return tmp / "data"


def load_batches(data: Path, batch_size: int, steps: int):
    """The first `steps` batches of instances in the dataset's seeded order, and their token count."""
    from bertkit.pretraining.dataset import PretrainingDataset

    ds = PretrainingDataset(data, seed=0)
    batches = [[ds[ds.index_at(b * batch_size + i)] for i in range(batch_size)] for b in range(steps)]
    return ds, batches, sum(len(x["input_ids"]) for batch in batches for x in batch)


PRECISION = "fp32"  # --precision sets it


def make_ours(ds, batches, preset: str, onednn: bool | None = None):
    import torch

    import bertkit.runtime.fast
    from bertkit.training.loop import autocast_for
    from bertkit.model.config import BertConfig
    from bertkit.model.heads import BertForPreTraining

    model = BertForPreTraining(BertConfig.preset(preset, vocab_size=ds.vocab_size),
                               generator=torch.Generator().manual_seed(0)).train()
    bertkit.runtime.fast.accelerate(model, bertkit.runtime.fast.decide(onednn=onednn), training=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    collate, g = ds.collator(), torch.Generator().manual_seed(0)
    autocast = autocast_for(PRECISION, "cpu")

    def train_steps():
        for items in batches:
            with autocast():
                loss = model(**collate(items, g)).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    return train_steps


def make_ours_onednn(ds, batches, preset: str):
    """Ours with every float32 matmul on oneDNN, whatever rule 2 says."""
    return make_ours(ds, batches, preset, onednn=True)


def make_ours_mkl(ds, batches, preset: str):
    """Ours with torch's default matmuls (MKL, as transformers gets)."""
    return make_ours(ds, batches, preset, onednn=False)


def make_theirs(ds, batches, preset: str):
    import torch
    import transformers

    from bertkit.model.config import BertConfig

    config = BertConfig.preset(preset, vocab_size=ds.vocab_size).to_dict()
    model = transformers.BertForPreTraining(transformers.BertConfig(**config)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    tok = transformers.BertTokenizerFast(vocab_file=str(ds.directory / "vocab.txt"), do_lower_case=True)
    collate = transformers.DataCollatorForLanguageModeling(tok, mlm=True, mlm_probability=0.15)

    def train_steps():
        for items in batches:
            batch = collate([{"input_ids": x["input_ids"].tolist(), "token_type_ids": x["token_type_ids"].tolist()}
                             for x in items])
            batch["next_sentence_label"] = torch.tensor([x["next_sentence_label"] for x in items])
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=PRECISION == "bf16"):
                loss = model(**batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    return train_steps


MAKERS = {"bertkit": make_ours, "bertkit, oneDNN matmuls": make_ours_onednn, "bertkit, MKL matmuls": make_ours_mkl,
          "transformers": make_theirs}


def peak_memory(data: Path, preset: str, batch_size: int, name: str) -> dict:
    """Peak RSS of a fresh process running 3 steps of one contender (MiB)."""
    res = subprocess.run([sys.executable, __file__, "--memory-child", name, "--data", str(data),
                          "--preset", preset, "--batch-size", str(batch_size), "--precision", PRECISION],
                         capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def high_water_mib() -> float:
    # VmHWM belongs to this address space; ru_maxrss would carry over the parent's peak across exec
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def memory_child(args) -> None:
    ds, batches, _ = load_batches(args.data, args.batch_size, steps=3)
    train_steps = MAKERS[args.memory_child](ds, batches, args.preset)
    before = high_water_mib()
    train_steps()
    print(json.dumps({"before": before, "peak": high_water_mib()}))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, help="a prepared folder (default: prepare a slice of the shared corpus)")
    p.add_argument("--preset", default="mini", help="model shape (default mini: 4 layers, hidden 256)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=2, help="training steps per timed call")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="bf16: forward and loss under bfloat16 autocast, for both (a CPU with native bf16)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory processes")
    p.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    global PRECISION
    PRECISION = args.precision
    if args.memory_child:
        memory_child(args)
        return 0

    import os

    import torch

    from bertkit.runtime.fast import decide

    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data or prepared_data(Path(tmp))
        ds, batches, tokens = load_batches(data, args.batch_size, args.steps)
        fns = {name: make(ds, batches, args.preset) for name, make in MAKERS.items()}
        times = interleaved(fns, rounds=args.rounds, warmup=1)
        mem = {} if args.no_memory else {name: peak_memory(data, args.preset, args.batch_size, name) for name in fns}

    note = (f"Machine: {machine_line('transformers')}; torch threads {torch.get_num_threads()}.\n\n"
            f"One call = {args.steps} training steps (collate with dynamic 15% masking, forward, backward, AdamW) "
            f"of `BertForPreTraining` (MLM + NSP), preset {args.preset}, batch {args.batch_size} x length <= 128, "
            f"the same instances for both; {args.rounds} interleaved rounds after 1 warm-up, median. "
            "transformers uses `DataCollatorForLanguageModeling`. Ours projects onto the vocabulary only at the "
            f"masked positions; precision {args.precision}; its float32 matmuls run on "
            f"{'oneDNN' if decide().onednn_training else 'MKL'} here (`bertkit.runtime.fast` rule 2); the `oneDNN` / `MKL matmuls` "
            "rows force either kernel (MKL is what transformers runs; under bf16 autocast both rows take F.linear). "
            f"Load average at the start: {load:.1f}. Padding is to the longest sequence of "
            f"each batch for both. Command: `python bench/bench_pretraining.py {' '.join(argv or sys.argv[1:])}`.")
    md = table("Pre-training step throughput (tokens/s, higher is better)", tokens, "tokens", times, "bertkit", note)
    if mem:
        md += ("\nPeak memory: a fresh process per contender builds its model and batches, then runs 3 steps.\n\n"
               "| contender | peak RSS MiB | growth during the 3 steps MiB |\n| --- | ---: | ---: |\n")
    for name, m in mem.items():
        md += f"| {name} | {m['peak']:,.0f} | {m['peak'] - m['before']:,.0f} |\n"
    report("pretraining" if args.precision == "fp32" else f"pretraining-{args.precision}", md, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())

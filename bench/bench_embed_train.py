"""Sentence-embedding training speed and memory: bertkit against sentence-transformers.

Speed: the training step of multiple-negatives ranking (embed both columns,
loss, backward, clip, AdamW) on the very same batches of SciFact's (claim,
abstract) training pairs, the packaged all-MiniLM-L6-v2, mean pooling, max
length 256, batch 32 (the issue's reference settings), in float32 and in bf16
autocast (the CPU multiplies bf16 natively when it has AMX / avx512_bf16),
interleaved round-robin in one process. Ours is `SentenceEmbedder` made ready
the way the training loop makes it (`prepare_model`: the CPU fast path, exact
gradients); theirs is `SentenceTransformer` + `MultipleNegativesRankingLoss`
as its trainer runs it (the same fused AdamW for both). Both get the same
token ids, made before the timing (bertkit's tokenizer gives the reference
ids: tests/test_tokenizer_parity.py), each column padded to its own longest.

Memory (`--memory`): the peak resident memory of one training step above the
loaded model, each in a fresh process: the cached loss (GradCache) at a
global batch of 512 pairs in chunks of 32, against the plain loss at 64.

    python bench/bench_embed_train.py [--steps 3] [--rounds 3] [--max-length 256] [--memory] [--write]
"""

import argparse
import json
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from harness import SHARED_DATA, interleaved, load_line, machine_line, report, table  # noqa: E402

from bertkit.default_model import default_model_dir  # noqa: E402
from bertkit.tasks.embedding import (EmbeddingBatches, EmbeddingExamples, SentenceEmbedder,  # noqa: E402
                                        tokenize_rows)
from bertkit.model.modeling import BertModel  # noqa: E402
from bertkit.data.beir import training_pairs  # noqa: E402
from bertkit.text.tokenizer import Tokenizer  # noqa: E402
from bertkit.training.distributed import DistInfo  # noqa: E402
from bertkit.training.loop import autocast_for, prepare_model  # noqa: E402
from bertkit.training.optim import OptimConfig, build_optimizer  # noqa: E402

SCIFACT = SHARED_DATA / "retrieval" / "scifact"


def batches(n_batches: int, batch_size: int, max_length: int, loss="mnrl"):
    """Our stacked batches and sentence-transformers' per-column features, of the same pairs."""
    pairs = training_pairs(SCIFACT, "train")[: n_batches * batch_size]
    examples = EmbeddingExamples([tuple(p) for p in pairs], ("anchor", "positive"))
    tok = Tokenizer.from_pretrained(default_model_dir())
    ids = tokenize_rows(tok, examples, max_length)
    stream = EmbeddingBatches(examples, ids, batch_size, 1, seed=0)
    ours = [stream.collate(list(range(k, k + batch_size))) for k in range(0, len(pairs), batch_size)]
    theirs = []
    for b in ours:  # the same ids, cut back into one padded tensor per column, as sentence-transformers feeds them
        cols = []
        for c in range(2):
            part = {k: v[c * batch_size:(c + 1) * batch_size] for k, v in b.items()}
            T = int(part["attention_mask"].sum(1).max())
            cols.append({k: v[:, :T] for k, v in part.items()})
        theirs.append(cols)
    return ours, theirs


def ours_trainer(loss="mnrl", mini_batch_size=32):
    model = SentenceEmbedder(BertModel.from_pretrained(default_model_dir()), "mean", loss, 2,
                             mini_batch_size=mini_batch_size)
    model = prepare_model(model, DistInfo()).train()
    return model, build_optimizer(model, OptimConfig(learning_rate=2e-5))


def theirs_trainer():
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    model = SentenceTransformer(str(default_model_dir()), device="cpu").train()
    loss = MultipleNegativesRankingLoss(model)
    return loss, torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01, fused=True)


def step(params, optimizer, compute):
    compute().backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def speed(args) -> str:
    ours_b, theirs_b = batches(args.steps, args.batch_size, args.max_length)
    model, opt = ours_trainer()
    st_loss, st_opt = theirs_trainer()
    pairs = args.steps * args.batch_size
    sections = []
    for precision in ("fp32", "bf16"):
        autocast = autocast_for(precision, "cpu")

        def ours():
            for b in ours_b:
                def compute(b=b):
                    with autocast():
                        return model(**b).loss.float()
                step(list(model.parameters()), opt, compute)

        def theirs():
            for cols in theirs_b:
                def compute(cols=cols):
                    with autocast():
                        return st_loss(cols, None).float()
                step(list(st_loss.model.parameters()), st_opt, compute)

        times = interleaved({"bertkit": ours, "sentence-transformers": theirs}, rounds=args.rounds, warmup=1)
        sections.append(table(f"MNRL training step, {precision}", pairs, "pairs", times, "bertkit",
                              note=f"{args.steps} batches of {args.batch_size} SciFact (claim, abstract) pairs, "
                                   f"max length {args.max_length}, all-MiniLM-L6-v2, "
                                   f"{torch.get_num_threads()} threads"))
    return "\n".join(sections)


def resident_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def memory_probe(loss: str, batch_size: int, max_length: int) -> dict:
    """The peak resident memory of one training step above the memory just before it, sampled every 2 ms."""
    ours_b, _ = batches(1, batch_size, max_length)
    model, opt = ours_trainer(loss, mini_batch_size=32)
    small, _ = batches(1, 2, 16)  # a first, tiny step allocates the gradients and AdamW's moments
    step(list(model.parameters()), opt, lambda: model(**small[0]).loss)
    before, peak, done = resident_mb(), [0.0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], resident_mb())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    step(list(model.parameters()), opt, lambda: model(**ours_b[0]).loss)
    done.set()
    sampler.join()
    return {"loss": loss, "batch": batch_size, "max_length": max_length, "before_mb": before,
            "step_mb": max(peak[0], resident_mb()) - before}


def memory(args) -> str:
    rows = []
    for loss, batch in (("mnrl", 64), ("cached-mnrl", 512)):
        res = subprocess.run([sys.executable, __file__, "--probe", loss, "--batch-size", str(batch),
                              "--max-length", str(args.memory_max_length)], capture_output=True, text=True, check=True)
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
    lines = ["### Peak memory of one training step", "",
             f"all-MiniLM-L6-v2, SciFact pairs, max length {args.memory_max_length}; the peak resident memory "
             "of the step (sampled every 2 ms from /proc/self/statm) above the memory just before it (model, "
             "gradients and AdamW moments already allocated by a tiny first step), each in a fresh process", "",
             "| loss | pairs per batch | texts per batch | step peak MB above the loaded model |",
             "| --- | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['loss']} | {r['batch']} | {2 * r['batch']} | {r['step_mb']:,.0f} |")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=3, help="batches per timed call")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--memory", action="store_true", help="also measure peak memory (cached at 512 vs plain at 64)")
    p.add_argument("--memory-max-length", type=int, default=256, help="max length of the memory comparison")
    p.add_argument("--no-speed", action="store_true", help="skip the speed comparison")
    p.add_argument("--probe", help=argparse.SUPPRESS)
    p.add_argument("--write", action="store_true", help="write the tables into docs/benchmarks.md")
    args = p.parse_args()
    if args.probe:
        print(json.dumps(memory_probe(args.probe, args.batch_size, args.max_length)))
        return
    out = [f"Machine: {machine_line('sentence-transformers', 'transformers')}; {load_line()}", ""]
    if not args.no_speed:
        out.append(speed(args))
    if args.memory:
        out.append(memory(args))
    report("embed_train", "\n".join(out), args.write)


if __name__ == "__main__":
    main()

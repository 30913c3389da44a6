"""The CUDA paths, checked and timed on a machine with an NVIDIA GPU (none of this runs in CI).

    python bench/bench_gpu.py [--out DIR]

1. Parity: the default model's last hidden state on the GPU in float32 (TF32 off) against
   transformers' BertModel on the same GPU and against bertkit on the CPU (masked tokens only).
2. bf16: the minimum per-token cosine of bertkit's bf16 forward against its float32 one, beside
   transformers' bf16 against its own float32.
3. Throughput: sequences/s of the encoder at 128 x 128 tokens, float32 and bf16, bertkit and
   transformers interleaved in one process (median of 7 rounds, synchronised timers).
4. Sentence embeddings: `bertkit.embed` on the GPU against sentence-transformers' encode (same
   texts, bf16 and float32): cosine of the vectors and texts/s.
5. Attention kernels: training steps (batch 32, bf16 autocast, dropout on) over 48 new lengths and then
   the same lengths again, with torch's own order (cuDNN first on Hopper) against bertkit's
   `CUDA_ATTENTION`, each in a fresh process.
6. One fine-tuning run (`bertkit finetune classify --device cuda --precision bf16`) and one
   pre-training run under torchrun with NCCL (one process: the machine has one GPU), timed.

Texts: the project's own documentation split into sentences (no data travels to that machine).
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def sentences(limit: int = 4096) -> list[str]:
    text = " ".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md")))
    text = re.sub(r"[`|#*\[\]()<>]", " ", text)
    out = [" ".join(s.split()) for s in re.split(r"(?<=[.!?])\s+", text) if 40 <= len(s.strip()) <= 600]
    return (out * (limit // max(1, len(out)) + 1))[:limit]


def timed(fn, rounds: int = 7) -> float:
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def masked_max_diff(a, b, mask) -> float:
    return float(((a.float() - b.float()).abs() * mask[..., None]).max())


def min_token_cosine(a, b, mask) -> float:
    cos = torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1)
    return float(cos[mask.bool()].min())


def encoder_checks(report: dict) -> None:
    import transformers
    from bertkit import BertModel, Tokenizer
    from bertkit.default_model import default_model_dir

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    texts = sentences(128)
    tok = Tokenizer.from_pretrained()
    batch = tok.encode_batch(texts, max_length=128, truncation=True, padding="max_length", return_tensors="pt")
    ids, mask, types = batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]
    ours_cpu = BertModel.from_pretrained().eval()
    with torch.no_grad():
        ref_cpu = ours_cpu(ids[:16], mask[:16], types[:16]).last_hidden_state
    ours = BertModel.from_pretrained().eval().cuda()
    theirs = transformers.BertModel.from_pretrained(str(default_model_dir()), attn_implementation="eager").eval().cuda()
    g = [t.cuda() for t in (ids, mask, types)]
    with torch.no_grad():
        a = ours(*g).last_hidden_state
        b = theirs(input_ids=g[0], attention_mask=g[1], token_type_ids=g[2]).last_hidden_state
    report["fp32 max |bertkit cuda - transformers cuda|"] = masked_max_diff(a, b, g[1])
    report["fp32 max |bertkit cuda - bertkit cpu|"] = masked_max_diff(a[:16].cpu(), ref_cpu, mask[:16])
    ours16 = BertModel.from_pretrained().eval().cuda().to(torch.bfloat16)
    theirs16 = transformers.BertModel.from_pretrained(str(default_model_dir()),
                                                      torch_dtype=torch.bfloat16).eval().cuda()
    with torch.no_grad():
        a16 = ours16(*g).last_hidden_state
        b16 = theirs16(input_ids=g[0], attention_mask=g[1], token_type_ids=g[2]).last_hidden_state
    report["bf16 min token cosine vs fp32, bertkit"] = min_token_cosine(a16, a, g[1])
    report["bf16 min token cosine vs fp32, transformers"] = min_token_cosine(b16, b, g[1])
    theirs_sdpa = transformers.BertModel.from_pretrained(str(default_model_dir()), attn_implementation="sdpa")
    theirs_sdpa16 = transformers.BertModel.from_pretrained(str(default_model_dir()), attn_implementation="sdpa",
                                                           torch_dtype=torch.bfloat16)
    runs = {
        "bertkit fp32": lambda: ours(*g),
        "transformers fp32 (sdpa)": lambda m=theirs_sdpa.eval().cuda(): m(input_ids=g[0], attention_mask=g[1],
                                                                           token_type_ids=g[2]),
        "bertkit bf16": lambda: ours16(*g),
        "transformers bf16 (sdpa)": lambda m=theirs_sdpa16.eval().cuda(): m(input_ids=g[0], attention_mask=g[1],
                                                                             token_type_ids=g[2]),
    }
    times = {k: [] for k in runs}
    with torch.no_grad():
        for fn in runs.values():
            timed(fn, 3)  # warm-up
        for _ in range(7):
            for k, fn in runs.items():
                times[k].append(timed(fn, 1))
    for k, v in times.items():
        report[f"seq/s 128x128 {k}"] = round(len(texts) / statistics.median(v), 1)


def embedding_checks(report: dict) -> None:
    import numpy as np
    import sentence_transformers
    import bertkit
    from bertkit.default_model import default_model_dir

    texts = sentences(4096)
    st = sentence_transformers.SentenceTransformer(str(default_model_dir()), device="cuda")
    for dtype in ("float32", "bfloat16"):
        if dtype == "bfloat16":
            st = st.to(torch.bfloat16)
        ours = bertkit.embed(texts[:256], device="cuda", dtype=dtype, batch_size=128)
        theirs = st.encode(texts[:256], batch_size=128, convert_to_numpy=True)
        report[f"embed {dtype} min cosine bertkit vs sentence-transformers"] = float(
            (ours * theirs).sum(1).min() / 1.0)
        t0 = time.perf_counter()
        bertkit.embed(texts, device="cuda", dtype=dtype, batch_size=128)
        t1 = time.perf_counter()
        st.encode(texts, batch_size=128, convert_to_numpy=True)
        t2 = time.perf_counter()
        report[f"embed {dtype} texts/s bertkit"] = round(len(texts) / (t1 - t0), 1)
        report[f"embed {dtype} texts/s sentence-transformers"] = round(len(texts) / (t2 - t1), 1)
    assert np.isfinite(ours).all()


def attention_worker(order: str) -> None:
    """One fresh process: the seconds of 48 training steps at new lengths (cold), then at the same (warm)."""
    from torch.nn.attention import SDPBackend
    from bertkit.default_model import default_model_dir
    from bertkit.model import modeling
    from bertkit.model.heads import BertForSequenceClassification
    if order == "cudnn-first":  # torch's own order on Hopper GPUs
        modeling.CUDA_ATTENTION = (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                                   SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(default_model_dir(), num_labels=2, strict=False).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    result = {}
    for when in ("cold", "warm"):
        times = []
        for length in range(20, 260, 5):
            ids = torch.randint(1000, 20000, (32, length), device="cuda")
            mask = torch.ones_like(ids)
            mask[::2, length * 3 // 4:] = 0
            labels = torch.randint(0, 2, (32,), device="cuda")
            torch.cuda.synchronize()
            start = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(ids, attention_mask=mask).logits.float(), labels)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        result[when] = {"seconds": round(sum(times), 3), "median ms": round(1000 * statistics.median(times), 2)}
    print(json.dumps(result))


def attention_checks(report: dict) -> None:
    for order in ("cudnn-first", "bertkit"):
        res = subprocess.run([sys.executable, __file__, "--attention-worker", order], capture_output=True, text=True,
                             env={**os.environ, "PYTHONWARNINGS": "ignore"})
        report[f"attention {order}: 48 training steps at new lengths, then again"] = (
            json.loads(res.stdout.strip().splitlines()[-1]) if res.returncode == 0 else res.stderr[-1500:])


def run(cmd: list[str], report: dict, name: str, out: Path) -> None:
    start = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    report[f"{name} seconds"] = round(time.perf_counter() - start, 1)
    report[f"{name} exit"] = res.returncode
    (out / (re.sub(r"[^A-Za-z0-9]+", "_", name)[:60] + ".log")).write_text(res.stdout[-20000:] + "\n" + res.stderr[-20000:])
    tail = (res.stdout + res.stderr).strip().splitlines()[-3:]
    report[f"{name} tail"] = tail


def training_checks(report: dict, out: Path) -> None:
    work = Path("/tmp/bench_gpu")
    work.mkdir(exist_ok=True)
    rows = [f"{s}\t{int(len(s) % 2)}" for s in sentences(2000)]
    (work / "train.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    (work / "corpus").mkdir(exist_ok=True)
    for p in sorted((ROOT / "docs").glob("*.md")):
        (work / "corpus" / (p.stem + ".txt")).write_text(p.read_text(encoding="utf-8"))
    py = sys.executable
    run([py, "-m", "bertkit.cli", "finetune", "classify", "--train", str(work / "train.tsv"), "--text-column", "sentence", "--output",
         str(work / "clf"), "--device", "cuda", "--precision", "bf16", "--epochs", "1"],
        report, "finetune classify cuda bf16 (2000 rows, 1 epoch)", out)
    run([py, "-m", "bertkit.cli", "pretrain", "prepare", str(work / "corpus"), "-o", str(work / "data"),
         "--documents", "file", "--objective", "nsp"], report, "pretrain prepare", out)
    run([py, "-m", "torch.distributed.run", "--nproc-per-node", "1", "-m", "bertkit.cli", "pretrain", "run",
         str(work / "data"), "--config", "tiny", "--max-steps", "200", "--device", "cuda", "--precision", "bf16",
         "--output", str(work / "pre")], report, "torchrun nccl pretrain tiny 200 steps bf16", out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--only", nargs="*", choices=["encoder", "embeddings", "attention", "training"], help="run these checks only")
    ap.add_argument("--attention-worker", choices=["cudnn-first", "bertkit"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.attention_worker:
        return attention_worker(args.attention_worker)
    if not torch.cuda.is_available():
        sys.exit(f"bench_gpu.py needs an NVIDIA GPU and a CUDA build of torch; torch {torch.__version__} sees no GPU "
                 "here: run it on a GPU machine")
    out = Path(args.out)
    report = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "load_before": os.getloadavg(),
              **{p: metadata.version(p) for p in ("transformers", "sentence-transformers")}}
    for name, check in (("encoder", lambda: encoder_checks(report)), ("embeddings", lambda: embedding_checks(report)),
                        ("attention", lambda: attention_checks(report)),
                        ("training", lambda: training_checks(report, out))):
        if args.only and name not in args.only:
            continue
        try:
            check()
        except Exception as e:  # report and go on: one failed check must not hide the others
            report[f"{name} FAILED"] = f"{type(e).__name__}: {e}"[:2000]
    report["load_after"] = os.getloadavg()
    (out / "bench_gpu.json").write_text(json.dumps(report, indent=1))
    for k, v in report.items():
        print(f"{k}: {v}")


if __name__ == "__main__":
    main()

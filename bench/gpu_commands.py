"""Every command's CUDA path, run as a user runs it, against the same command on the CPU (none of this runs in CI).

    python bench/gpu_commands.py --pack DIR           # here: the slices of ../shared/data it reads, as DIR/data.tgz
    python bench/gpu_commands.py --data DIR [--out OUT] [--budget SECONDS]    # there, on the GPU machine

bench_gpu.py times the encoder and two training runs; this walks the commands a practitioner meets on a GPU
machine, each a real `bertkit` process: embed (float32 and bf16 against the CPU's float32), index and search
(the passage vectors against the CPU's, hybrid/dense/lexical, SciFact test through the index), the four
fine-tuning tasks and prediction, fp16 training (CUDA's GradScaler path), sentence-embedding training, the
reranker, mining, both distillations, ELECTRA and SOP pre-training (and torchrun with NCCL), fill-mask and
attention, and a real `bertkit serve` process answering /embed and /search. Each step records its exit code,
seconds, last lines and the figures it compares (its whole output in OUT/logs.tgz); one failed step does not stop the others, and the steps
stop at --budget seconds so that the report is always written (OUT/gpu_commands.json).
"""

import argparse
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TEXT = "Bert notices the hat, but chooses not to engage Ernie since he knows it'll lead to some ridiculous stuff."


# --- the data: slices of ../shared/data, small enough to travel ---------------------------------------------

def _head(src: Path, lines: int) -> bytes:
    with src.open("rb") as f:
        return b"".join(f.readline() for _ in range(lines))


def _conll_head(src: Path, sentences: int) -> bytes:
    out, seen = [], 0
    for line in src.read_bytes().splitlines(keepends=True):
        out.append(line)
        seen += not line.strip()
        if seen > sentences:
            break
    return b"".join(out)


def _squad_head(src: Path, articles: int) -> bytes:
    squad = json.loads(src.read_text(encoding="utf-8"))
    return json.dumps({**squad, "data": squad["data"][:articles]}).encode()


def pack(shared: Path, dest: Path) -> Path:
    """The slices this script reads, as one tar.gz (SciFact whole: its test figure is compared with the CPU's)."""
    files = {
        "sst2/train.tsv": _head(shared / "sst2/train.tsv", 1201),
        "sst2/dev.tsv": (shared / "sst2/dev.tsv").read_bytes(),
        "conll2003/train.txt": _conll_head(shared / "conll2003/train.txt", 800),
        "conll2003/dev.txt": _conll_head(shared / "conll2003/dev.txt", 200),
        "squad_v1.1/dev-v1.1.json": _squad_head(shared / "squad_v1.1/dev-v1.1.json", 6),
        "stsb/dev.tsv": (shared / "stsb/dev.tsv").read_bytes(),
        "pairs/triplets.tsv": _head(shared / "pairs/snli_devtest/triplets.tsv", 2001),
    }
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv", "qrels/train.tsv"):
        files[f"retrieval/scifact/{name}"] = (shared / "retrieval/scifact" / name).read_bytes()
    for book in sorted((shared / "pretrain_corpus/gutenberg").glob("*.txt"))[:2]:
        files[f"gutenberg/{book.name}"] = book.read_bytes()
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / "data.tgz"
    with tarfile.open(out, "w:gz") as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out


# --- running a step ---------------------------------------------------------------------------------------

class Steps:
    """The report, and a clock that stops the steps at the budget (the report is always written)."""

    def __init__(self, out: Path, work: Path, budget: float, smoke: bool):
        self.out, self.work, self.budget, self.start = out, work, budget, time.perf_counter()
        self.smoke = smoke  # a few steps of each training, the small corpus for the index: to try the script
        self.report: dict = {}

    @property
    def bf16(self) -> str:
        """bf16 training on the GPU; on a CPU trying the script, fp32 (emulated bf16 is slow there)."""
        return "fp32" if self.smoke else "bf16"

    @property
    def fp16(self) -> str:
        """fp16 training with CUDA's GradScaler; a CPU refuses it, so fp32 when trying the script."""
        return "fp32" if self.smoke else "fp16"

    def short(self) -> tuple:
        """What a smoke run adds to a training command."""
        return ("--max-steps", "3") if self.smoke else ()

    def few(self) -> tuple:
        """What a smoke run adds to a fine-tuning command with a dev set."""
        return ("--max-dev-examples", "40") if self.smoke else ()

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.start)

    def bertkit(self, name: str, *argv, timeout: float = 180, env: dict | None = None, module="bertkit.cli") -> bool:
        """Run `bertkit ARGV` (or `python -m torch.distributed.run ...` with module=None); True on exit 0."""
        if self.left() < 10:
            self.report[name] = "not run: the budget was spent"
            return False
        cmd = [sys.executable, "-m", module, *map(str, argv)] if module else [sys.executable, *map(str, argv)]
        start = time.perf_counter()
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, cwd=self.work, timeout=min(timeout, self.left()),
                                 env={**child_env(), **(env or {})})
            code, text = res.returncode, res.stdout + res.stderr
        except subprocess.TimeoutExpired as err:
            code, text = "timeout", (err.stdout or b"").decode(errors="replace") + (err.stderr or b"").decode(errors="replace")
        lines = [line for line in text.splitlines() if line.strip() and "\r" not in line]
        self.report[name] = {"exit": code, "seconds": round(time.perf_counter() - start, 1), "tail": lines[-4:]}
        (self.work / "logs").mkdir(exist_ok=True)
        (self.work / "logs" / (re.sub(r"[^A-Za-z0-9]+", "_", name)[:60] + ".log")).write_text(" ".join(cmd) + "\n" + text[-30000:])
        return code == 0

    def note(self, name: str, **figures) -> None:
        entry = self.report.setdefault(name, {})
        if isinstance(entry, dict):
            entry.update(figures)

    def check(self, name: str, fn) -> None:
        """A comparison after a step: its figures, or the error that stopped it."""
        try:
            self.note(name, **fn())
        except Exception as err:  # noqa: BLE001 - a failed comparison is a finding, not the end of the run
            self.note(name, compare_failed=f"{type(err).__name__}: {err}"[:500])


def child_env() -> dict:
    """This checkout first on the path, then whatever the caller put there (the carried wheels)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(1).min())


def same_tokens(tail: list, cpu_tail: list) -> dict:
    """fill-mask --json answers: the same tokens in the same order, and how far their probabilities are apart."""
    ours, cpu = ([json.loads(line) for line in t if line.startswith("[")][-1] for t in (tail, cpu_tail))
    pairs = [(a, b) for mask_a, mask_b in zip(ours, cpu) for a, b in zip(mask_a, mask_b)]
    return {"same tokens as the cpu": all(a["token"] == b["token"] for a, b in pairs) and len(ours) == len(cpu),
            "max probability difference": max(abs(a["probability"] - b["probability"]) for a, b in pairs)}


def read_json(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


# --- the steps ------------------------------------------------------------------------------------------

def embeddings(s: Steps, device: str) -> None:
    for where, dtype in ((device, "float32"), ("cpu", "float32"), (device, "bfloat16"))[:2 if s.smoke else 3]:
        s.bertkit(f"embed {where} {dtype}", "embed", "dev.txt", "-o", f"emb-{where}-{dtype}.npy", "--device", where,
                  "--dtype", dtype, "--quiet")
    cpu = s.work / "emb-cpu-float32.npy"
    for dtype in ("float32", "bfloat16")[:1 if s.smoke else 2]:
        s.check(f"embed {device} {dtype}", lambda d=dtype: {
            "min cosine to the cpu's float32": min_cosine(np.load(s.work / f"emb-{device}-{d}.npy"), np.load(cpu))})


def search(s: Steps, data: Path, device: str) -> None:
    from safetensors.numpy import load_file

    scifact = data / "retrieval/scifact"
    (s.work / "small").mkdir(exist_ok=True)  # the first 200 documents, indexed on both devices
    docs = (scifact / "corpus.jsonl").read_text(encoding="utf-8").splitlines()[:200]
    (s.work / "small/corpus.jsonl").write_text("\n".join(docs) + "\n")
    for where in (device, "cpu"):
        s.bertkit(f"index 200 docs {where}", "index", "small", "-o", f"small-{where}.index", "--device", where,
                  "--dtype", "float32", "--quiet")

    def vectors():
        a, b = (load_file(str(s.work / f"small-{w}.index/vectors.safetensors"))["vectors"] for w in (device, "cpu"))
        return {"passages": len(a), "min cosine to the cpu's": min_cosine(a, b), "max abs diff": float(np.abs(a - b).max())}
    s.check(f"index 200 docs {device}", vectors)
    if s.smoke:  # the 200 documents, with the set's queries and judgements
        shutil.copy(scifact / "queries.jsonl", s.work / "small")
        (s.work / "small/qrels").mkdir()
        kept = {json.loads(d)["_id"] for d in docs}
        for split in ("test", "train"):
            rows = (scifact / f"qrels/{split}.tsv").read_text().splitlines()
            (s.work / f"small/qrels/{split}.tsv").write_text(
                "\n".join([rows[0]] + [r for r in rows[1:] if r.split("\t")[1] in kept]) + "\n")
        scifact = s.work / "small"
    s.bertkit(f"index scifact {device}", "index", scifact, "-o", "scifact.index", "--device", device, "--dtype", "float32",
              "--quiet", timeout=240)
    s.bertkit("evaluate retrieval scifact test --mode all", "evaluate", "retrieval", scifact, "--index", "scifact.index",
              "--mode", "all", "--split", "test", "--dtype", "float32", "--output", "scifact-test.json", "--quiet")
    s.check("evaluate retrieval scifact test --mode all", lambda: {"figures": read_json(s.work / "scifact-test.json")})
    for mode in ("hybrid", "dense", "lexical"):
        on = ("--device", device) if mode != "lexical" else ()  # lexical embeds no query: --device is refused
        s.bertkit(f"search {mode} {device}", "search", "scifact.index", "cancer cells divide", "--mode", mode, "-k", "3",
                  "--json", *on)


def tasks(s: Steps, data: Path, device: str) -> None:
    common = ("--device", device, "--epochs", "1", "--seed", "0", "--no-progress")
    if s.bertkit("finetune classify bf16", "finetune", "classify", "--train", data / "sst2/train.tsv", "--dev",
                 data / "sst2/dev.tsv", "--output", "clf", "--precision", s.bf16, *common, *s.short(), *s.few()):
        s.bertkit("predict classify", "predict", "clf", data / "sst2/dev.tsv", "--device", device, "--output", "preds.tsv")
    s.bertkit("finetune classify fp16 (GradScaler)", "finetune", "classify", "--train", data / "sst2/train.tsv", "--dev",
              data / "sst2/dev.tsv", "--output", "clf16", "--precision", s.fp16, "--max-steps", "40", *common, *s.short())
    s.check("finetune classify fp16 (GradScaler)", lambda: {"metrics": read_json(s.work / "clf16/metrics.json")})
    if s.bertkit("finetune ner bf16", "finetune", "ner", "--train", data / "conll2003/train.txt", "--dev",
                 data / "conll2003/dev.txt", "--tag-scheme", "iob1", "--output", "ner", "--max-length", "128",
                 "--learning-rate", "1e-4", "--precision", s.bf16, *common, *s.short(), *s.few()):
        s.bertkit("predict ner", "predict", "ner", data / "conll2003/dev.txt", "--device", device, "--output", "ner.txt")
    squad = data / "squad_v1.1/dev-v1.1.json"
    if s.bertkit("finetune qa bf16", "finetune", "qa", "--train", squad, "--train-articles", "0:5", "--dev", squad,
                 "--dev-articles", "5:6", "--output", "qa", "--max-length", "192", "--doc-stride", "64",
                 "--learning-rate", "1e-4", "--precision", s.bf16, *common, *s.short(), *s.few()):
        s.bertkit("predict qa", "predict", "qa", squad, "--device", device, "--output", "qa.json")
    s.bertkit("finetune embed bf16", "finetune", "embed", "--train", data / "pairs/triplets.tsv", "--dev",
              data / "stsb/dev.tsv", "--output", "emb", "--precision", s.bf16, "--device", device, "--epochs", "1",
              "--seed", "0", *s.short())
    s.bertkit("evaluate sts (the trained model)", "evaluate", "sts", data / "stsb/dev.tsv", "--model", "emb")


def retrieval_training(s: Steps, data: Path, device: str) -> None:
    scifact = data / "retrieval/scifact"
    s.bertkit("mine scifact train", "mine", scifact, "--split", "train", "-o", "triplets.tsv", "--num-negatives", "3",
              "--quiet")
    s.bertkit("finetune rerank bf16 (scifact train, dev = test through the index)", "finetune", "rerank", "--train",
              scifact, "--mining-index", "scifact.index", "--hard-negatives", "2", "--random-negatives", "1",
              "--max-length", "256", "--precision", s.bf16, "-o", "cross", "--dev", scifact, "--dev-split", "test",
              "--index", "scifact.index", "--rerank-top", "20", "--device", device, "--epochs", "1", "--seed", "0",
              *s.short(), timeout=300)
    s.check("finetune rerank bf16 (scifact train, dev = test through the index)",
            lambda: {"retrieval.json": read_json(s.work / "cross/retrieval.json")})


def distillation(s: Steps, device: str) -> None:
    if not s.smoke:  # every vocabulary entry through the model: minutes on a CPU
        s.bertkit("distill static (auto device)", "distill", "static", "-o", "static", "--dim", "256")
    s.bertkit("distill layers bf16", "distill", "layers", "--keep", "3", "--data", "dev.txt", "-o", "student",
              "--device", device, "--precision", s.bf16, "--epochs", "1", *s.short())


def pretraining(s: Steps, data: Path, device: str) -> None:
    if not s.bertkit("pretrain prepare (sop, whole-word)", "pretrain", "prepare", data / "gutenberg", "-o", "sop-data",
                     "--objective", "sop", "--masking", "whole-word", "--quiet"):
        return
    s.bertkit("pretrain prepare (single segments)", "pretrain", "prepare", data / "gutenberg", "-o", "single-data",
              "--objective", "none", "--quiet")
    s.bertkit("pretrain run electra bf16", "pretrain", "run", "single-data", "--config", "tiny", "--method", "electra",
              "--max-steps", "100", "--device", device, "--precision", s.bf16, "--output", "electra", *s.short())
    s.bertkit("torchrun nccl pretrain run fp16", "-m", "torch.distributed.run", "--nproc-per-node", "1", "-m",
              "bertkit.cli", "pretrain", "run", "sop-data", "--config", "tiny", "--max-steps", "100", "--device",
              device, "--precision", s.fp16, "--output", "pre16", *s.short(), module=None)
    for where in (device, "cpu"):
        s.bertkit(f"fill-mask {where}", "fill-mask", "pre16", "the old [MASK] sat by the fire .", "--device", where,
                  "--dtype", "float32", "--json")
    s.check(f"fill-mask {device}", lambda: same_tokens(*(s.report[f"fill-mask {w}"]["tail"] for w in (device, "cpu"))))
    for where in (device, "cpu"):
        s.bertkit(f"attention {where}", "attention", TEXT, "--token", "he", "--layer", "3", "--head", "1", "-o",
                  f"he-{where}.html", "--device", where)
    s.check(f"attention {device}", lambda: {"same lines as the cpu": [
        line.replace(device, "DEVICE") for line in s.report[f"attention {device}"]["tail"]] == [
        line.replace("cpu", "DEVICE") for line in s.report["attention cpu"]["tail"]]})


def _post(port: int, path: str, body: dict):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def serving(s: Steps) -> None:
    """A real `bertkit serve --index` process (on the GPU: serve takes it when torch sees one)."""
    if s.left() < 40 or not (s.work / "scifact.index").is_dir():
        s.report["serve"] = "not run: no budget or no index"
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (s.work / "logs").mkdir(exist_ok=True)
    log = (s.work / "logs" / "serve.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "bertkit.cli", "serve", "--index", "scifact.index", "--port", str(port)],
                            cwd=s.work, stdout=log, stderr=subprocess.STDOUT, env=child_env())
    entry: dict = {}
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        texts = (s.work / "dev.txt").read_text().splitlines()[:16]
        served = np.asarray(_post(port, "/embed", {"inputs": texts}), dtype=np.float32)
        entry["/embed min cosine to the cpu's float32"] = min_cosine(served, np.load(s.work / "emb-cpu-float32.npy")[:16])
        for mode in ("hybrid", "dense", "lexical"):
            answer = _post(port, "/search", {"query": "cancer cells divide", "k": 3, "mode": mode})
            entry[f"/search {mode}"] = json.dumps(answer)[:300]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/info", timeout=10) as r:
            entry["/info"] = json.loads(r.read())
    except Exception as err:  # noqa: BLE001
        entry["failed"] = f"{type(err).__name__}: {err}"[:500]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            entry["exit"] = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            entry["exit"] = "killed"
        log.close()
    entry["log tail"] = (s.work / "logs" / "serve.log").read_text().splitlines()[-4:]
    s.report["serve"] = entry


# two chains side by side (the GPU and the CPUs have room for both); a step may read its chain's earlier ones
CHAINS = (("embeddings", "search", "serving", "retrieval_training"), ("tasks", "pretraining", "distillation"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pack", type=Path, help="write DIR/data.tgz from ../shared/data (or BERTKIT_SHARED_DATA) and stop")
    ap.add_argument("--data", type=Path, help="a folder holding data.tgz (unpacked into the work folder)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/gpu_commands")))
    ap.add_argument("--work", type=Path, default=Path("/tmp/gpu_commands_work"))
    ap.add_argument("--device", default="cuda", help="the device under test (cpu here, to try the script)")
    ap.add_argument("--budget", type=float, default=330, help="seconds after which no step starts")
    ap.add_argument("--only", nargs="*", choices=[n for c in CHAINS for n in c], help="these steps alone")
    ap.add_argument("--smoke", action="store_true", help="3 steps of each training, 200 documents: to try the script")
    args = ap.parse_args()
    if args.pack:
        shared = Path(os.environ.get("BERTKIT_SHARED_DATA", ROOT.parent / "shared" / "data"))
        print(pack(shared, args.pack))
        return
    import torch
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit(f"gpu_commands.py: torch {torch.__version__} sees no CUDA GPU here; run it on a GPU machine")
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    args.out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(args.data / "data.tgz") as tar:
        tar.extractall(args.work / "data", filter="data")
    s = Steps(args.out, args.work, args.budget, args.smoke)
    s.report["machine"] = {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                           "torch": torch.__version__, "python": sys.version.split()[0], "load": os.getloadavg()}
    data = args.work / "data"
    rows = (data / "sst2/dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    (args.work / "dev.txt").write_text("\n".join(r.split("\t")[0] for r in rows) + "\n")
    steps = {"embeddings": lambda: embeddings(s, args.device), "search": lambda: search(s, data, args.device),
             "serving": lambda: serving(s), "retrieval_training": lambda: retrieval_training(s, data, args.device),
             "tasks": lambda: tasks(s, data, args.device), "pretraining": lambda: pretraining(s, data, args.device),
             "distillation": lambda: distillation(s, args.device)}
    chains = [[n for n in names if n in (args.only or steps)] for names in CHAINS]
    threads = [threading.Thread(target=lambda c=chain: [steps[n]() for n in c]) for chain in chains]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s.report["seconds"] = round(time.perf_counter() - s.start, 1)
    (args.out / "gpu_commands.json").write_text(json.dumps(s.report, indent=1, default=str))
    with tarfile.open(args.out / "logs.tgz", "w:gz") as tar:  # one file: few come back from a lent machine
        tar.add(args.work / "logs", arcname="logs")
    for name, entry in s.report.items():
        print(f"{name}: {json.dumps(entry, default=str)[:400]}")


if __name__ == "__main__":
    main()

"""Encoder inference speed: bertkit's BertModel against transformers and ONNX Runtime.

All contenders run the default model (all-MiniLM-L6-v2: 6 layers, hidden 384, 12
heads) with the same weights, 2 threads, in one process, interleaved round-robin
and repeated (bench/harness.py); the tables give medians and ratios ours/peer.

- bertkit fp32: BertModel after `bertkit.runtime.fast.accelerate(model)`, weights left unpacked,
  inference_mode: matmuls on oneDNN (MKL, which torch uses by default, took a slower
  path on some AMD CPUs; `--threads 1` on a CPU without AVX-512 runs MKL, `fast` rule 1),
  GELU and residual fused into them where the CPU has AVX-512;
- bertkit fp32, packed weights: `accelerate(model)` as it is, weights kept in oneDNN's
  blocked layout (the analogue of building an ORT session; what embed and predict use);
- bertkit fp32, packed weights, post-ops fused / apart: the same with the GELU and the
  residual add forced into the oneDNN matmul or after it, whatever the CPU (`fast` rule 2);
- bertkit fp32, MKL matmuls: the model accelerated with `bertkit.runtime.fast.decide(onednn=False)`,
  i.e. torch's default matmul path, to show what the oneDNN route is worth;
- bertkit fp32, plain model: BertModel as `bertkit.model.modeling` writes it, no accelerate step;
- bertkit bf16: the same model converted with .to(torch.bfloat16) (where the CPU multiplies
  bfloat16 natively its matmuls take the oneDNN route with packed weights: `fast` rule 6);
- bertkit bf16, F.linear: the same with `decide(onednn=False)`, every matmul on
  F.linear as before rule 6 (weights re-blocked at every call, GELU and add apart);
- bertkit auto: the precision `--dtype auto` picks on this CPU (`bertkit.runtime.devices.auto_dtype`:
  bfloat16 where the CPU multiplies it natively, float32 elsewhere), named in the row;
- transformers eager / sdpa: BertModel with attn_implementation "eager" / "sdpa";
- ONNX Runtime: transformers' BertModel exported with torch.onnx.export and fused by
  onnxruntime.transformers.optimizer (Attention, SkipLayerNorm, BiasGelu kernels),
  the usual "CPU speed anchor";
- bertkit int8: the encoder's dense layers quantized (`bertkit.quantize`: int8 weights per
  output channel; activations per token on oneDNN's int8 matmul where the CPU has VNNI or AMX,
  else per call on FBGEMM: `bertkit.runtime.fast` rule 5), then accelerated, as `embed --int8` runs it;
- bertkit int8, per call: the same with FBGEMM's one-scale-per-call kernel forced, whatever the CPU;
- ONNX Runtime int8: the fused graph above through `onnxruntime.quantization.quantize_dynamic`
  (int8 weights per output channel), the usual int8 deployment of an ONNX model;
- bertkit bf16 / fp32, ops only (a bound): the same kernels as `bertkit auto` / `bertkit fp32,
  packed weights`, on the same packed weights, called one after another from one function
  (`ops_only`: no modules, no checks, no route decisions between them); its output equals the
  model's (checked when it is built), so the difference is what Python costs between the
  kernels. It copies the route of a CPU with AVX-512 and native bfloat16 (post-ops fused, rules 3
  and 6); elsewhere it is not the model's work, and the check says so.

Workloads: a fixed 32 x 128 batch (throughput), a 1 x 128 batch (latency), and the
whole SST-2 dev set (872 real sentences): bertkit sorts the sentences by length so a
batch carries almost no padding (batches of 32, or as many as fit in 32 x 128 token
slots); the peers take batches of 32 in data order padded to the longest in the batch
(what `tokenizer(..., padding=True)` gives). "transformers sdpa, sorted" shows how
much of the gain is the sorting alone.
Tokenization is done once, outside the timing. Every contender computes the token vectors
(last_hidden_state) and not the pooler, as embedding does (`pool=False`; transformers' model is
loaded without its pooler; the ONNX graphs output last_hidden_state alone). The bfloat16 accuracy cost is
measured against fp32 on the SST-2 sentences, and peak memory of one 32 x 128
forward in a fresh process per contender (peak RSS minus RSS after loading).

    pip install onnxruntime onnx onnxscript      # the `bench` extra
    python bench/bench_model.py [--rounds 5] [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import SHARED_DATA, interleaved, machine_line, report, table  # noqa: E402

THREADS = 2  # --threads changes it (for a machine where only one core is free)
# seconds of quiet before each timing: ONNX Runtime's thread pool keeps spinning after a
# run and took the CPU from whoever came next (measured at 1 x 4: bertkit 6.4 ms right
# after ORT, 3.5-3.9 ms after a pause or in a block of its own; ORT itself 2.1-2.3 ms)
SETTLE = 0.5
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def sst2_dev() -> list[str]:
    lines = (SHARED_DATA / "sst2" / "dev.tsv").read_text(encoding="utf-8").split("\n")[1:]
    return [line.split("\t")[0] for line in lines if line.strip()]


def tensors(batch) -> dict:
    return {k: batch[k] for k in INPUTS}


def fixed_batch(B: int, T: int = 128) -> dict:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30000, (B, T), generator=g)
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}


def batches(tok, texts, size, sort, token_budget=None):
    """Pre-tokenized batches of `size` texts; sorted by token length when `sort` (padding then
    nearly vanishes). With a token budget, a batch takes as many sorted texts as fit in
    budget = rows x longest, so short sentences travel in big batches."""
    lengths = [len(tok.encode(t)) for t in texts]
    order = sorted(range(len(texts)), key=lambda i: lengths[i]) if sort else list(range(len(texts)))
    groups = [order[s:s + size] for s in range(0, len(order), size)]
    if token_budget:
        groups, current = [], []
        for i in order:  # sorted: the newest text is the longest in its batch
            if current and (len(current) + 1) * lengths[i] > token_budget:
                groups.append(current)
                current = []
            current.append(i)
        groups.append(current)
    return [tensors(tok.encode_batch([texts[i] for i in g], return_tensors="pt")) for g in groups]


# --- contenders -------------------------------------------------------------------


def speed(**forced):
    """`bertkit.runtime.fast.decide(**forced)`: this CPU's settings, with `onednn`, `fuse` or `per_token`
    forced where a contender says (None: as the CPU's rule says)."""
    from bertkit.runtime.fast import decide

    return decide(**forced)


def load_ours(dtype=torch.float32, packed=False, accelerated=True, **forced):
    from bertkit import BertModel
    from bertkit.runtime.fast import accelerate, pack_weights

    model = BertModel.from_pretrained().to(dtype).eval()
    return pack_weights(accelerate(model, speed(**forced)), packed) if accelerated else model


def load_hf(impl: str):
    import transformers

    from bertkit.default_model import default_model_dir

    return transformers.BertModel.from_pretrained(str(default_model_dir()), attn_implementation=impl,
                                                  add_pooling_layer=False).eval()


def load_ort(workdir: Path):
    """Export transformers' BertModel (eager) to ONNX, fuse it with ORT's BERT optimizer."""
    import onnxruntime as ort
    from onnxruntime.transformers.optimizer import optimize_model

    hf = load_hf("eager")

    class Wrapper(torch.nn.Module):  # plain tensors in and out, for the exporter
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.m(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return out.last_hidden_state

    example = tuple(fixed_batch(2, 16).values())
    raw, fused = workdir / "bert.onnx", workdir / "bert_fused.onnx"
    # eval(): export restores the wrapper's mode recursively afterwards, so it must be eval already
    torch.onnx.export(Wrapper(hf).eval(), example, str(raw), input_names=list(INPUTS),
                      output_names=["last_hidden_state"], opset_version=17, dynamo=False,
                      dynamic_axes={k: {0: "batch", 1: "seq"} for k in INPUTS})
    opt = optimize_model(str(raw), model_type="bert", num_heads=hf.config.num_attention_heads,
                         hidden_size=hf.config.hidden_size)
    opt.save_model_to_file(str(fused))
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(fused), options, providers=["CPUExecutionProvider"])


def load_ours_int8(**forced):
    """bertkit's int8: the plain model quantized (`bertkit.quantize`), then accelerated, as embed/predict do."""
    from bertkit import BertModel
    from bertkit.runtime.fast import accelerate
    from bertkit.runtime.quantization import quantize

    settings = speed(**forced)
    return accelerate(quantize(BertModel.from_pretrained().eval(), settings), settings)


def load_ort_int8(workdir: Path):
    """ONNX Runtime's int8: `quantize_dynamic` on the fused float32 graph (int8 weights per output
    channel, as bertkit's; uint8 activations quantized at run time)."""
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    fused, int8 = workdir / "bert_fused.onnx", workdir / "bert_int8.onnx"
    if not fused.is_file():
        load_ort(workdir)
    # the fused graph's com.microsoft operators escape ONNX shape inference: tell the quantizer
    # their outputs are float, as its error message advises
    quantize_dynamic(str(fused), str(int8), weight_type=QuantType.QInt8, per_channel=True,
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(int8), options, providers=["CPUExecutionProvider"])


def load_ours_auto():
    from bertkit.runtime.devices import resolve_dtype

    return load_ours(resolve_dtype("auto"), packed=True)


def auto_name() -> str:
    from bertkit.runtime.devices import dtype_name, resolve_dtype

    return f"bertkit auto ({dtype_name(resolve_dtype('auto'))})"


def ops_only(model):
    """A batch -> last_hidden_state function that calls the accelerated `model`'s kernels directly
    (embedding sums, LayerNorm, packed oneDNN products with their GELU/add post-ops, SDPA), as
    bertkit.model.modeling + bertkit.runtime.fast run them on this CPU, with nothing in between."""
    import torch.nn.functional as F

    from bertkit.runtime.fast import pack
    from bertkit.model.modeling import additive_mask

    cfg, emb = model.config, model.embeddings
    H, N, eps = cfg.hidden_size, cfg.num_attention_heads, cfg.layer_norm_eps
    linear, binary = torch.ops.mkldnn._linear_pointwise, torch.ops.mkldnn._linear_pointwise.binary
    layers = [(pack(l.attention.qkv.weight), l.attention.qkv.bias, pack(l.attention.output.weight),
               l.attention.output.bias, l.attention_norm.weight, l.attention_norm.bias,
               pack(l.intermediate.weight), l.intermediate.bias, pack(l.output.weight),
               l.output.bias, l.output_norm.weight, l.output_norm.bias) for l in model.encoder.layers]

    def run(batch):
        ids, types = batch["input_ids"], batch["token_type_ids"]
        B, T = ids.shape
        with torch.inference_mode():
            mask = additive_mask(batch["attention_mask"], emb.word_embeddings.weight.dtype)
            x = (emb.word_embeddings.weight[ids] + emb.token_type_embeddings.weight[types]
                 + emb.position_embeddings.weight[:T])
            x = F.layer_norm(x, (H,), emb.layer_norm.weight, emb.layer_norm.bias, eps).view(B * T, H)
            for wqkv, bqkv, wo, bo, n1w, n1b, wi, bi, wd, bd, n2w, n2b in layers:
                qkv = linear(x, wqkv, bqkv, "none", [], "").view(B, T, 3, N, H // N)
                q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
                context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(B * T, H)
                x = F.layer_norm(binary(context, x, wo, bo, "add"), (H,), n1w, n1b, eps)
                x = F.layer_norm(binary(linear(x, wi, bi, "gelu", [], "none"), x, wd, bd, "add"), (H,), n2w, n2b, eps)
            return x.view(B, T, H)

    probe = fixed_batch(2, 16)
    with torch.inference_mode():
        gap = (run(probe).float() - model(**probe).last_hidden_state.float()).abs().max().item()
    assert gap <= 1e-5, f"ops_only differs from the model it copies by {gap}: the bound would not be the same work"
    return run


def torch_runner(model):
    """A batch -> last_hidden_state function of a torch model. bertkit's models run on the settings
    they were accelerated with (`load_ours(onednn=False)`: bertkit's matmuls go to MKL through
    F.linear, as transformers' do; True: to oneDNN; None: as `bertkit.runtime.fast` rule 1 picks;
    `fuse`, `per_token`: rules 3 and 5 forced, or the CPU's)."""
    from bertkit.embeddings.features import _takes_pool

    extra = {"pool": False} if _takes_pool(type(model)) else {}  # bertkit's models: no pooler, as embedding

    def run(batch):
        with torch.inference_mode():
            return model(**batch, **extra).last_hidden_state
    return run


def ort_runner(session):
    return lambda batch: session.run(["last_hidden_state"], {k: batch[k].numpy() for k in INPUTS})[0]


# name -> (workdir -> a function batch -> last_hidden_state)
CONTENDERS = {
    "bertkit fp32": lambda d: torch_runner(load_ours()),
    "bertkit fp32, packed weights": lambda d: torch_runner(load_ours(packed=True)),
    "bertkit fp32, packed weights, post-ops fused": lambda d: torch_runner(load_ours(packed=True, fuse=True)),
    "bertkit fp32, packed weights, post-ops apart": lambda d: torch_runner(load_ours(packed=True, fuse=False)),
    "bertkit fp32, MKL matmuls": lambda d: torch_runner(load_ours(onednn=False)),
    "bertkit fp32, plain model": lambda d: torch_runner(load_ours(accelerated=False)),
    "bertkit bf16": lambda d: torch_runner(load_ours(torch.bfloat16)),
    "bertkit bf16, F.linear": lambda d: torch_runner(load_ours(torch.bfloat16, packed=True, onednn=False)),
    auto_name(): lambda d: torch_runner(load_ours_auto()),
    "transformers eager": lambda d: torch_runner(load_hf("eager")),
    "transformers sdpa": lambda d: torch_runner(load_hf("sdpa")),
    "ONNX Runtime (fused)": lambda d: ort_runner(load_ort(d)),
    "bertkit int8": lambda d: torch_runner(load_ours_int8()),
    "bertkit int8, per call": lambda d: torch_runner(load_ours_int8(per_token=False)),
    "ONNX Runtime int8": lambda d: ort_runner(load_ort_int8(d)),
    "bertkit fp32, ops only (a bound)": lambda d: ops_only(load_ours(packed=True)),
    "bertkit bf16, ops only (a bound)": lambda d: ops_only(load_ours(torch.bfloat16, packed=True)),
}


# --- peak memory (one fresh process per contender) ---------------------------------------


def status_kb(field: str) -> int:
    """VmRSS (now) or VmHWM (peak) of this process. Not ru_maxrss: Linux carries that
    over from the parent across exec, so a child would report the parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def peak_memory_child(name: str) -> None:
    """Load one contender, run one 32 x 128 forward, print RSS after load and the peak (KiB)."""
    torch.set_num_threads(THREADS)
    with tempfile.TemporaryDirectory() as tmp:
        run = CONTENDERS[name](Path(tmp))
    loaded = status_kb("VmRSS")
    try:  # reset the peak to now, so loading's own peak (state dict + model) does not count
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    run(fixed_batch(32))
    print(json.dumps([loaded, status_kb("VmHWM")]))


def peak_memory(names, extra=()) -> dict:
    out = {}
    for name in names:
        res = subprocess.run([sys.executable, __file__, "--peak-memory-of", name, *extra], capture_output=True,
                             text=True)
        try:
            loaded, peak = json.loads(res.stdout.strip().splitlines()[-1])
            out[name] = (loaded / 1024, peak / 1024)
        except (IndexError, ValueError):
            print(f"peak memory of {name} failed:\n{res.stderr[-2000:]}", file=sys.stderr)
    return out


# --- main --------------------------------------------------------------------------


def main(argv=None) -> int:
    global THREADS  # the loaders read it
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--latency-calls", type=int, default=10, help="1 x 128 forwards per timed call")
    ap.add_argument("--sst-rounds", type=int, default=3,
                    help="rounds over the whole SST-2 dev set (0: no timing there; the accuracy table still runs)")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory processes")
    ap.add_argument("--default-malloc", action="store_true",
                    help="leave glibc's malloc as it is (default: bertkit.reuse_freed_memory() for the whole process)")
    ap.add_argument("--threads", type=int, default=THREADS, help="threads for every contender (default 2)")
    ap.add_argument("--only", nargs="+", metavar="NAME", choices=list(CONTENDERS),
                    help="time only these contenders (bertkit fp32, the ratios' base, always runs)")
    ap.add_argument("--write", action="store_true", help="write the tables into docs/benchmarks.md")
    ap.add_argument("--peak-memory-of", help=argparse.SUPPRESS)  # internal: the child process
    args = ap.parse_args(argv)
    THREADS = args.threads
    if not args.default_malloc:
        from bertkit.runtime.allocator import reuse_freed_memory

        reuse_freed_memory()  # process-wide: every torch contender (transformers too) gets it
    if args.peak_memory_of:
        peak_memory_child(args.peak_memory_of)
        return 0
    torch.set_num_threads(THREADS)
    from bertkit.runtime.devices import cpu_features
    from bertkit.runtime.fast import decide

    print(cpu_features().describe())  # what the kernels were chosen by: say it with every number
    rules = decide()  # this CPU's, at THREADS threads
    kernel, fused = rules.matmul_kernel, "fused into" if rules.fuse_post_ops else "apart from"

    from bertkit.text.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained()
    texts = sst2_dev()
    names = ["bertkit fp32"] + [n for n in CONTENDERS if n != "bertkit fp32" and (not args.only or n in args.only)]
    if any(n.startswith("ONNX Runtime") for n in names):
        try:  # one line saying what to install, before minutes of building the other contenders
            import onnxruntime  # noqa: F401
        except ImportError:
            sys.exit("the ONNX Runtime contenders need onnxruntime: `pip install onnxruntime onnx onnxscript` "
                     "(the bench extra), or --only the other contenders")
    with tempfile.TemporaryDirectory() as tmp:
        runs = {name: CONTENDERS[name](Path(tmp)) for name in names}

    def as_np(x):
        return x.float().numpy() if isinstance(x, torch.Tensor) else x

    # sanity: everyone computes the same thing (fp32 within 1e-4 of transformers sdpa, or of bertkit
    # fp32 when transformers does not run; the tests hold bertkit to 1e-5 of transformers)
    probe = tensors(tok.encode_batch(texts[:8], return_tensors="pt"))
    real = probe["attention_mask"].bool().numpy()
    ref = as_np(runs["transformers sdpa" if "transformers sdpa" in runs else "bertkit fp32"](probe))
    for name, run in runs.items():
        diff = np.abs(as_np(run(probe)) - ref)[real].max()
        limit = 0.5 if "bf16" in name or "bfloat16" in name else 2.0 if "int8" in name else 1e-4  # int8 per call: ~1.2
        assert diff < limit, f"{name} differs from transformers by {diff}"

    load = os.getloadavg()[0]
    sections = [f"Machine: {machine_line('transformers', 'onnxruntime')}. "
                f"Model: all-MiniLM-L6-v2 (L=6, H=384, N=12), {THREADS} threads, median of {args.rounds} "
                "interleaved rounds; `ours/this` > 1 means bertkit (fp32) is faster. "
                f"Load average when the run started: {load:.1f} (on {os.cpu_count()} cores; above ~2 other "
                "jobs were competing for the CPU, which inflates every time and hurts torch's OpenMP "
                "threads more than ONNX Runtime's pool). bertkit's rows are the model after "
                f"`bertkit.runtime.fast.accelerate` (float32 matmuls here on {kernel}, the GELU and residual "
                f"{fused} the matmuls: `bertkit.runtime.fast`'s rules for this CPU and "
                "thread count), weights unpacked unless the row says `packed weights` (what "
                "`bertkit.embed` and `bertkit.predict` use); torch's default matmuls, MKL, take a slower code "
                "path on AMD processors, which is what transformers and the `MKL matmuls` row get; `plain "
                "model` is `bertkit.model.modeling` without the accelerate step. "
                + ("glibc's malloc as it comes. " if args.default_malloc else
                   "The process runs with `bertkit.reuse_freed_memory()` (glibc keeps freed memory for the next "
                   "allocation instead of returning it to the kernel; every torch contender, transformers "
                   "included, gets it; ONNX Runtime has its own memory arena). ") +
                f"Each timing starts after {SETTLE} s of quiet (thread pools left spinning by the previous "
                "contender, ONNX Runtime's especially, would otherwise take the CPU from the next). "
                f"Command: `python bench/bench_model.py {' '.join(argv or sys.argv[1:])}`.\n"]

    big = fixed_batch(32)
    times = interleaved({n: (lambda r=r: r(big)) for n, r in runs.items()}, rounds=args.rounds, settle=SETTLE)
    sections.append(table("Fixed batch 32 x 128 (throughput)", 32, "seq", times, ours="bertkit fp32"))

    one = fixed_batch(1)
    calls = args.latency_calls
    times = interleaved({n: (lambda r=r: [r(one) for _ in range(calls)]) for n, r in runs.items()},
                        rounds=args.rounds, settle=SETTLE)
    times = {n: [t / calls for t in ts] for n, ts in times.items()}
    sections.append(table("Batch 1 x 128 (latency: median s/call is one forward)", 1, "seq", times,
                          ours="bertkit fp32"))

    sorted_batches = batches(tok, texts, 32, sort=True)
    budget_batches = batches(tok, texts, 32, sort=True, token_budget=32 * 128)
    padded_batches = batches(tok, texts, 32, sort=False)
    tokens = sum(int(b["attention_mask"].sum()) for b in sorted_batches)
    cells = lambda bs: sum(b["input_ids"].numel() for b in bs)  # noqa: E731
    # row -> (contender, batches); rows of contenders that did not run are left out
    passes = {
        "bertkit fp32 (sorted)": ("bertkit fp32", sorted_batches),
        "bertkit fp32 (sorted, <= 4096 tokens/batch)": ("bertkit fp32", budget_batches),
        "bertkit fp32, packed weights (sorted, <= 4096 tokens/batch)": ("bertkit fp32, packed weights", budget_batches),
        "bertkit fp32, packed, post-ops fused (sorted, <= 4096 tokens/batch)":
            ("bertkit fp32, packed weights, post-ops fused", budget_batches),
        "bertkit fp32, packed, post-ops apart (sorted, <= 4096 tokens/batch)":
            ("bertkit fp32, packed weights, post-ops apart", budget_batches),
        "bertkit bf16 (sorted, <= 4096 tokens/batch)": ("bertkit bf16", budget_batches),
        "bertkit bf16, F.linear (sorted, <= 4096 tokens/batch)": ("bertkit bf16, F.linear", budget_batches),
        f"{auto_name()} (sorted, <= 4096 tokens/batch)": (auto_name(), budget_batches),
        "transformers eager": ("transformers eager", padded_batches),
        "transformers sdpa": ("transformers sdpa", padded_batches),
        "transformers sdpa, sorted": ("transformers sdpa", sorted_batches),
        "ONNX Runtime (fused)": ("ONNX Runtime (fused)", padded_batches),
        "bertkit int8 (sorted, <= 4096 tokens/batch)": ("bertkit int8", budget_batches),
        "bertkit int8, per call (sorted, <= 4096 tokens/batch)": ("bertkit int8, per call", budget_batches),
        "ONNX Runtime int8": ("ONNX Runtime int8", padded_batches),
    }
    sst = {row: (lambda r=runs[name], bs=bs: [r(b) for b in bs]) for row, (name, bs) in passes.items() if name in runs}
    if args.sst_rounds > 0:
        # each pass is long and the models are warm by now: no discarded warm-up round
        times = interleaved(sst, rounds=args.sst_rounds, warmup=0, settle=SETTLE)
        note = (f"{len(texts)} sentences, {tokens:,} real tokens; token slots computed: sorted "
                f"{cells(sorted_batches):,} ({len(sorted_batches)} batches), token budget "
                f"{cells(budget_batches):,} ({len(budget_batches)} batches), data order {cells(padded_batches):,}. "
                "Peers other than the `sorted` row take batches of 32 in data order, padded to the longest.")
        sections.append(table("SST-2 dev, whole set, batches of 32", len(texts), "sentences", times,
                              ours="bertkit fp32 (sorted)", note=note))

    # the price of each lower precision, on the same real tokens: against bertkit fp32
    lines = ["### Accuracy against float32 (SST-2 dev tokens)", "",
             "Last hidden states against bertkit fp32 on the real tokens of every fourth sorted batch "
             "(values reach about +-6). Task scores: bench/int8_accuracy.py (docs/deployment.md).", "",
             "| contender | max abs difference | minimum per-token cosine |", "| --- | ---: | ---: |"]
    lossy = [n for n in runs if any(k in n for k in ("bf16", "bfloat16", "int8", "ONNX"))]
    for name in lossy:
        worst_abs, worst_cos = 0.0, 1.0
        for b in sorted_batches[::4]:
            full, low = runs["bertkit fp32"](b), torch.as_tensor(as_np(runs[name](b))).float()
            m = b["attention_mask"].bool()
            worst_abs = max(worst_abs, (full - low)[m].abs().max().item())
            worst_cos = min(worst_cos, torch.nn.functional.cosine_similarity(full[m], low[m], dim=-1).min().item())
        lines.append(f"| {name} | {worst_abs:.3f} | {worst_cos:.4f} |")
    if lossy:
        sections.append("\n".join(lines) + "\n")

    if not args.no_memory:
        mem = peak_memory(list(runs), ["--threads", str(THREADS)] + (["--default-malloc"] if args.default_malloc else []))
        lines = ["### Peak memory, one 32 x 128 forward (fresh process each)", "",
                 "ONNX Runtime's RSS after load includes the torch model it was exported from.", "",
                 "| contender | RSS after load (MiB) | peak RSS (MiB) | forward adds (MiB) |",
                 "| --- | ---: | ---: | ---: |"]
        for name, (loaded, peak) in mem.items():
            lines.append(f"| {name} | {loaded:,.0f} | {peak:,.0f} | {peak - loaded:,.0f} |")
        sections.append("\n".join(lines) + "\n")

    report("model", "\n".join(sections), args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The pre-training loop: masked LM (+ next-sentence or sentence-order) on prepared shards.

Devlin et al. 2019, section 3.1 and appendix A.2; google-research/bert
`run_pretraining.py`. The loop itself (`train_loop`) knows only two things: a
model that returns an output with a `.loss` (and, for the progress line, MLM
and NSP/SOP logits when it has them), and a batch stream that hands out the
micro-batches of any step. Everything else (which model, which data, which
optimizer) is wired together by `run()`.

One update (step s) on rank r of W, accumulating A micro-batches:

    for a in 0..A-1:
        batch = stream.micro_batch(position of (s, a, r))   # seek, never replay
        with autocast(bf16 | fp16 | off):  loss = model(**batch).loss / A
        backward (DDP all-reduces the gradients on the last micro-batch only)
    stop if any loss or the gradient norm is NaN/inf (naming step, rank, batch)
    clip the global gradient norm; lr = lr_at(s); optimizer step
    log (tqdm + JSON lines), evaluate every E steps, checkpoint every C steps

Exact resume: the micro-batch for (s, a, r) is a pure function of (seed, s, a,
r) (a shuffled order over the training instances plus a masking generator
seeded by the micro-batch's first position), the learning rate is a pure
function of s, and a checkpoint stores weights, optimizer moments, RNG states
and the stream position. So a resumed run draws the very same batches, masks
and dropout as one that never stopped: no batch is replayed or skipped, and
seeking costs nothing.

Files written to OUTPUT: run_config.json, metrics.jsonl (one JSON object per
logged step, `"split": "train"` or `"eval"`), checkpoints/step-N.pt (the last
K), curves.png, and the final Hugging Face checkpoint (config.json,
model.safetensors, vocab.txt) at the top level.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import warnings
from pathlib import Path

import torch

from bertkit import distributed
from bertkit.errors import BertkitError
from bertkit.optim import lr_at, param_groups, set_lr, warmup_steps_for
from bertkit.pretraining.run_config import RunConfig
from bertkit.training_state import capture_rng, latest_checkpoint, load_checkpoint, restore_rng, save_checkpoint

# Test hook: kill this process with SIGKILL in the middle of the given step (after
# its forward pass), the way an out-of-memory killer or a pre-empted node would.
KILL_AT_STEP_ENV = "BERTKIT_KILL_AT_STEP"


class NonFiniteLoss(BertkitError):
    """The loss or the gradients became NaN/inf: training stops instead of going on silently."""


# --- the stream of batches ---------------------------------------------------------


def micro_batch_slot(step_offset: int, accum_index: int, rank: int, world_size: int, grad_accum: int) -> int:
    """Which micro-batch (in the global order since the start position) a rank computes.

    Update s consumes W * A consecutive micro-batches; rank r takes the ones
    r, r + W, ... so that W ranks with A micro-batches each cover exactly the
    micro-batches one process would accumulate with W * A.
    """
    return (step_offset * grad_accum + accum_index) * world_size + rank


class BatchStream:
    """Seekable micro-batches over `instances` (a sequence supporting len() and [i]).

    The training order is a fresh permutation of the instances every epoch
    (torch.randperm with a generator seeded by (seed, epoch)), and position p
    in that endless order is instance perm[p // n][p % n]: any position is
    reachable at once. `collate(list_of_instances, generator)` makes the batch
    tensors (dynamic masking draws from the generator, seeded by the batch's
    position, so a batch is the same whenever it is drawn).
    """

    def __init__(self, instances, batch_size: int, collate, seed: int, position: int = 0):
        if len(instances) == 0:
            raise BertkitError("the training data has no instances: prepare more text or hold out fewer for evaluation")
        self.instances, self.batch_size, self.collate, self.seed = instances, batch_size, collate, seed
        self.position = position  # instances consumed before the current step
        self._perm_epoch, self._perm = -1, None

    def _order(self, epoch: int) -> torch.Tensor:
        if epoch != self._perm_epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm, self._perm_epoch = torch.randperm(len(self.instances), generator=g), epoch
        return self._perm

    def indices(self, start: int, count: int) -> list[int]:
        n = len(self.instances)
        return [int(self._order(p // n)[p % n]) for p in range(start, start + count)]

    def micro_batch(self, slot: int) -> tuple[dict, str]:
        """The batch at micro-batch `slot` after the current position, and a description of it."""
        start = self.position + slot * self.batch_size
        idx = self.indices(start, self.batch_size)
        g = torch.Generator().manual_seed(self.seed * 7_919 + start)
        where = f"training positions {start}..{start + self.batch_size - 1} (instances {idx[:4]}{'...' if len(idx) > 4 else ''})"
        return self.collate([self.instances[i] for i in idx], g), where

    def advance(self, micro_batches: int) -> None:
        self.position += micro_batches * self.batch_size

    def state(self) -> dict:
        return {"position": self.position, "seed": self.seed, "num_instances": len(self.instances)}


# --- metrics from one forward pass -------------------------------------------------


def batch_metrics(out, batch: dict) -> dict:
    """Counts for MLM and NSP/SOP accuracy from one output (sums, so they add up)."""
    mask = batch.get("attention_mask", batch.get("input_ids"))
    m = {"tokens": float(mask.sum()) if "attention_mask" in batch else float(mask.numel() if mask is not None else 0)}
    labels = batch.get("labels")
    # BertForPreTraining names its MLM logits prediction_logits; BertForMaskedLM (MLM alone) just logits
    logits = out.prediction_logits if hasattr(out, "prediction_logits") else getattr(out, "logits", None)
    if labels is not None and logits is not None:
        masked = labels != -100
        target = labels[masked]
        # the head may project only the masked positions ([M, V]) or all of them ([B, T, V])
        pred = (logits[masked] if logits.dim() == 3 else logits).argmax(-1)
        m["mlm_correct"] = float((pred == target).sum())
        m["mlm_total"] = float(target.numel())
    nsp = getattr(out, "seq_relationship_logits", None)
    nsp_labels = batch.get("next_sentence_label")
    if nsp is not None and nsp_labels is not None:
        m["nsp_correct"] = float((nsp.argmax(-1) == nsp_labels).sum())
        m["nsp_total"] = float(nsp_labels.numel())
    return m


def add_counts(total: dict, more: dict) -> dict:
    for k, v in more.items():
        total[k] = total.get(k, 0.0) + v
    return total


def accuracies(counts: dict) -> dict:
    out = {}
    if counts.get("mlm_total"):
        out["mlm_acc"] = counts["mlm_correct"] / counts["mlm_total"]
    if counts.get("nsp_total"):
        out["nsp_acc"] = counts["nsp_correct"] / counts["nsp_total"]
    return out


@torch.no_grad()
def evaluate(model, batches: list, autocast) -> dict:
    """Mean loss and accuracies over held-out batches, plus the MLM frequent-token baseline.

    The baseline is the accuracy of always predicting the most frequent masked
    token of this slice: what a model that learnt only unigram statistics gets.
    """
    was_training = model.training
    model.eval()
    losses, counts, freq = [], {}, {}
    for batch in batches:
        with autocast():
            out = model(**batch)
        losses.append(float(out.loss))
        add_counts(counts, batch_metrics(out, batch))
        labels = batch["labels"][batch["labels"] != -100]
        for tok, c in zip(*torch.unique(labels, return_counts=True)):
            freq[int(tok)] = freq.get(int(tok), 0) + int(c)
    model.train(was_training)
    result = {"loss": sum(losses) / max(1, len(losses)), **accuracies(counts)}
    if freq:
        result["mlm_baseline"] = max(freq.values()) / sum(freq.values())
    return result


# --- the loop ----------------------------------------------------------------------


def autocast_for(precision: str, device: str):
    """A context factory: bf16 autocast (CPU or GPU), fp16 autocast (GPU), or nothing."""
    device_type = "cuda" if device.startswith("cuda") else "cpu"
    if precision == "fp32":
        return contextlib.nullcontext
    if precision == "fp16" and device_type != "cuda":
        raise BertkitError("--precision fp16 needs a CUDA GPU (its GradScaler); on the CPU use --precision bf16")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return lambda: torch.autocast(device_type, dtype=dtype)


def move(batch: dict, device: str) -> dict:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def train_loop(model, optimizer, stream: BatchStream, cfg: RunConfig, *, info=None, start_step: int = 0,
               eval_batches=None, scaler=None, on_step=None, on_checkpoint=None, progress: bool = True) -> list:
    """Train from `start_step` to cfg.max_steps. Returns the logged training records.

    on_step(record) receives every logged record (train and eval), on rank 0;
    on_checkpoint(step) is called every cfg.save_every steps and at the end.
    """
    from tqdm import tqdm

    info = info or distributed.DistInfo()
    autocast = autocast_for(cfg.precision, info.device)
    warmup = warmup_steps_for(cfg.max_steps, cfg.optim.warmup_ratio)
    kill_at = int(os.environ.get(KILL_AT_STEP_ENV, -1))
    A, W = cfg.grad_accum, info.world_size
    records = []
    bar = tqdm(total=cfg.max_steps, initial=start_step, desc="pretrain", unit="step",
               disable=not (progress and info.is_main), dynamic_ncols=True)
    model.train()
    for step in range(start_step, cfg.max_steps):
        t0 = time.perf_counter()
        lr = lr_at(step, peak_lr=cfg.optim.learning_rate, warmup_steps=warmup, total_steps=cfg.max_steps,
                   schedule=cfg.optim.schedule)
        set_lr(optimizer, lr)
        counts, loss_sum, bad = {}, 0.0, []
        for a in range(A):
            # slots count from the stream's position, which advances by W * A micro-batches per step
            batch, where = stream.micro_batch(micro_batch_slot(0, a, info.rank, W, A))
            batch = move(batch, info.device)
            # DDP reads no_sync at forward time, FSDP at backward time: wrap both
            with distributed.no_sync(model, skip=a < A - 1):
                with autocast():
                    out = model(**batch)
                loss = out.loss.float()
                if step == kill_at and a == A - 1:
                    os.kill(os.getpid(), signal.SIGKILL)
                if not torch.isfinite(loss):
                    bad.append(f"micro-batch {a} ({where}): loss {loss.item()}")
                (scaler.scale(loss / A) if scaler else loss / A).backward()
            loss_sum += loss.item() / A
            add_counts(counts, batch_metrics(out, batch))
        if scaler:
            scaler.unscale_(optimizer)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.max_grad_norm or float("inf"))
        # every rank must agree to stop, or the others would wait forever in the next all-reduce
        flags = distributed.sum_over_ranks({"bad": float(len(bad))}, info)
        if flags["bad"] or (not torch.isfinite(norm) and scaler is None):
            if bad:
                detail = "; ".join(bad)
            elif not torch.isfinite(norm):
                detail = f"the loss was finite but the gradient norm is {float(norm)}"
            else:
                detail = "the loss of another rank was not finite"
            bar.close()
            raise NonFiniteLoss(
                f"non-finite loss at step {step + 1} on rank {info.rank}: {detail}. "
                "Lower --learning-rate, keep --max-grad-norm on, or use --precision fp32"
            )
        if scaler:
            scaler.step(optimizer)  # skipped (and the scale lowered) when fp16 gradients overflowed
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        stream.advance(A * W)
        dt = time.perf_counter() - t0

        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.max_steps:
            counts = distributed.sum_over_ranks(counts, info)
            loss_mean = distributed.mean_over_ranks({"loss": loss_sum}, info)["loss"]
            rec = {"split": "train", "step": step + 1, "loss": loss_mean, **accuracies(counts),
                   "lr": lr, "grad_norm": float(norm), "tokens_per_s": counts["tokens"] / dt}
            records.append(rec)
            if info.is_main:
                bar.set_postfix({k: _short(rec[k]) for k in ("loss", "mlm_acc", "nsp_acc", "lr", "tokens_per_s") if k in rec})
                if on_step:
                    on_step(rec)
        if eval_batches and cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.max_steps):
            rec = {"split": "eval", "step": step + 1, **evaluate(model, eval_batches, autocast)}
            if info.is_main and on_step:
                on_step(rec)
        if on_checkpoint and ((step + 1) % cfg.save_every == 0 or step + 1 == cfg.max_steps):
            on_checkpoint(step + 1)
        bar.update(1)
    bar.close()
    return records


def _short(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1e-2 or abs(x) >= 1e4 else f"{x:.4f}"


# --- wiring: model, optimizer, data, checkpoints, files -------------------------------


def build_model(cfg: RunConfig, vocab_size: int, objective: str, resumed_config: dict | None = None):
    """A fresh BertForPreTraining (MLM + NSP/SOP) or BertForMaskedLM (objectives "none", "single"),
    or with --init-from one that starts from that checkpoint's weights. On --resume, the
    architecture the checkpoint recorded (`resumed_config`), whose weights then replace these:
    neither the --config file nor the --init-from directory has to exist any more."""
    from bertkit.config import PRESETS, BertConfig
    from bertkit.heads import BertForMaskedLM, BertForPreTraining

    cls = BertForPreTraining if objective in ("nsp", "sop") else BertForMaskedLM
    changes = {} if cfg.dropout is None else {"hidden_dropout_prob": cfg.dropout, "attention_probs_dropout_prob": cfg.dropout}
    g = torch.Generator().manual_seed(cfg.seed)  # the same initial weights on every rank
    if resumed_config is not None:
        return cls(BertConfig.from_dict(resumed_config).replace(**changes), generator=g)
    if cfg.init_from:
        return continued_model(cls, cfg, changes, g)
    if cfg.config in PRESETS:
        config = BertConfig.preset(cfg.config)
    elif Path(cfg.config).is_file():
        config = BertConfig.from_json_file(cfg.config)
    else:
        raise BertkitError(f"--config {cfg.config!r} is neither a preset ({', '.join(PRESETS)}) nor a config.json file")
    return cls(config.replace(vocab_size=vocab_size, **changes), generator=g)


def continued_model(cls, cfg: RunConfig, changes: dict, generator: torch.Generator):
    """Continued pre-training (e.g. domain- or task-adaptive, Gururangan et al. 2020): `cls`
    holding the weights of the checkpoint --init-from names. Its vocabulary must be the
    prepared data's, token for token; only an NSP/SOP head it lacks (and the pooler
    that feeds it: masked-LM checkpoints have none) may start fresh."""
    source = Path(cfg.init_from)
    model_vocab, data_vocab = source / "vocab.txt", Path(cfg.data) / "vocab.txt"
    if not model_vocab.is_file():
        raise BertkitError(f"--init-from {source}: no vocab.txt there, so its vocabulary cannot be checked against the data's")
    if model_vocab.read_text(encoding="utf-8") != data_vocab.read_text(encoding="utf-8"):
        raise BertkitError(f"--init-from {source}: its vocab.txt differs from {data_vocab}; prepare the data with --vocab {source}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the report is checked just below
        model = cls.from_pretrained(source, strict=False, generator=generator, **changes)
    report = model.load_report
    fresh_head = [k for k in report.missing if k.startswith(("cls.seq_relationship.", "pooler."))]
    if len(fresh_head) < len(report.missing) or report.unexpected or report.mismatched:
        raise BertkitError(f"--init-from {source} does not fit {cls.__name__}: {report.describe()}")
    return model.train()


def build_optimizer(model, cfg: RunConfig):
    """AdamW (bertkit.optim) or LAMB, both without weight decay on biases and LayerNorm."""
    from bertkit.optim import build_optimizer as build_adamw

    if cfg.optimizer == "adamw":
        return build_adamw(model, cfg.optim)
    from bertkit.lamb import Lamb

    groups = param_groups(model, cfg.optim.weight_decay)
    groups[1]["trust_ratio"] = False  # like the reference: no layer adaptation where there is no decay
    o = cfg.optim
    return Lamb(groups, lr=o.learning_rate, betas=(o.adam_beta1, o.adam_beta2), eps=o.adam_epsilon)


class MetricsLog:
    """metrics.jsonl: one JSON object per line, appended and flushed as training goes."""

    def __init__(self, path: Path, keep_through_step: int | None = None):
        self.path = Path(path)
        if keep_through_step is None:
            self.path.write_text("")
        else:  # resuming: drop what the killed run logged after its last checkpoint
            kept = [r for r in read_metrics(self.path) if r["step"] <= keep_through_step]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))

    def __call__(self, record: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


def read_metrics(path) -> list:
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _running_mean(values, window: int) -> list:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def plot_curves(metrics_path, png_path) -> None:
    """Loss, MLM accuracy, NSP/SOP accuracy and learning rate against step, train and eval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = read_metrics(metrics_path)
    train = [r for r in recs if r["split"] == "train"]
    evals = [r for r in recs if r["split"] == "eval"]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for ax, key, title in zip(axes.flat, ("loss", "mlm_acc", "nsp_acc", "lr"),
                              ("loss", "MLM accuracy", "NSP / SOP accuracy", "learning rate")):
        pts = [(r["step"], r[key]) for r in train if key in r]
        if pts:
            steps, values = zip(*pts)
            if key == "lr":
                ax.plot(steps, values, linewidth=1, label="train")
            else:  # one batch is noisy: the raw values faint, a running mean over ~2% of the run on top
                ax.plot(steps, values, linewidth=0.5, alpha=0.3, color="tab:blue")
                ax.plot(steps, _running_mean(values, max(1, len(values) // 50)), linewidth=1.2,
                        color="tab:blue", label="train (running mean)")
        pts = [(r["step"], r[key]) for r in evals if key in r]
        if pts:
            ax.plot(*zip(*pts), "o-", color="tab:orange", label="eval (held out)", markersize=3, linewidth=1)
        if key == "mlm_acc" and evals and "mlm_baseline" in evals[-1]:
            ax.axhline(evals[-1]["mlm_baseline"], color="grey", linestyle="--", label="most frequent token")
        if key == "nsp_acc":
            ax.axhline(0.5, color="grey", linestyle="--", label="chance")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)


# --- one run, end to end --------------------------------------------------------------


class Subset:
    """instances[indices[i]] without copying: the training rest or the held-out slice."""

    def __init__(self, seq, indices):
        self.seq, self.indices = seq, indices

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, i: int):
        return self.seq[int(self.indices[i])]


def held_out_split(data_dir, num_instances: int, n_eval: int, seed: int):
    """(train_indices, eval_indices): whole documents held out, so eval text is never trained on.

    With dupe_factor > 1 the same sentences appear in several instances, so a
    slice of instances would leak into training; instead documents are drawn in
    a seeded order until their instances reach `n_eval`; the held-out slice
    is instances whose segment A comes from them, and every instance touching
    one of them (as A or B) leaves the training set. Reads the instance shards'
    `docs.npy` ([n, 2] document of A and B, -1: none or several; see prepare).

    Sequences packed across documents (objective "none") record no document. If
    the corpus went into them once (dupe factor 1), every token is in exactly
    one instance, so a seeded sample of instances is held out instead; with
    more passes their text repeats elsewhere and nothing is held out.
    """
    import numpy as np

    if n_eval == 0:
        return np.arange(num_instances), np.arange(0)
    manifest = json.loads((Path(data_dir) / "manifest.json").read_text())
    docs = np.concatenate([np.load(Path(data_dir) / e["path"] / "docs.npy") for e in manifest["shards"]])
    assert len(docs) == num_instances, "docs.npy does not match the dataset"
    doc_a = docs[:, 0]
    known, counts = np.unique(doc_a[doc_a >= 0], return_counts=True)
    if not len(known) and manifest["dupe_factor"] == 1 and num_instances > 1:
        in_eval = np.zeros(num_instances, dtype=bool)
        in_eval[np.random.default_rng([seed, 17]).permutation(num_instances)[:min(n_eval, num_instances - 1)]] = True
        return np.flatnonzero(~in_eval), np.flatnonzero(in_eval)
    count_of = dict(zip(known.tolist(), counts.tolist()))
    held, covered = [], 0
    for d in np.random.default_rng([seed, 17]).permutation(known).tolist():
        if covered >= n_eval or len(held) + 1 >= len(known):  # always leave a document to train on
            break
        held.append(d)
        covered += count_of[d]
    touches = np.isin(docs, held).any(axis=1)
    # segment B of a "random next" pair comes from another document: keep those pairs
    # (their A is held out), or the slice would hold only "is next" pairs
    eval_idx = np.flatnonzero(np.isin(doc_a, held))[:n_eval]
    return np.flatnonzero(~touches), eval_idx


def open_prepared(cfg: RunConfig, seed: int):
    """The prepared data: (dataset, train Subset, eval Subset, collate, tokenizer)."""
    from bertkit.pretraining.dataset import PretrainingDataset

    if not Path(cfg.data).is_dir():
        raise BertkitError(f"no prepared data at {cfg.data}: make it with `bertkit pretrain prepare CORPUS -o {cfg.data}`")
    ds = PretrainingDataset(cfg.data, seed=seed)
    n_eval = cfg.eval_sequences if cfg.eval_every else 0
    train_idx, eval_idx = held_out_split(cfg.data, len(ds), n_eval, seed)
    return ds, Subset(ds, train_idx), Subset(ds, eval_idx), ds.collator(seed=seed), ds.tokenizer()


def resolve_config(args) -> RunConfig:
    """The run's settings: the flags, or on --resume the saved ones with the flags given on top."""
    from bertkit.pretraining.run_config import from_args

    cfg = from_args(args)
    saved = Path(cfg.output) / "run_config.json"
    if cfg.resume:
        if not saved.is_file():
            raise BertkitError(f"--resume: {saved} not found; start the run without --resume first")
        given = {f for f in vars(args) if getattr(args, f, None) is not None}
        base = RunConfig.load(saved)
        for name, value in vars(cfg).items():
            if name == "optim":
                for k, v in vars(value).items():
                    if k in given:
                        setattr(base.optim, k, v)
            elif name in given:
                setattr(base, name, value)
        base.resume = True
        cfg = base
    return cfg.validate()


def run_from_args(args) -> None:
    run(resolve_config(args))


def run(cfg: RunConfig, progress: bool = True) -> Path:
    """Pre-train as `cfg` says; returns the output directory (a Hugging Face checkpoint)."""
    from bertkit.training_state import CHECKPOINT_DIR

    cfg.validate()
    info = distributed.setup(cfg.device)
    try:
        out = Path(cfg.output)
        if info.is_main:
            out.mkdir(parents=True, exist_ok=True)
            if not cfg.resume and (out / CHECKPOINT_DIR).is_dir() and latest_checkpoint(out):
                raise BertkitError(f"{out} already holds a run: pass --resume to continue it, or another --output")
        distributed.barrier(info)
        dataset, train_set, eval_set, collate, tokenizer = open_prepared(cfg, cfg.seed)
        if cfg.eval_every and cfg.eval_sequences and not len(eval_set) and info.is_main:
            warnings.warn(f"no held-out evaluation: {cfg.data} has no document that can be held out whole "
                          "(evaluation holds out whole documents and needs at least two; packed sequences "
                          "only with --dupe-factor 1, where no text repeats)", stacklevel=2)
        g_eval = torch.Generator().manual_seed(cfg.seed + 1)  # one fixed masking of the held-out slice
        eval_batches = [move(collate([eval_set[i] for i in range(s, min(s + cfg.batch_size, len(eval_set)))], g_eval),
                             info.device) for s in range(0, len(eval_set), cfg.batch_size)]

        torch.manual_seed(cfg.seed + info.rank)  # dropout: a different stream per rank
        vocab_size, objective = dataset.vocab_size, dataset.objective
        state = resume_state(out, len(train_set), info.world_size) if cfg.resume else None
        # the architecture the checkpoint recorded (None in checkpoints from before it did: the flags say)
        resumed_config = state.get("model_config") if state else None
        model = build_model(cfg, vocab_size, objective, resumed_config).to(info.device)
        model_cls, model_config = type(model), model.config  # a plain copy to save into under FSDP
        model = distributed.wrap(model, info, cfg.fsdp)
        if cfg.compile:
            model = torch.compile(model)
        optimizer = build_optimizer(model, cfg)
        scaler = torch.amp.GradScaler("cuda") if cfg.precision == "fp16" else None

        start_step, position = 0, 0
        if state is not None:
            distributed.load_state_dicts(model, optimizer, state["model"], state["optimizer"])
            if scaler is not None and state.get("scaler"):
                scaler.load_state_dict(state["scaler"])
            restore_rng(state["rng"][info.rank])
            start_step, position = state["step"], state["data"]["position"]
            del state  # the loaded copy of the weights and optimizer moments: not needed any more
        if info.is_main:  # on resume: the saved settings with the flags given on top
            cfg.save(out / "run_config.json")
        stream = BatchStream(train_set, cfg.batch_size, collate, cfg.seed, position)
        log = MetricsLog(out / "metrics.jsonl", keep_through_step=start_step if cfg.resume else None) if info.is_main else None

        def checkpoint(step: int) -> None:
            model_state, optim_state = distributed.state_dicts(model, optimizer)  # a collective under FSDP
            rngs = distributed.gather_objects(capture_rng(), info)
            if info.is_main:
                state = {"model": model_state, "optimizer": optim_state, "rng": rngs, "data": stream.state(),
                         "scheduler": {"schedule": cfg.optim.schedule, "step": step, "total_steps": cfg.max_steps},
                         "scaler": scaler.state_dict() if scaler else None, "model_config": model_config.to_dict(),
                         "extra": {"run_config": cfg.to_dict()}}
                save_checkpoint(out, step, state, keep=cfg.keep_last)
            distributed.barrier(info)

        train_loop(model, optimizer, stream, cfg, info=info, start_step=start_step, eval_batches=eval_batches,
                   scaler=scaler, on_step=log, on_checkpoint=checkpoint, progress=progress)

        if info.is_main:
            final = distributed.unwrap(model)
            if distributed.is_fsdp(model):  # gather the shards into a plain model to save it
                final = model_cls(model_config)
                final.load_state_dict(distributed.state_dicts(model, optimizer)[0])
            save_final(final, out, tokenizer)
            plot_curves(out / "metrics.jsonl", out / "curves.png")
        elif distributed.is_fsdp(model):
            distributed.state_dicts(model, optimizer)  # take part in the gather
        distributed.barrier(info)
        return out
    finally:
        distributed.teardown()


def resume_state(out: Path, num_instances: int, world_size: int) -> dict:
    """The latest checkpoint of the run in `out`, after checking it fits this data and world size."""
    from bertkit.training_state import CHECKPOINT_DIR

    path = latest_checkpoint(out)
    if path is None:
        raise BertkitError(f"--resume: no checkpoint in {out / CHECKPOINT_DIR}; start the run without --resume")
    state = load_checkpoint(path)
    if state["data"]["num_instances"] != num_instances:
        raise BertkitError(
            f"--resume: the data changed ({state['data']['num_instances']} training instances when "
            f"checkpointed, {num_instances} now); resume on the same prepared directory"
        )
    if len(state["rng"]) != world_size:
        raise BertkitError(f"--resume: the run used {len(state['rng'])} processes, now {world_size}: use the same number")
    return state


def save_final(model, out: Path, tokenizer) -> None:
    """The Hugging Face checkpoint (with vocab.txt) the fine-tuning and feature tools load directly."""
    model.cpu().save_pretrained(out, tokenizer=tokenizer)

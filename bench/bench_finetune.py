"""Fine-tuning side by side: bertkit's loop against transformers' Trainer.

Same pretrained model (the packaged all-MiniLM-L6-v2), same training subset,
max_length, batch size, learning rate, warm-up ratio, weight decay, linear
decay, epochs, seed and length-grouped batches, in one process. The peer is
`transformers.Trainer` with the pre/post-processing of its example scripts:
run_glue.py (DataCollatorWithPadding) for SST-2 and run_ner.py (labels on the
first piece of each word via the fast tokenizer's word_ids,
DataCollatorForTokenClassification) for CoNLL-2003, run_qa.py
(prepare_train_features with stride and offsets, n-best post-processing) for
SQuAD v1.1 split by article. Both are scored with the
same metric code (bertkit.metrics.tasks: accuracy; conlleval entity F1 on
IOB2 tags, where run_ner.py would call seqeval, which is not installed here;
the official SQuAD F1).

Reported: the dev metric after the last epoch and the training time per
epoch (batches only: evaluation and checkpoint saving excluded for both).
The new classifier head starts from the same weights in both (ours, copied
into theirs); batch order and dropout masks still differ (each library
draws them its own way), so the metrics agree within noise, not exactly.

--precision bf16 trains both in bf16 autocast (torch.autocast on the CPU, float32
weights and optimizer state): ours `TrainConfig(precision="bf16")`, as `bertkit
finetune --precision bf16`; theirs `TrainingArguments(bf16=True)`, which autocasts
through accelerate; --task step wraps both steps in the same autocast. Evaluation
differs: ours scores in float32, the Trainer under autocast (accelerate wraps the
model's forward), so the metrics may differ by that too; the times count training only.
On a CPU without native bf16 (AVX2 only) autocast emulates it: slow for both.

    python bench/bench_finetune.py --task sst2 --train 1000 --epochs 2 [--write]
    python bench/bench_finetune.py --task conll --train 1000 --epochs 2 [--write]
    python bench/bench_finetune.py --task squad --train 1000 --epochs 1 --max-length 256 --precision bf16 [--write]
"""

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from harness import SHARED_DATA, load_line, machine_line, report  # noqa: E402

from bertkit.default_model import default_model_dir  # noqa: E402
from bertkit.errors import BertkitError  # noqa: E402
from bertkit.metrics import tasks as M  # noqa: E402
from bertkit.tasks.config import TrainConfig  # noqa: E402
from bertkit.training.optim import OptimConfig  # noqa: E402


def train_config(args, metric):
    return TrainConfig(epochs=args.epochs, batch_size=args.batch_size, eval_batch_size=64, seed=args.seed,
                       metric=metric, progress=False, precision=args.precision,
                       optim=OptimConfig(learning_rate=args.learning_rate, warmup_ratio=0.1, weight_decay=0.01))


def training_args(transformers, args, out, eval_strategy="epoch"):
    return transformers.TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=64,
        learning_rate=args.learning_rate, num_train_epochs=args.epochs, warmup_steps=0.1, weight_decay=0.01,
        lr_scheduler_type="linear", seed=args.seed, train_sampling_strategy="group_by_length",
        eval_strategy=eval_strategy, save_strategy="no", logging_strategy="no", report_to="none",
        disable_tqdm=True, use_cpu=True, dataloader_num_workers=0, bf16=args.precision == "bf16")


def epoch_timer(transformers):
    class Timer(transformers.TrainerCallback):
        def __init__(self):
            self.times, self.evals = [], []

        def on_epoch_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_epoch_end(self, *a, **k):
            self.times.append(time.perf_counter() - self.t0)

        def on_evaluate(self, args, state, control, metrics=None, **k):
            self.evals.append(metrics)

    return Timer()


def train_theirs(transformers, args, tmp, model, train_ds, dev_ds, collator, compute_metrics):
    """transformers' Trainer with evaluation every epoch: (epoch timer with evals, wall seconds)."""
    timer = epoch_timer(transformers)
    trainer = transformers.Trainer(model=model, args=training_args(transformers, args, tmp / "theirs"),
                                   train_dataset=train_ds, eval_dataset=dev_ds, data_collator=collator,
                                   compute_metrics=compute_metrics, callbacks=[timer])
    t0 = time.perf_counter()
    trainer.train()
    return timer, time.perf_counter() - t0


def copy_head(ours_head: torch.nn.Linear, theirs_head: torch.nn.Linear):
    with torch.no_grad():
        theirs_head.weight.copy_(ours_head.weight)
        theirs_head.bias.copy_(ours_head.bias)


# --- SST-2 -------------------------------------------------------------------

def bench_sst2(args, transformers, tmp):
    from bertkit.tasks.classification import TextTaskConfig, finetune_text
    from bertkit.data.tables import read_text_examples
    from bertkit.tasks.run import load_head
    from bertkit.model.heads import BertForSequenceClassification

    data = SHARED_DATA / "sst2"
    model_dir = default_model_dir()
    cfg = TextTaskConfig(train=str(data / "train.tsv"), dev=str(data / "dev.tsv"), output=str(tmp / "ours"),
                         max_length=args.max_length, max_train_examples=args.train, max_dev_examples=args.dev,
                         training=train_config(args, "accuracy"))
    t0 = time.perf_counter()
    ours = finetune_text(cfg, log=lambda s: None)
    ours_wall = time.perf_counter() - t0

    train_ex, _ = read_text_examples(data / "train.tsv", max_examples=args.train)
    dev_ex, _ = read_text_examples(data / "dev.tsv", max_examples=args.dev)
    tok = transformers.BertTokenizerFast.from_pretrained(str(model_dir))

    def encode(examples):
        return [dict(tok(e.text, truncation=True, max_length=args.max_length), labels=int(e.label)) for e in examples]

    train_ds, dev_ds = encode(train_ex), encode(dev_ex)
    labels = {"0": 0, "1": 1}
    model = transformers.BertForSequenceClassification.from_pretrained(
        str(model_dir), num_labels=2, id2label={0: "0", 1: "1"}, label2id=labels)
    ours_init = load_head(BertForSequenceClassification, model_dir, args.seed, lambda s: None, num_labels=2)
    copy_head(ours_init.classifier, model.classifier)

    def compute_metrics(p):
        return {"accuracy": M.accuracy(list(p.predictions.argmax(-1)), list(p.label_ids))}

    timer, theirs_wall = train_theirs(transformers, args, tmp, model, train_ds, dev_ds,
                                      transformers.DataCollatorWithPadding(tok), compute_metrics)
    return {
        "task": f"SST-2 ({args.train} train / {len(dev_ex)} dev, max_length {args.max_length})",
        "metric": "accuracy",
        "ours": (ours["epochs"][-1]["accuracy"], [e["train_seconds"] for e in ours["epochs"]], ours_wall),
        "theirs": (timer.evals[-1]["eval_accuracy"], timer.times, theirs_wall),
    }


# --- CoNLL-2003 ----------------------------------------------------------------

def bench_conll(args, transformers, tmp):
    from bertkit.data.tables import read_conll
    from bertkit.tasks.ner import NerConfig, finetune_ner
    from bertkit.tasks.run import load_head
    from bertkit.model.heads import BertForTokenClassification

    data = SHARED_DATA / "conll2003"
    model_dir = default_model_dir()
    cfg = NerConfig(train=str(data / "train.txt"), dev=str(data / "dev.txt"), output=str(tmp / "ours"),
                    tag_scheme="iob1", max_length=args.max_length, max_train_examples=args.train,
                    max_dev_examples=args.dev, training=train_config(args, "f1"))
    t0 = time.perf_counter()
    ours = finetune_ner(cfg, log=lambda s: None)
    ours_wall = time.perf_counter() - t0

    train_s = read_conll(data / "train.txt")[0][: args.train]
    dev_s = read_conll(data / "dev.txt")[0][: args.dev]
    names = sorted({t for s in train_s for t in M.iob1_to_iob2(s.tags)}, key=lambda t: (t != "O", t[2:], t[:1]))
    label2id = {n: i for i, n in enumerate(names)}
    tok = transformers.BertTokenizerFast.from_pretrained(str(model_dir))

    def encode(sents):  # run_ner.py's tokenize_and_align_labels, label_all_tokens=False
        out = []
        for s in sents:
            enc = tok(s.words, is_split_into_words=True, truncation=True, max_length=args.max_length)
            tags, labels, prev = M.iob1_to_iob2(s.tags), [], None
            for w in enc.word_ids():
                labels.append(-100 if w is None or w == prev else label2id[tags[w]])
                prev = w
            out.append(dict(enc, labels=labels))
        return out

    train_ds, dev_ds = encode(train_s), encode(dev_s)

    def compute_metrics(p):  # as run_ner.py: gold and predicted tags at the labelled (first) pieces
        pred, gold = [], []
        for row, lab in zip(p.predictions.argmax(-1), p.label_ids):
            pred.append([names[k] for k, y in zip(row, lab) if y != -100])
            gold.append([names[y] for y in lab if y != -100])
        return {"f1": M.entity_scores(pred, gold)["f1"]}

    model = transformers.BertForTokenClassification.from_pretrained(
        str(model_dir), num_labels=len(names), id2label=dict(enumerate(names)), label2id=label2id)
    ours_init = load_head(BertForTokenClassification, model_dir, args.seed, lambda s: None, num_labels=len(names))
    copy_head(ours_init.classifier, model.classifier)
    timer, theirs_wall = train_theirs(transformers, args, tmp, model, train_ds, dev_ds,
                                      transformers.DataCollatorForTokenClassification(tok), compute_metrics)
    return {
        "task": f"CoNLL-2003 NER ({args.train} train / {len(dev_s)} dev sentences, max_length {args.max_length})",
        "metric": "entity F1",
        "ours": (ours["epochs"][-1]["f1"], [e["train_seconds"] for e in ours["epochs"]], ours_wall),
        "theirs": (timer.evals[-1]["eval_f1"], timer.times, theirs_wall),
    }


# --- SQuAD v1.1 (article split of the dev file) ---------------------------------

def bench_squad(args, transformers, tmp):
    from bertkit.data.squad import read_squad
    from bertkit.tasks.qa import QAConfig, finetune_qa
    from bertkit.tasks.run import load_head
    from bertkit.model.heads import BertForQuestionAnswering

    path = SHARED_DATA / "squad_v1.1" / "dev-v1.1.json"
    model_dir = default_model_dir()
    max_len = args.max_length
    stride = 64 if max_len >= 192 else 32
    cfg = QAConfig(train=str(path), dev=str(path), train_articles="0:40", dev_articles="40:48",
                   output=str(tmp / "ours"), max_length=max_len, doc_stride=stride, max_query_length=64,
                   max_train_examples=args.train, max_dev_examples=args.dev, training=train_config(args, "f1"))
    t0 = time.perf_counter()
    ours = finetune_qa(cfg, log=lambda s: None)
    ours_wall = time.perf_counter() - t0

    train_ex, _ = read_squad(path, articles="0:40", max_examples=args.train)
    dev_ex, _ = read_squad(path, articles="40:48", max_examples=args.dev)
    tok = transformers.BertTokenizerFast.from_pretrained(str(model_dir))

    def tokenize(examples):
        return tok([e.question.lstrip() for e in examples], [e.context for e in examples], truncation="only_second",
                   max_length=max_len, stride=stride, return_overflowing_tokens=True, return_offsets_mapping=True)

    def train_features(examples):  # run_qa.py prepare_train_features
        enc, out = tokenize(examples), []
        for k, i in enumerate(enc["overflow_to_sample_mapping"]):
            text, s_char = examples[i].answers[0]
            e_char = s_char + len(text)
            seq, offs = enc.sequence_ids(k), enc["offset_mapping"][k]
            a, b = seq.index(1), len(seq) - 1 - seq[::-1].index(1)
            if not (offs[a][0] <= s_char and offs[b][1] >= e_char):
                start = end = 0
            else:
                while a < len(offs) and seq[a] == 1 and offs[a][0] <= s_char:
                    a += 1
                while seq[b] == 1 and offs[b][1] >= e_char:
                    b -= 1
                start, end = a - 1, b + 1
            out.append({"input_ids": enc["input_ids"][k], "token_type_ids": enc["token_type_ids"][k],
                        "attention_mask": enc["attention_mask"][k], "start_positions": start, "end_positions": end})
        return out

    enc_dev = tokenize(dev_ex)
    dev_ds = [{"input_ids": enc_dev["input_ids"][k], "token_type_ids": enc_dev["token_type_ids"][k],
               "attention_mask": enc_dev["attention_mask"][k]} for k in range(len(enc_dev["input_ids"]))]

    def postprocess(start_logits, end_logits, n_best=20, max_answer=30):  # run_qa.py / utils_qa.py
        best = {}
        for k, i in enumerate(enc_dev["overflow_to_sample_mapping"]):
            seq, offs = enc_dev.sequence_ids(k), enc_dev["offset_mapping"][k]
            s_log, e_log = start_logits[k], end_logits[k]
            for si in np.argsort(s_log)[-1:-n_best - 1:-1]:
                for ei in np.argsort(e_log)[-1:-n_best - 1:-1]:
                    if si >= len(offs) or ei >= len(offs) or seq[si] != 1 or seq[ei] != 1:
                        continue
                    if ei < si or ei - si + 1 > max_answer:
                        continue
                    score = s_log[si] + e_log[ei]
                    if i not in best or score > best[i][0]:
                        best[i] = (score, dev_ex[i].context[offs[si][0]:offs[ei][1]])
        return {ex.id: best.get(i, (0, ""))[1] for i, ex in enumerate(dev_ex)}

    refs = {ex.id: [t for t, _ in ex.answers] for ex in dev_ex}

    model = transformers.BertForQuestionAnswering.from_pretrained(str(model_dir))
    ours_init = load_head(BertForQuestionAnswering, model_dir, args.seed, lambda s: None)
    copy_head(ours_init.qa_outputs, model.qa_outputs)
    timer = epoch_timer(transformers)
    # eval_strategy "no": the unlabelled windows are scored after training with run_qa.py's post-processing
    trainer = transformers.Trainer(model=model, args=training_args(transformers, args, tmp / "theirs", "no"),
                                   train_dataset=train_features(train_ex),
                                   data_collator=transformers.DataCollatorWithPadding(tok), callbacks=[timer])
    t0 = time.perf_counter()
    trainer.train()
    start, end = trainer.predict(dev_ds).predictions[:2]
    theirs_wall = time.perf_counter() - t0
    timer.evals.append({"eval_f1": M.squad_scores(postprocess(start, end), refs)["f1"]})
    return {
        "task": f"SQuAD v1.1 ({args.train} questions of articles 0-39 / {len(dev_ex)} of articles 40-47, "
                f"max_length {max_len}, stride {stride})",
        "metric": "F1",
        "ours": (ours["epochs"][-1]["f1"], [e["train_seconds"] for e in ours["epochs"]], ours_wall),
        "theirs": (timer.evals[-1]["eval_f1"], timer.times, theirs_wall),
    }


# --- one training step, interleaved -----------------------------------------------

def bench_step(args, transformers, tmp):
    """Forward + backward + AdamW step on the same [B, T] QA batch, ours and theirs alternating.

    The epoch timings above run one contender after the other; on a shared
    machine the load can change between them. This isolates the per-update
    cost that dominates an epoch and times both round-robin (harness.interleaved).
    """
    from harness import interleaved

    from bertkit.model.heads import BertForQuestionAnswering
    from bertkit.training.optim import OptimConfig, build_optimizer

    model_dir = default_model_dir()
    g = torch.Generator().manual_seed(0)
    B, T = args.batch_size, args.max_length
    batch = dict(input_ids=torch.randint(1000, 20000, (B, T), generator=g),
                 attention_mask=torch.ones(B, T, dtype=torch.long),
                 token_type_ids=(torch.arange(T) >= 24).long().expand(B, T).contiguous(),
                 start_positions=torch.randint(24, T, (B,), generator=g),
                 end_positions=torch.randint(24, T, (B,), generator=g))
    ours = BertForQuestionAnswering.from_pretrained(model_dir, strict=False).train()
    theirs = transformers.BertForQuestionAnswering.from_pretrained(str(model_dir)).train()
    opt_ours = build_optimizer(ours, OptimConfig(learning_rate=1e-5))
    hf_args = training_args(transformers, args, tmp / "theirs", "no")
    opt_theirs = transformers.Trainer(model=theirs, args=hf_args).create_optimizer()

    autocast = ((lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if args.precision == "bf16"
                else contextlib.nullcontext)

    def step(model, opt):
        def run():
            with autocast():  # the forward only, as both training loops do
                loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        return run

    times = interleaved({"bertkit": step(ours, opt_ours), "transformers": step(theirs, opt_theirs)},
                        rounds=args.rounds, warmup=1)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"task": f"one QA training step, batch {B} x {T} tokens, {args.precision} "
                    f"(interleaved, {args.rounds} rounds)",
            "metric": "-", "ours": (float("nan"), [med["bertkit"]], 0.0),
            "theirs": (float("nan"), [med["transformers"]], 0.0)}


def precision_suffix(args) -> str:
    """The bf16 runs get their own title and docs section, next to the float32 ones."""
    return "" if args.precision == "fp32" else f", {args.precision}"


def markdown(results, args) -> str:
    lines = [f"### Fine-tuning ({args.task}{precision_suffix(args)}): bertkit vs transformers.Trainer", "",
             f"Machine: {machine_line('transformers')}; {load_line()}.",
             f"Settings: {args.epochs:g} epochs, batch {args.batch_size}, learning rate {args.learning_rate:g}, "
             f"precision {args.precision}{' (bf16 autocast, both)' if args.precision == 'bf16' else ''}, "
             f"warm-up 10%, linear decay, weight decay 0.01, seed {args.seed}, length-grouped batches. "
             "Time per epoch counts the training batches only (median over epochs); ratio = their time / ours "
             "(above 1.0: we are faster). Command: "
             f"`OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')} python bench/bench_finetune.py "
             f"{' '.join(a for a in sys.argv[1:] if a != '--write')}`.",
             "",
             "| task | metric | bertkit | Trainer | bertkit s/epoch | Trainer s/epoch | speed ratio |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        (mo, to, _), (mt, tt, _) = r["ours"], r["theirs"]
        so, st = statistics.median(to), statistics.median(tt)
        if r["metric"] == "-":  # a timing-only row (--task step): seconds per update
            lines.append(f"| {r['task']} | - | - | - | {so:.2f} s/step | {st:.2f} s/step | {st / so:.2f}x |")
            continue
        lines.append(f"| {r['task']} | {r['metric']} | {mo:.4f} | {mt:.4f} | {so:.1f} | {st:.1f} | {st / so:.2f}x |")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", choices=["sst2", "conll", "squad", "step", "all"], default="all")
    p.add_argument("--rounds", type=int, default=5, help="--task step: timed rounds per contender")
    p.add_argument("--train", type=int, default=1000)
    p.add_argument("--dev", type=int, default=None)
    p.add_argument("--epochs", type=float, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--learning-rate", type=float, default=1e-4)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="training precision of both: fp32, or bf16 autocast (float32 weights)")
    p.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    args = p.parse_args()
    import transformers

    transformers.logging.set_verbosity_error()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn in (("sst2", bench_sst2), ("conll", bench_conll), ("squad", bench_squad), ("step", bench_step)):
            if args.task in (name, "all"):
                try:
                    results.append(fn(args, transformers, Path(tmp) / name))
                except BertkitError as e:  # settings the task refuses (a --max-length too short, a label only dev has)
                    sys.exit(f"bench_finetune.py --task {name}: {e} "
                             "(this script sets it from --train, --dev, --max-length)")
                print(results[-1], file=sys.stderr)
    section = f"finetune-{args.task}" + ("" if args.precision == "fp32" else f"-{args.precision}")
    report(section, markdown(results, args), args.write)


if __name__ == "__main__":
    main()

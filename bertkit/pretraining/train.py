"""Pre-training: masked LM (+ next-sentence or sentence-order) on prepared shards.

Devlin et al. 2019, section 3.1 and appendix A.2; google-research/bert
`run_pretraining.py`. The run is the one every training run takes
(`bertkit.training.harness` around `bertkit.training.loop`); this module
hands it what pre-training is: the model (fresh, from --init-from, or as a
resumed checkpoint recorded it), the seekable stream of masked micro-batches,
MLM and NSP/SOP accuracy, and the evaluation on held-out documents
(`bertkit.pretraining.held_out`).

The batch stream: position p of the endless training order is instance
perm_e[p % n] of epoch e = p // n, with a fresh permutation per epoch drawn
from a generator seeded by (seed, e), and each micro-batch masked with a
generator seeded by its first position. So any micro-batch is a pure function
of (seed, position): a resumed run draws the very same batches and masks, and
seeking costs nothing.

Files written to OUTPUT: run_config.json, metrics.jsonl (one JSON object per
logged step, `"split": "train"` or `"eval"`), checkpoints/step-N.pt (the last
K), curves.png, and the final Hugging Face checkpoint (config.json,
model.safetensors, vocab.txt) at the top level.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from bertkit.data.outputs import run_output
from bertkit.model.config import ELECTRA_PRESETS, BertConfig, IGNORE_INDEX, PRESETS
from bertkit.model.electra_pretraining import ElectraPretrainingModel, electra_metrics
from bertkit.errors import BertkitError
from bertkit.pretraining.held_out import log_label_balance, open_prepared
from bertkit.pretraining.run_config import RunConfig, electra_only, electra_preset, preset_note
from bertkit.training import harness
from bertkit.training.loop import LoopConfig, add_counts, autocast_for, move
from bertkit.model.electra import ElectraConfig
from bertkit.model.heads import BertForMaskedLM, BertForPreTraining
from bertkit.model.checkpoint import read_config
from bertkit.runtime.loading import need_transformer


# --- the stream of batches ---------------------------------------------------------


class BatchStream:
    """Seekable micro-batches over `instances` (a sequence supporting len() and [i]).

    The training order is a fresh permutation of the instances every epoch
    (torch.randperm with a generator seeded by (seed, epoch)), and position p
    in that endless order is instance perm[p // n][p % n]: any position is
    reachable at once. `collate(list_of_instances, generator)` makes the batch
    tensors (dynamic masking draws from the generator, seeded by the batch's
    position, so a batch is the same whenever it is drawn).
    """

    def __init__(self, instances, batch_size: int, collate, seed: int, position: int = 0, prepared: str | None = None):
        if len(instances) == 0:
            raise BertkitError("the training data has no instances: prepare more text or hold out fewer for evaluation")
        self.instances, self.batch_size, self.collate, self.seed = instances, batch_size, collate, seed
        self.prepared = prepared  # the data folder's fingerprint: a resume checks it is the same data
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
        return {"position": self.position, "seed": self.seed, "num_instances": len(self.instances),
                **({"prepared": self.prepared} if self.prepared else {})}


def with_sample_seed(collate):
    """ELECTRA samples its replacements from a seed drawn from the batch's own generator (seeded
    by its position), so they are a pure function of the batch, as its masks are: 2 DDP ranks
    draw what one process accumulating 2 micro-batches draws, and a resumed run the same."""

    def collate_seeded(instances, generator):
        batch = collate(instances, generator)
        batch["sample_seed"] = torch.randint(0, 2**62, (), generator=generator)
        return batch

    return collate_seeded


# --- metrics from one forward pass -------------------------------------------------


def batch_metrics(out, batch: dict) -> dict:
    """Counts for MLM and NSP/SOP accuracy from one output (sums, so they add up); an ELECTRA
    step counts its generator and discriminator itself."""
    if hasattr(out, "counts"):
        return out.counts()
    m = {}
    labels = batch.get("labels")
    # BertForPreTraining names its MLM logits prediction_logits; BertForMaskedLM (MLM alone) just logits
    logits = out.prediction_logits if hasattr(out, "prediction_logits") else getattr(out, "logits", None)
    if labels is not None and logits is not None:
        masked = labels != IGNORE_INDEX
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


def accuracies(counts: dict, pair: str = "nsp") -> dict:
    """The rates of summed counts; the pair task's accuracy named after the data's task (`pair`, its objective):
    nsp_acc for NSP, sop_acc for SOP (an SOP run logged nsp_acc, a next-sentence figure it does not measure)."""
    if "disc_total" in counts:
        return electra_metrics(counts)
    out = {}
    if counts.get("mlm_total"):
        out["mlm_acc"] = counts["mlm_correct"] / counts["mlm_total"]
    if counts.get("nsp_total"):  # the counts of the head's two-way [CLS] task, NSP's or SOP's
        out[f"{pair}_acc"] = counts["nsp_correct"] / counts["nsp_total"]
    return out


def loss_sums(out, batch: dict, disc_weight: float = 1.0) -> list:
    """One output's loss as (term, its mean x the items it is a mean over, the items, the term's weight) per
    term: MLM over the masked tokens, NSP/SOP over the pairs, ELECTRA's discriminator over the real tokens
    (weighted by --disc-weight, as in training). Summed over batches, they give each term's mean over the set."""
    if hasattr(out, "disc_loss"):  # ELECTRA: loss = mlm_loss + disc_weight * disc_loss (its sums made below too:
        # returned as means once, the held-out loss came out as a sum of means over the items, 0.13 beside 41)
        terms = [("mlm", out.mlm_loss, out.targets.numel(), 1.0), ("disc", out.disc_loss, out.real.sum(), disc_weight)]
    else:
        masked = (batch["labels"] != IGNORE_INDEX).sum()
        terms = [("mlm", out.mlm_loss if hasattr(out, "mlm_loss") else out.loss, masked, 1.0)]  # MLM alone: its loss
        if getattr(out, "nsp_loss", None) is not None:
            terms.append(("nsp", out.nsp_loss, batch["next_sentence_label"].numel(), 1.0))
    return [(name, float(mean) * float(n), float(n), w) for name, mean, n, w in terms if mean is not None and n]


@torch.no_grad()
def evaluate(model, batches: list, autocast, disc_weight: float = 1.0, pair: str = "nsp") -> dict:
    """Loss and accuracies over held-out batches (`pair`: the data's pair task, `accuracies`), plus the MLM
    frequent-token baseline.

    The loss is the training objective over the whole slice: each term's mean over all of its items (the MLM
    cross-entropy per masked token, NSP/SOP per pair), summed as in training. A mean of the batches' losses
    weighed a small last batch, or one with few masks, as much as a full one.
    The baseline is the accuracy of always predicting the most frequent masked
    token of this slice: what a model that learnt only unigram statistics gets.
    """
    was_training = model.training
    model.eval()
    sums, counts, freq = {}, {}, {}
    for batch in batches:
        with autocast():
            out = model(**batch)
        for name, total, n, weight in loss_sums(out, batch, disc_weight):
            before = sums.get(name, (0.0, 0.0, weight))
            sums[name] = (before[0] + total, before[1] + n, weight)
        add_counts(counts, batch_metrics(out, batch))
        labels = batch["labels"][batch["labels"] != IGNORE_INDEX]
        for tok, c in zip(*torch.unique(labels, return_counts=True)):
            freq[int(tok)] = freq.get(int(tok), 0) + int(c)
    model.train(was_training)
    loss = sum(weight * total / n for total, n, weight in sums.values() if n)
    result = {"loss": float(loss), **accuracies(counts, pair)}
    if freq:
        result["mlm_baseline"] = max(freq.values()) / sum(freq.values())
    return result


# --- the model ------------------------------------------------------------------------


def build_model(cfg: RunConfig, vocab_size: int, objective: str, resumed_config: dict | None = None):
    """A fresh BertForPreTraining (MLM + NSP/SOP) or BertForMaskedLM (objectives "none", "single"),
    or with --init-from one that starts from that checkpoint's weights. On --resume, the
    architecture the checkpoint recorded (`resumed_config`), whose weights then replace these:
    neither the --config file nor the --init-from directory has to exist any more.
    --method electra: an ElectraPretrainingModel whose discriminator has that shape."""
    changes = {} if cfg.dropout is None else {"hidden_dropout_prob": cfg.dropout, "attention_probs_dropout_prob": cfg.dropout}
    g = torch.Generator().manual_seed(cfg.seed)  # the same initial weights on every rank
    if cfg.method == "electra":
        return electra_model(cfg, vocab_size, objective, resumed_config, changes, g)
    cls = BertForPreTraining if objective in ("nsp", "sop") else BertForMaskedLM
    if resumed_config is not None:
        return cls(BertConfig.from_dict(resumed_config).replace(**changes), generator=g)
    if cfg.init_from:
        return continued_model(cls, cfg, changes, g)
    return cls(preset_or_file(cfg.config, cfg.method).replace(vocab_size=vocab_size, **changes), generator=g)


def check_fits(config, dataset) -> None:
    """Refuse a model the prepared instances do not fit, before its first step would: too few
    positions for their length, or one segment type for NSP/SOP pairs."""
    if config.max_position_embeddings < dataset.max_seq_length:
        raise BertkitError(f"the model's max_position_embeddings {config.max_position_embeddings} is shorter than "
                           f"the data's instances (up to {dataset.max_seq_length} tokens): raise it in the config, or "
                           f"prepare the data with --max-seq-length {config.max_position_embeddings}")
    if dataset.objective in ("nsp", "sop") and config.type_vocab_size < 2:
        raise BertkitError(f"the model's type_vocab_size {config.type_vocab_size} has no segment B for the data's "
                           f"{dataset.objective.upper()} pairs: set it to 2, or prepare with --objective none")


def preset_or_file(name: str, method: str = "bert"):
    """--config: a BERT preset or config.json; with --method electra also an ELECTRA config.json (a run's own,
    or transformers'), read as one so that its embedding_size holds."""
    if name in PRESETS:
        return BertConfig.preset(name)
    if electra_preset(name):
        if method != "electra":
            raise BertkitError(electra_only(name))
        return ElectraConfig.preset(electra_preset(name))
    if Path(name).is_file():
        values = read_config(name)  # once: its kind and its settings are one file's
        kind = values.get("model_type", "bert")
        if kind == "electra" and method != "electra":
            raise BertkitError(f"--config {name} is an ELECTRA config (model_type 'electra'): pre-train it with "
                               "--method electra, or give a BERT config")
        return (ElectraConfig if kind == "electra" else BertConfig).from_file_dict(values, Path(name))
    raise BertkitError(f"--config {name!r} is neither a preset ({', '.join(PRESETS)}) nor a config.json file")


def electra_model(cfg: RunConfig, vocab_size: int, objective: str, resumed_config, changes: dict, g):
    """ELECTRA (Clark et al. 2020): the discriminator in --config's shape (its embedding size the
    hidden size unless a config.json says otherwise), the generator --generator-size of it,
    sharing the embeddings. Single segments only: ELECTRA has no sentence-pair task."""
    if objective in ("nsp", "sop"):
        raise BertkitError(f"--method electra reads single segments, but {cfg.data} holds {objective.upper()} pairs: "
                           "prepare the data with --objective none")
    if resumed_config is not None:
        config = ElectraConfig.from_dict(resumed_config)
    elif cfg.init_from:
        source, config = init_source(cfg)
        return ElectraPretrainingModel.from_pretrained(source, disc_weight=cfg.disc_weight, config_json=config,
                                                       **changes).train()
    else:
        config = preset_or_file(cfg.config, cfg.method)
        if not isinstance(config, ElectraConfig):  # a BERT shape: embeddings as wide as the hidden layers
            base = config.to_dict()
            base.pop("model_type", None)
            base.setdefault("embedding_size", base["hidden_size"])
            config = ElectraConfig.from_dict(base)
        config = config.replace(vocab_size=vocab_size)
    config = config.replace(**changes)
    return ElectraPretrainingModel(config, config.generator_config(cfg.generator_fraction()),
                                   disc_weight=cfg.disc_weight, generator=g)


def generator_note(config: ElectraConfig, size: float) -> str | None:
    """What --generator-size became where it is not that fraction: the generator keeps the discriminator's
    head size, so its share rounds to whole heads, at least one (a 2-head model's 0.25 is one head: half)."""
    gen = config.generator_config(size)
    got = gen.hidden_size / config.hidden_size
    if abs(got - size) < 1e-9:
        return None
    heads = f"{gen.num_attention_heads} head{'s' if gen.num_attention_heads != 1 else ''}"
    return (f"generator: {heads} of {config.head_size}, hidden {gen.hidden_size} = {got:g} of the discriminator's "
            f"{config.hidden_size} (--generator-size {size:g} rounds to whole heads of the discriminator's, at least one)")


def namesake_note(cfg: RunConfig) -> str | None:
    """What an ELECTRA run of a BERT preset named as one of ELECTRA's models builds, where that is not the ELECTRA
    model: BERT-small is 4 layers x 512, ELECTRA-Small 12 x 256 with 128-wide embeddings (--config electra-small)."""
    if cfg.method != "electra" or cfg.init_from or cfg.config not in ELECTRA_PRESETS:
        return None
    layers, hidden, heads = PRESETS[cfg.config]
    size = cfg.generator_fraction()
    e_layers, e_hidden, e_heads, e_embedding, e_size = ELECTRA_PRESETS[cfg.config]
    if (layers, hidden, heads, hidden, size) == (e_layers, e_hidden, e_heads, e_embedding, e_size):
        return None  # large: the same model
    return (f"--config {cfg.config} is BERT-{cfg.config}'s shape ({layers} layers, hidden {hidden}, {heads} heads, "
            f"embeddings {hidden}, a generator {size:.3g} of it); the ELECTRA paper's ELECTRA-{cfg.config.capitalize()} "
            f"({e_layers} layers, hidden {e_hidden}, {e_heads} heads, embeddings {e_embedding}, generator {e_size:.3g}) "
            f"is --config electra-{cfg.config}")


def init_source(cfg: RunConfig) -> tuple[Path, dict]:
    """The --init-from folder and its config.json, read once (whether it is static, its kind and the model built
    are then one save's, should another land meanwhile), once its vocab.txt is the prepared data's, token for
    token (BERT and ELECTRA)."""
    source = Path(cfg.init_from)
    files = need_transformer(source, "continued pre-training (--init-from)")
    config = files[1] if files and isinstance(files[1], dict) else read_config(source)  # else: its error
    model_vocab, data_vocab = source / "vocab.txt", Path(cfg.data) / "vocab.txt"
    if not model_vocab.is_file():
        raise BertkitError(f"--init-from {source}: no vocab.txt there, so its vocabulary cannot be checked against the data's")
    if model_vocab.read_text(encoding="utf-8") != data_vocab.read_text(encoding="utf-8"):
        raise BertkitError(f"--init-from {source}: its vocab.txt differs from {data_vocab}; prepare the data with --vocab {source}")
    return source, config


def continued_model(cls, cfg: RunConfig, changes: dict, generator: torch.Generator):
    """Continued pre-training (e.g. domain- or task-adaptive, Gururangan et al. 2020): `cls`
    holding the weights of the checkpoint --init-from names. Its vocabulary must be the
    prepared data's, token for token; only an NSP/SOP head it lacks (and the pooler
    that feeds it: masked-LM checkpoints have none) may start fresh."""
    source, config = init_source(cfg)
    if config.get("model_type", "bert") == "electra":  # BertConfig's refusal did not name the flag
        raise BertkitError(f"--init-from {source} is an ELECTRA model: continue its pre-training with --method electra")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the report is checked just below
        model = cls.from_pretrained(source, strict=False, generator=generator, config_json=config, **changes)
    report = model.load_report
    fresh_head = [k for k in report.missing if k.startswith(("cls.seq_relationship.", "pooler."))]
    if len(fresh_head) < len(report.missing) or report.unexpected or report.mismatched:
        why = ("; it has no masked-LM head (a sentence model, or a fine-tuned one): continue from a pre-training "
               "output (BertForPreTraining, BertForMaskedLM)") if any(k.startswith("cls.predictions.")
                                                                       for k in report.missing) else ""
        raise BertkitError(f"--init-from {source} does not fit {cls.__name__}: {report.describe()}{why}")
    return model.train()


# --- one run, end to end --------------------------------------------------------------


def run(cfg: RunConfig, progress: bool = True, speed=None) -> Path:
    """Pre-train as `cfg` says; returns the output directory (a Hugging Face checkpoint). OUTPUT is checked
    first (`bertkit.data.outputs`: a model or run there only with --overwrite or --resume; not --data or
    --init-from) and locked while the run writes it (`bertkit.data.lock`; torchrun: by rank 0)."""
    cfg.validate()
    with run_output(cfg.output, "bertkit pretrain run", overwrite=cfg.overwrite, resume=cfg.resume,
                    sources={"the prepared data": cfg.data, "the model": cfg.init_from}):
        return _run(cfg, progress, speed)


def _run(cfg: RunConfig, progress: bool, speed=None) -> Path:
    out = Path(cfg.output)
    with harness.processes(cfg.device) as info:
        dataset, train_set, eval_set, collate, tokenizer = open_prepared(cfg, cfg.seed)
        if cfg.method == "electra":
            collate = with_sample_seed(collate)
        if info.is_main:
            log_label_balance(train_set, eval_set, cfg)
            if dataset.masking_note():
                print(dataset.masking_note())
        g_eval = torch.Generator().manual_seed(cfg.seed + 1)  # one fixed masking of the held-out slice
        eval_batches = [move(collate([eval_set[i] for i in range(s, min(s + cfg.batch_size, len(eval_set)))], g_eval),
                             info.device) for s in range(0, len(eval_set), cfg.batch_size)]

        def build(extras: dict | None):
            # the architecture the checkpoint recorded (None in checkpoints from before it did: the flags say)
            model = build_model(cfg, dataset.vocab_size, dataset.objective, extras.get("model_config") if extras else None)
            check_fits(model.config, dataset)
            return model

        loop = LoopConfig(max_steps=cfg.max_steps, grad_accum=cfg.grad_accum, precision=cfg.precision,
                          log_every=cfg.log_every, eval_every=cfg.eval_every, save_every=cfg.save_every,
                          optim=cfg.optim, desc="pretrain")
        settings = harness.RunSettings(out, loop, cfg.seed, resume=cfg.resume, keep_last=cfg.keep_last,
                                       optimizer=cfg.optimizer, fsdp=cfg.fsdp, compile=cfg.compile, progress=progress,
                                       run_config=cfg.to_dict(), speed=speed)
        stream = BatchStream(train_set, cfg.batch_size, collate, cfg.seed, prepared=dataset.fingerprint)
        job = harness.start(settings, info, stream, build)
        if info.is_main and cfg.method == "electra" and not cfg.init_from:  # --init-from: the saved generator's size
            for note in (namesake_note(cfg), preset_note(cfg), generator_note(job.config, cfg.generator_fraction())):
                if note:
                    print(note)
        model_config = job.config.to_dict()  # recorded in checkpoints, rebuilt to gather FSDP shards
        pair = dataset.objective  # the pair task (nsp, sop) whose accuracy the records name
        autocast = autocast_for(cfg.precision, info.device)
        harness.train(job, harness.Hooks(
            evaluate=(lambda m, step: evaluate(m, eval_batches, autocast, cfg.disc_weight, pair)) if eval_batches
            else None, count=batch_metrics, rates=lambda counts: accuracies(counts, pair),
            extras=lambda step: {"scheduler": {"schedule": cfg.optim.schedule, "step": step, "total_steps": cfg.max_steps},
                                 "model_config": model_config, "extra": {"run_config": cfg.to_dict()}}))
        final = harness.final_model(job, lambda: build({"model_config": model_config}))
        if final is not None:
            save_final(final, out, tokenizer)
        harness.finish(job, ELECTRA_PANELS if cfg.method == "electra" else panels(pair), references(out, pair))
        if info.is_main:
            print(final_summary(out))
    return out


def references(out: Path, pair: str = "nsp") -> dict:
    """The curves' reference lines: chance for NSP/SOP, the most frequent masked token for MLM."""
    evals = [r for r in harness.run_metrics(out) if r["split"] == "eval" and "mlm_baseline" in r]
    return {f"{pair}_acc": [(0.5, "chance")],
            "mlm_acc": [(evals[-1]["mlm_baseline"], "most frequent token")] if evals else []}


def panels(pair: str) -> tuple:
    """The curves of a BERT run; the pair task's accuracy named after the data's objective (an SOP run's lines
    written before it had its name hold it as nsp_acc: read too, as a resumed run's earlier steps)."""
    accuracy = (("sop_acc", "nsp_acc"), "SOP accuracy") if pair == "sop" else ("nsp_acc", "NSP accuracy")
    return ("loss", "loss"), ("mlm_acc", "MLM accuracy"), accuracy, ("lr", "learning rate")


ELECTRA_PANELS = (("loss", "loss (MLM + weight x discriminator)"), ("mlm_acc", "generator MLM accuracy"),
                  ("disc_acc", "discriminator accuracy"), ("disc_precision", "precision on replaced tokens"),
                  ("disc_recall", "recall on replaced tokens"), ("lr", "learning rate"))


def final_summary(out: Path) -> str:
    """Where the run put its model and the last held-out figures (from metrics.jsonl): a run's last words."""
    evals = [r for r in harness.run_metrics(out) if r["split"] == "eval"]
    where = f"saved the model to {out}/ (model.safetensors, config.json, vocab.txt; curves in curves.png)"
    if not evals:
        return f"{where}; no held-out evaluation ran (--eval-every, or a held-out set from prepare)"
    last = evals[-1]
    shown = ", ".join(f"{k} {v:.4f}" for k, v in last.items() if isinstance(v, float) and k in HELD_OUT_FIGURES)
    return f"{where}; held out at step {last['step']}: {shown}"


HELD_OUT_FIGURES = ("loss", "mlm_loss", "mlm_acc", "mlm_baseline", "nsp_acc", "sop_acc", "disc_acc", "disc_precision",
                    "disc_recall")


def save_final(model, out: Path, tokenizer) -> None:
    """The Hugging Face checkpoint (with vocab.txt) the fine-tuning and feature tools load directly."""
    model.cpu().save_pretrained(out, tokenizer=tokenizer)

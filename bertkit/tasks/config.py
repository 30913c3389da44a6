"""The settings of a fine-tuning run, defined once: typed dataclasses, no torch.

`bertkit finetune TASK` builds its options from these fields
(`bertkit.options`), the run writes them to OUTPUT/run_config.json, and
`--resume` reads them back with the flags given on top (only the "resumable" ones, the run's
length and bookkeeping, may differ from the saved values). `stride` is always the
OVERLAP: the tokens consecutive windows of one long input share.

    TrainConfig      the loop: epochs, batches, accumulation, precision, device, checkpoints, AdamW
    TextTaskConfig   classify | pair | regression | multi_label (bertkit.tasks.classification)
    NerConfig        words -> tags (bertkit.tasks.ner)
    QAConfig         question + context -> answer span (bertkit.tasks.qa)
    EmbedConfig      sentence embeddings (bertkit.tasks.embedding)
    RerankConfig     a cross-encoder reranker from a BEIR folder or labelled pairs (bertkit.tasks.cross_encoder)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from bertkit.embeddings.settings import AUTO, SENTENCE_CHOICES
from bertkit.model.config import CLASSIFIER_POOLINGS
from bertkit.errors import BertkitError, bool_settings, not_negative, positive
from bertkit.training import PRECISIONS, paths_as_text
from bertkit.training.optim import OptimConfig

TAG_SCHEMES = ("bio", "iob1")


def _opt(default, help: str, **more):
    return field(default=default, metadata={"help": help, **more})


@dataclass
class TrainConfig:
    """Fine-tuning loop settings; defaults follow the BERT paper's fine-tuning recipe."""

    epochs: float = _opt(3.0, "passes over the training set (BERT uses 2-4)", resumable=True)
    batch_size: int = _opt(32, "training features per micro-batch and process")
    grad_accum: int = _opt(1, "micro-batches accumulated into one update (its batch: batch size x this x processes)")
    eval_batch_size: int = _opt(64, "features per forward pass when evaluating", resumable=True)
    max_steps: int | None = _opt(None, "stop after this many updates", resumable=True)
    seed: int = _opt(42, "seeds batch order, dropout and the weights of a head the model gets new (where it gets one)")
    group_by_length: bool = _opt(True, "batch features of similar length together (less padding)")
    metric: str | None = _opt(None, "the held-out figure that picks the best epoch (default: the task's own); "
                                    "it needs a held-out set: without one nothing is scored, the last epoch is "
                                    "saved and --metric is refused")
    greater_is_better: bool = _opt(True, "a higher --metric is better", cli=False)
    precision: Literal["fp32", "bf16", "fp16"] = _opt("fp32", "fp32, bf16 (autocast, CPU or GPU) or fp16 (GPU)")
    device: Literal["auto", "cpu", "cuda"] = _opt("auto", "where to train: auto picks a CUDA GPU when there is one",
                                                  resumable=True)
    save_every: int = _opt(0, "checkpoint for --resume every N updates (0: at the end of every epoch)", resumable=True)
    keep_last: int = _opt(1, "checkpoints to keep while the run trains", resumable=True)
    keep_checkpoint: bool = _opt(False, "keep the last checkpoint (weights, Adam moments, best epoch: ~3x the model) "
                                        "after the run finishes, to --resume it later with more --epochs; by default "
                                        "a finished run deletes it and keeps the model", resumable=True)
    resume: bool = _opt(False, "continue the run in --output from its last checkpoint")
    overwrite: bool = _opt(False, "replace what --output already holds (a model or a run); without it such a "
                           "folder is refused")
    # --quiet: the other commands' word for it
    progress: bool = _opt(True, "show progress bars", resumable=True, flags=["--progress", "--quiet"])
    optim: OptimConfig = field(default_factory=OptimConfig)

    def __post_init__(self):
        bool_settings(self)  # overwrite="false" is a true str: it replaced the folder

    def validate(self) -> "TrainConfig":
        positive(self.epochs, "--epochs", " (BERT uses 2-4)")
        for name in ("batch_size", "grad_accum", "eval_batch_size", "keep_last"):
            if getattr(self, name) < 1:
                raise BertkitError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.max_steps is not None and self.max_steps < 1:
            raise BertkitError(f"--max-steps must be >= 1, got {self.max_steps}")
        if self.save_every < 0:
            raise BertkitError(f"--save-every must be >= 0 (0: every epoch), got {self.save_every}")
        if self.precision not in PRECISIONS:
            raise BertkitError(f"unknown --precision {self.precision!r}: choose one of {', '.join(PRECISIONS)}")
        self.optim.validate()
        from bertkit.training.loop import check_device  # here: it needs torch, the settings do not

        check_device(self.device, self.precision)
        return self


@dataclass
class TaskConfig:
    """What every task reads and writes; `training` the loop settings."""

    train: str = _opt(None, "training file", required=True, path=True)
    output: str = _opt(None, "output directory for the checkpoint and metrics", short="-o", required=True)
    dev: str | None = _opt(None, "dev file, evaluated after each epoch", path=True)
    model: str | None = _opt(None, "pretrained model directory (default: the packaged all-MiniLM-L6-v2)", path=True)
    max_length: int = _opt(128, "tokens per input window; when not given, fewer where the model has fewer positions")
    max_train_examples: int | None = _opt(None, "use only the first N training examples")
    max_dev_examples: int | None = _opt(None, "evaluate on the first N dev examples only", needs=("dev", None))
    training: TrainConfig = field(default_factory=TrainConfig)

    # the settings a run fits to its model when they are not given: the command line and `finetune()` build the
    # config with None for them (a config built by hand holds its defaults, as ever)
    FITTED: ClassVar[tuple] = ("max_length",)
    FITTED_LENGTH: ClassVar[int | None] = None  # the default max_length fitted (None: the field's default)

    def __post_init__(self):
        paths_as_text(self)  # a notebook's pathlib.Path, held as the command line's str
        bool_settings(self)  # "false" is a true str

    def fit(self, positions: int | None) -> str | None:
        """Settle the settings not given (None, `FITTED`) that depend on the model's length: max_length is the
        field's default, or the model's `positions` (max_position_embeddings) where fewer, said in the line
        returned. The default was refused as if typed ('--max-length 128 is above the 64 positions'); a value
        given is still checked against the positions (`bertkit.runtime.loading.check_length`)."""
        if self.max_length is not None:
            return None
        default = self.FITTED_LENGTH or type(self).__dataclass_fields__["max_length"].default
        self.max_length = min(default, positions or default)
        if self.max_length == default:
            return None
        return (f"max length {self.max_length}: the model's {positions} positions, fewer than the default "
                f"{default} (--max-length sets another)")

    def validate(self, low: int = 8):
        for name in ("train", "output"):
            if not getattr(self, name):
                raise BertkitError(f"--{name} is required")
        if self.max_length is not None and not low <= self.max_length <= 512:  # None: embed's, the model's
            raise BertkitError(f"--max-length must be in {low}..512, got {self.max_length}")
        for name in ("max_train_examples", "max_dev_examples"):  # 0 read one example, or all of them
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise BertkitError(f"--{name.replace('_', '-')} must be >= 1 (leave it out for every example), "
                                   f"got {getattr(self, name)}")
        self.training.validate()
        return self


@dataclass
class TextTaskConfig(TaskConfig):
    """A text classification/regression run (BERT section 4.1, GLUE)."""

    task: str = _opt("classify", "which text task (its record in bertkit.tasks.registry checks the name)", cli=False)
    text_column: str = _opt("sentence", "column with the text")
    text_pair_column: str | None = _opt(None, "column with the second text of a pair")
    label_column: str = _opt("label", "column with the label")
    label_separator: str = _opt(",", "separator between labels (multi-label); predictions are written joined by it")
    stride: int = _opt(0, "> 0: cut single texts longer than --max-length into windows overlapping by this many "
                          "tokens (the overlap) and average their logits (default 0: truncate, and say per file "
                          "how many were cut; `bertkit predict` says it too)")
    pooling: str = _opt("cls", "what the classifier reads: cls, BERT's pooled [CLS] vector, or mean, the average "
                               "of the last layer's token vectors (for MLM-only pre-trained BERT models; ELECTRA's head reads the "
                               "first token: cls only)",
                        choices=CLASSIFIER_POOLINGS)

    def validate(self) -> "TextTaskConfig":
        super().validate()
        if self.pooling not in CLASSIFIER_POOLINGS:
            raise BertkitError(f"unknown pooling {self.pooling!r}: use one of {', '.join(CLASSIFIER_POOLINGS)}")
        if not self.label_separator:  # str.split("") raised its ValueError once the model had loaded
            raise BertkitError("--label-separator must not be empty: give the text between two labels, e.g. ','")
        if self.stride and not 0 < self.stride < self.max_length - 2:
            raise BertkitError(f"--stride (window overlap) must be between 1 and --max-length - 3 "
                               f"({self.max_length - 3}), got {self.stride}: pass --stride "
                               f"{max(1, (self.max_length - 2) // 4)} (a quarter of the window), or 0 to truncate")
        return self


@dataclass
class NerConfig(TaskConfig):
    """Token classification, CoNLL style (BERT section 5.3)."""

    test: str | None = _opt(None, "a test file scored once with the best epoch's model", path=True)
    tag_scheme: str = _opt("bio", "tags of the files: bio (IOB2) or iob1 (CoNLL-2003's own)", choices=TAG_SCHEMES)
    stride: int = _opt(32, "overlap (tokens shared) of windows over sentences longer than --max-length; when not "
                           "given, a quarter of a --max-length under 128")
    token_column: int = _opt(0, "CoNLL column of the words")
    tag_column: int = _opt(-1, "CoNLL column of the tags")

    FITTED: ClassVar[tuple] = ("max_length", "stride")

    def fit(self, positions: int | None) -> str | None:
        """As every task's, and the windows' overlap: the default 32 is a quarter of the default 128, so a
        shorter max_length gets a quarter of itself (as QA's overlap is a half of its). The default was refused
        beside --max-length 32 as if typed ('--stride ... must be in 0..29, got 32')."""
        note = super().fit(positions)
        if self.stride is None:
            default = type(self).__dataclass_fields__["stride"].default
            self.stride = min(default, self.quarter())
            if self.stride != default:
                said = (f"stride {self.stride}: a quarter of max length {self.max_length}, as the default {default} "
                        f"is of 128 (--stride sets another)")
                note = f"{note}; {said}" if note else said
        return note

    def quarter(self) -> int:
        """A quarter of max_length: the overlap fitted, and the one a refusal offers (always < max_length - 2)."""
        return self.max_length // 4

    def validate(self) -> "NerConfig":
        super().validate()
        if self.tag_scheme not in TAG_SCHEMES:
            raise BertkitError(f"unknown --tag-scheme {self.tag_scheme!r}: use bio (IOB2) or iob1")
        if not 0 <= self.stride < self.max_length - 2:  # a --stride typed too long for --max-length
            raise BertkitError(f"--stride (window overlap) must be in 0..max_length-3 = {self.max_length - 3} at "
                               f"--max-length {self.max_length}, got {self.stride}: pass --stride "
                               f"{self.quarter()} (a quarter of it, as 32 is of 128), or leave --stride out")
        return self


@dataclass
class QAConfig(TaskConfig):
    """Extractive question answering, SQuAD (BERT section 4.2)."""

    max_length: int = _opt(384, "tokens per window: question + context + 3 special tokens; when not given, fewer "
                                "where the model has fewer positions")
    train_articles: str | None = _opt(None, "START:END slice of the training file's articles")
    dev_articles: str | None = _opt(None, "START:END slice of the dev file's articles", needs=("dev", None))
    doc_stride: int = _opt(128, "overlap (tokens shared) of consecutive context windows; when not given, at most "
                                "half of --max-length", flags=["--stride", "--doc-stride"])
    max_query_length: int = _opt(64, "question tokens kept; when not given, at most a quarter of --max-length")
    max_answer_length: int = _opt(30, "longest answer in tokens")
    n_best: int = _opt(20, "start/end candidates per window")
    version_2: bool = _opt(False, "SQuAD v2: questions may have no answer", flags=["--version-2-with-negative"])
    null_score_diff_threshold: float = _opt(0.0, "v2: predict no answer when null score - best span score exceeds this",
                                            needs=("version_2", True))

    FITTED: ClassVar[tuple] = ("max_length", "max_query_length", "doc_stride")

    def fit(self, positions: int | None) -> str | None:
        """As every task's, and the question's share and the windows' overlap: run_squad.py's 64 and 128, at most
        a quarter and half of a shorter max_length (the transformers QA pipeline's rule, as `bertkit predict` reads
        a Hugging Face QA checkpoint: `qa_inference.reading`)."""
        notes = [super().fit(positions)]
        fields = type(self).__dataclass_fields__
        # each fitted below its default is said in a line, as NER's overlap is (a run of --max-length 128 used
        # 32 and 64 where the help gives 64 and 128, without a word)
        if self.max_query_length is None:
            default = fields["max_query_length"].default
            self.max_query_length = min(default, self.max_length // 4)
            if self.max_query_length != default:
                notes.append(f"max query length {self.max_query_length}: a quarter of max length {self.max_length}, "
                             f"fewer than the default {default} (--max-query-length sets another)")
        if self.doc_stride is None:
            default = fields["doc_stride"].default
            self.doc_stride = min(default, self.max_length // 2)
            if self.doc_stride != default:
                notes.append(f"stride {self.doc_stride}: half of max length {self.max_length}, fewer than the "
                             f"default {default} (--stride sets another)")
        return "; ".join(n for n in notes if n) or None

    def validate(self) -> "QAConfig":
        super().validate(low=32)
        for flag, spec in (("--train-articles", self.train_articles), ("--dev-articles", self.dev_articles)):
            if spec and not re.fullmatch(r"\s*-?\d*\s*:\s*-?\d*\s*", spec):  # as data.squad.parse_range reads it
                raise BertkitError(f"{flag} {spec!r} is not START:END (e.g. 0:40)")
        if self.max_query_length < 1:  # 0 cut every question away and trained on contexts alone
            raise BertkitError(f"--max-query-length must be >= 1, got {self.max_query_length} (BERT uses 64)")
        if self.max_query_length + 3 + 8 > self.max_length:
            raise BertkitError(f"--max-query-length ({self.max_query_length}) leaves no room for the context "
                               f"in --max-length {self.max_length}; lower it")
        window = self.max_length - self.max_query_length - 3  # the context's tokens in one window
        if not 0 <= self.doc_stride < window:  # e.g. the default 128 beside --max-length 128
            raise BertkitError(f"--stride ({self.doc_stride}, the window overlap) must be smaller than the context "
                               f"window (max_length - max_query_length - 3 = {window}): pass --stride {window // 2} "
                               "(half the window), or a longer --max-length")
        if self.max_answer_length < 1 or self.n_best < 1:
            raise BertkitError(f"--max-answer-length and --n-best must be >= 1, got {self.max_answer_length} "
                               f"and {self.n_best}")
        return self


EMBED_LOSSES = ("mnrl", "cached-mnrl", "cosent")
# embed's --dev is one of two kinds, each with the figures its evaluation gives (what --metric may name, the
# first the default): a BEIR folder (retrieval, bertkit.retrieval.evaluation) or scored pairs (STS). Its record
# in bertkit.tasks.registry offers them all; the run checks the kind's.
EMBED_DEV = {"a BEIR folder": ("ndcg@10", "mrr@10", "map@100", "recall@10", "recall@100"),
             "scored pairs": ("spearman", "pearson")}


# `finetune embed --static`'s own defaults, on top of the embed task's (a flag given still wins):
# sentence-transformers' static recipe (Aarsen 2025) trains with MNRL at batch 2048, where in-batch
# negatives are the signal and a static model makes a big batch cheap, and no weight decay (its
# trainer's default). The rate is for a distilled start (bertkit distill static: rows of norm ~6);
# the recipe's 0.2 is for a N(0, 1) table (--learning-rate 0.2 from scratch). docs/distill.md
STATIC_RECIPE = {"training": {"batch_size": 2048, "optim": {"learning_rate": 0.05, "weight_decay": 0.0}}}


@dataclass
class EmbedConfig(TaskConfig):
    """Sentence embeddings, contrastive (Sentence-BERT; bertkit.tasks.embedding)."""

    train: str = _opt(None, "pairs (anchor, positive[, negative...] columns), scored pairs (sentence1, sentence2, "
                            "score) as TSV/CSV/JSONL, or a BEIR folder (its --train-split qrels become pairs)",
                      required=True, path=True)
    train_split: str | None = _opt(None, "qrels split of a BEIR --train folder (default: train)")
    dev: str | None = _opt(None, "evaluated after each epoch, the best epoch kept: a BEIR folder (retrieval, "
                                 "nDCG@10) or scored pairs (STS, Spearman)", path=True)
    dev_split: str | None = _opt(None, "qrels split of a BEIR --dev folder (default: dev)", needs=("dev", None))
    max_length: int | None = _opt(None, "tokens per text (default: the model's sentence-transformers "
                                        "max_seq_length, else 256; --static: where the start cuts), also where "
                                        "the saved model cuts")
    pooling: Literal["auto", "mean", "cls", "max"] = _opt("auto", "sentence vector: the token vectors' mean, their "
                                                          "maximum or [CLS] (auto: the model's sentence-transformers "
                                                          "pooling, else mean)")
    normalize: bool | None = _opt(None, "save the model as giving unit-length vectors, a 2_Normalize module (default: "
                                        "as the model's sentence-transformers layout says, else yes; --static: as "
                                        "its static folder says, else yes)")
    loss: Literal["mnrl", "cached-mnrl", "cosent"] | None = _opt(
        None, "mnrl: multiple-negatives ranking, in-batch negatives plus any negative columns; cached-mnrl: the "
              "same loss embedded in chunks of --mini-batch-size (GradCache), so --batch-size can be 512+ in the "
              "memory of one chunk; cosent: scored pairs (default: cosent for scored pairs, else mnrl). With "
              "in-batch negatives --grad-accum is NOT a bigger batch (each micro-batch is scored only against "
              "itself): for more negatives raise --batch-size with --loss cached-mnrl")
    mini_batch_size: int = _opt(32, "cached-mnrl: texts embedded at a time (memory, not the result)",
                                needs=("loss", "cached-mnrl"))
    scale: float = _opt(20.0, "similarity scale of the losses (1 / temperature)")
    matryoshka_dims: str | None = _opt(None, "comma-separated leading dimensions to train too (e.g. 384,256,128,64): "
                                             "Matryoshka, for vectors stored truncated")
    matryoshka_weights: str | None = _opt(None, "comma-separated weight of each --matryoshka-dims (default 1 each)")
    static: bool = _opt(False, "train a static embedding table (no transformer; sentence-transformers' static recipe): "
                               "MODEL's table when it is a static folder (bertkit distill static), else a new random "
                               "one over MODEL's vocabulary, --static-dim wide; its own defaults: --batch-size 2048, "
                               "--learning-rate 0.05 (0.2 from scratch), --weight-decay 0")
    static_dim: int = _opt(256, "--static without a static MODEL: the new table's width", needs=("static", True))

    FITTED_LENGTH: ClassVar[int | None] = 256  # without a sentence-transformers length (its default None: the layout's)
    # a run_config.json of a bertkit before 3c30d36 holds the splits' defaults then; a split beside a table is
    # refused now, and resuming such a run on a table of pairs was (`bertkit.options.from_args`)
    EARLIER_DEFAULTS: ClassVar[dict] = {"train_split": "train", "dev_split": "dev"}

    def validate(self) -> "EmbedConfig":
        # the checks every task makes (its own skipped them: --max-train-examples 0 was read as 1 example)
        super().validate()
        if self.loss is not None and self.loss not in EMBED_LOSSES:
            raise BertkitError(f"unknown --loss {self.loss!r}: choose one of {', '.join(EMBED_LOSSES)}")
        if self.pooling not in SENTENCE_CHOICES:
            raise BertkitError(f"unknown --pooling {self.pooling!r}: use {', '.join(SENTENCE_CHOICES)}")
        if self.mini_batch_size < 1 or not self.scale > 0:
            raise BertkitError(f"--mini-batch-size must be >= 1 and --scale > 0, got {self.mini_batch_size} "
                               f"and {self.scale}")
        self.matryoshka()
        if self.static and (self.static_dim < 1 or self.pooling not in (AUTO, "mean")):
            raise BertkitError("--static averages its tokens (--pooling mean) and needs --static-dim >= 1")
        return self

    def matryoshka(self) -> tuple[list[int] | None, list[float] | None]:
        """(dims, weights) of --matryoshka-dims and --matryoshka-weights ((None, None): no Matryoshka loss; weights
        None: 1 each). Read in `validate`, before the data: a nan weight trained on a nan loss, a negative one
        pushed its dimensions apart, a missing one was found once the model had loaded."""
        if not self.matryoshka_dims:
            if self.matryoshka_weights:
                raise BertkitError("--matryoshka-weights needs --matryoshka-dims")
            return None, None
        dims = _numbers(self.matryoshka_dims, int)
        if not dims or min(dims) < 1:
            raise BertkitError(f"--matryoshka-dims must be a comma-separated list of positive whole numbers, "
                               f"got {self.matryoshka_dims!r}")
        if not self.matryoshka_weights:
            return dims, None
        weights = _numbers(self.matryoshka_weights, float)
        if len(weights) != len(dims) or not all(0 < w < math.inf for w in weights):  # nan fails 0 < w
            raise BertkitError(f"--matryoshka-weights must be a comma-separated list of positive numbers, one per "
                               f"--matryoshka-dims, got {self.matryoshka_weights!r}")
        return dims, weights


def _numbers(text: str, kind) -> list:
    """'384, 256,128' -> [384, 256, 128] (`kind` each); [] when an item is no such number."""
    try:
        return [kind(x) for x in str(text).replace(" ", "").split(",") if x]
    except ValueError:
        return []


@dataclass
class RerankConfig(TaskConfig):
    """A cross-encoder reranker: (query, passage) -> one relevance logit, binary cross-entropy (bertkit.tasks.cross_encoder)."""

    train: str = _opt(None, "a BEIR folder (its --train-split qrels give the positives; hard negatives are mined from its "
                            "corpus, random negatives drawn from it) or a table (TSV/CSV/JSONL) of query, passage, label "
                            "rows (label 1 relevant, 0 not, or a probability in between)", required=True, path=True)
    train_split: str = _opt("train", "qrels split of a BEIR --train folder")
    max_length: int = _opt(256, "tokens of query + passage, the longer cut first; when not given, fewer where the "
                                "model has fewer positions")
    hard_negatives: int = _opt(5, "per query: passages the mining model ranks high that are not its positives")
    random_negatives: int = _opt(2, "per query: passages drawn at random (seeded by --seed) from the rest of the corpus")
    range_max: int = _opt(50, "hard negatives are looked for among the mining model's best N candidates")
    relative_margin: float = _opt(0.05, "a hard negative scores at most (1 - this) x the query's lowest positive "
                                        "cosine (NV-Retriever's guard against unlabelled positives; 0: below it); "
                                        "not with --mining-index, whose ranks are no cosine",
                               needs=("mining_index", False))
    mining_model: str | None = _opt(None, "the bi-encoder that ranks the corpus for hard negatives (default: the "
                                          "packaged all-MiniLM-L6-v2)", needs=("mining_index", False), path=True)
    mining_index: str | None = _opt(None, "an index of the --train corpus (bertkit index): hard negatives are the "
                                          "documents it answers first (searched as bertkit search does, hybrid by "
                                          "default: the first stage a reranker re-orders), not --mining-model's cosine "
                                          "ranking of the whole corpus", path=True)
    pos_weight: float | None = _opt(None, "weight of a positive pair in the loss (default: negatives per positive in "
                                          "the training pairs, as sentence-transformers' hard-negative recipe)")
    dev: str | None = _opt(None, "a BEIR folder the trained model is evaluated on, reranking --index's answers: nDCG@10 "
                                 "before and after go into OUTPUT/retrieval.json", path=True)
    dev_split: str = _opt("dev", "qrels split of the --dev folder (never the split you report, if you tune on it)",
                          needs=("dev", None))
    index: str | None = _opt(None, "the first stage for --dev: an index of its corpus (bertkit index), searched as "
                                   "bertkit search does (its default mode)", path=True)
    rerank_top: int = _opt(50, "documents of each first-stage answer the model re-scores in the --dev evaluation",
                           needs=("dev", None))
    rerank_dtype: Literal["float32", "bfloat16", "auto"] = _opt(
        "float32", "precision the --dev evaluation reranks in (bfloat16: faster where the CPU has it natively; auto: "
        "bfloat16 there, else float32, as every --dtype auto; the first stage's queries stay float32)",
        needs=("dev", None))

    def validate(self) -> "RerankConfig":
        super().validate()
        if self.hard_negatives < 0 or self.random_negatives < 0 or self.hard_negatives + self.random_negatives < 1:
            raise BertkitError(f"--hard-negatives and --random-negatives must be >= 0 and give at least one negative, "
                               f"got {self.hard_negatives} and {self.random_negatives}")
        if self.range_max < max(1, self.hard_negatives):
            raise BertkitError(f"--range-max ({self.range_max}) must be at least --hard-negatives ({self.hard_negatives})")
        not_negative(self.relative_margin, "--relative-margin")  # as mine's (bertkit.retrieval.config)
        if self.pos_weight is not None:
            positive(self.pos_weight, "--pos-weight")
        if self.rerank_top < 1:
            raise BertkitError(f"--rerank-top must be at least 1, got {self.rerank_top}")
        if self.rerank_dtype not in ("float32", "bfloat16", "auto"):
            raise BertkitError(f"--rerank-dtype must be float32, bfloat16 or auto, got {self.rerank_dtype!r}")
        if self.dev and not self.index:
            raise BertkitError("--dev needs --index INDEX: an index of the dev corpus (bertkit index), the first stage "
                               "whose answers the model reranks")
        if self.index and not self.dev:
            raise BertkitError("--index is the first stage of the --dev evaluation: give --dev DIR too")
        for flag, index in (("--index", self.index), ("--mining-index", self.mining_index)):
            if index and not (Path(index) / "index.json").is_file():
                raise BertkitError(f"{flag} {index} is not an index folder (no index.json): build one of the corpus "
                                   "with bertkit index")
        return self
